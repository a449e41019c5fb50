"""What a killed ``make run`` leaves behind: the database guard adopts or restarts a server it
did not start, and ``make clean-db`` stops recorded leftovers and the database, nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from backplane.runtime import embedded_db
from backplane.runtime.supervisor import ProcessRecord, is_alive, write_json_atomically
from tests.backplane.runtime.product import ROOT, new_var_dir, run_launcher
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def var_dir() -> Iterator[Path]:
    path = new_var_dir("bp-leftovers-")
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        embedded_db.stop(path / "pgdata", mode="immediate")
        shutil.rmtree(path.parent, ignore_errors=True)


def leave_a_database_running(pgdata: Path) -> int:
    """Start the server the way a killed owner leaves it: daemonized, nobody's child."""
    subprocess.run([sys.executable, "-m", "backplane.runtime.embedded_db", "start", "--pgdata", str(pgdata)],
                   cwd=ROOT, check=True, capture_output=True, timeout=120)
    pid = embedded_db.postmaster_pid(pgdata)
    assert pid is not None
    return pid


def answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def test_the_guard_adopts_a_leftover_server_restarts_it_when_killed_and_stops_it_on_eof(var_dir: Path) -> None:
    pgdata, url_file = var_dir / "pgdata", var_dir / "database_url"
    leftover = leave_a_database_running(pgdata)
    guard = subprocess.Popen(
        [sys.executable, "-m", "backplane.runtime.embedded_db", "guard", "--pgdata", str(pgdata),
         "--url-file", str(url_file)],
        cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_until(url_file.exists, timeout=60, what="the guard wrote the URL")
        url = url_file.read_text().strip()
        assert embedded_db.postmaster_pid(pgdata) == leftover  # adopted, not started anew

        # Not the guard's descendant: where PID 1 reaps nothing, the killed postmaster stays a
        # zombie, which PostgreSQL's own lock-file check takes for a live server.
        os.kill(leftover, signal.SIGKILL)
        restarted = wait_until(lambda: embedded_db.postmaster_pid(pgdata) not in (None, leftover), timeout=30,
                               what="the guard started the server again")
        assert restarted
        wait_until(lambda: answers(url), timeout=30, what="the server answers on the same URL (the same socket)")
        server = [p for p in psutil.process_iter(["cwd"]) if p.info["cwd"] == str(pgdata.resolve())]

        assert guard.stdin is not None
        guard.stdin.close()  # the launcher is gone
        assert guard.wait(timeout=30) == 0
        assert not embedded_db.is_running(pgdata)
        wait_until(lambda: not any(is_alive(p) for p in server), timeout=5, what="no PostgreSQL process is left")
    finally:
        guard.kill()
        guard.wait()
    assert guard.stderr is not None
    log = guard.stderr.read()
    assert f"PostgreSQL postmaster (pid {leftover}) is gone; starting it again" in log, log


def test_clean_db_stops_recorded_leftovers_and_the_database_and_nothing_else(var_dir: Path) -> None:
    leave_a_database_running(var_dir / "pgdata")
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = ProcessRecord.of(ours.pid)
        stranger_record = ProcessRecord.of(stranger.pid)
        assert record is not None and stranger_record is not None
        # The stranger has a pid a killed launcher once recorded, but started later: reused.
        reused = ProcessRecord(pid=stranger.pid, create_time=stranger_record.create_time - 60, cmdline=("sleep",))
        (var_dir / "run").mkdir()
        write_json_atomically(var_dir / "run" / "launcher.json", {
            "launcher": {"pid": 999999, "create_time": 0, "cmdline": []},
            "children": {"worker": record.as_json(), "web": reused.as_json()},
        })

        done = run_launcher(var_dir, "--clean")
        assert done.returncode == 0, done.stderr
        assert ours.wait(timeout=5) == -signal.SIGTERM
        assert stranger.poll() is None
        assert not embedded_db.is_running(var_dir / "pgdata")
        assert not (var_dir / "run" / "launcher.json").exists()
        assert f"stopped worker (pid {ours.pid})" in done.stderr, done.stderr
    finally:
        for process in (ours, stranger):
            process.kill()
            process.wait()
