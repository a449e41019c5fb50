"""``backplane.runtime.supervisor`` with real processes and real signals (each test a second or two)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from backplane.runtime.supervisor import (
    Backoff,
    InstanceLock,
    ProcessRecord,
    ProgramSpec,
    State,
    Supervisor,
    describe_exit,
    is_alive,
)
from tests.backplane.runtime.product import ROOT
from tests.support.waiting import wait_until


def test_backoff_doubles_for_a_child_that_keeps_dying_young_and_resets_once_it_proved_itself() -> None:
    backoff = Backoff()
    assert [backoff.next_delay(ran_for=1, proven=False) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.next_delay(ran_for=3, proven=True) == 0.5
    assert backoff.next_delay(ran_for=3, proven=False) == 1
    assert backoff.next_delay(ran_for=61, proven=False) == 0.5


def test_it_describes_an_exit_by_code_or_signal() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-9) == "killed by SIGKILL"


def test_a_child_that_dies_is_restarted_and_the_restart_logged(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(env={"PATH": "/usr/bin:/bin"}, cwd=ROOT)
    program = supervisor.start(ProgramSpec("sleeper", ["sleep", "300"]))
    first = program.pid
    assert first is not None
    try:
        with caplog.at_level(logging.WARNING, logger="backplane.runtime.supervisor"):
            psutil.Process(first).kill()

            def restarted() -> bool:
                supervisor.tick()
                return program.pid != first and program.state is State.RUNNING

            wait_until(restarted, timeout=5, what="the sleeper was started again", interval=0.05)
        assert f"sleeper (pid {first}) killed by SIGKILL" in caplog.text
        assert "restarting it in 0.5 s (restart 1)" in caplog.text
    finally:
        supervisor.stop(["sleeper"])
    assert program.state is State.STOPPED


def test_a_stop_escalates_to_sigkill_of_the_whole_group() -> None:
    # The child ignores SIGTERM (as a wedged one would) and has a child of its own.
    supervisor = Supervisor(env={"PATH": "/usr/bin:/bin"}, cwd=ROOT)
    program = supervisor.start(ProgramSpec("stubborn", ["sh", "-c", "trap '' TERM; sleep 300 & sleep 300"],
                                           stop_grace=0.5))
    leader = psutil.Process(program.pid)
    grandchild = wait_until(lambda: leader.children(), timeout=5, what="the child forked")[0]
    started = time.monotonic()
    supervisor.stop(["stubborn"])
    assert time.monotonic() - started < 3
    assert not is_alive(leader)
    wait_until(lambda: not is_alive(grandchild), timeout=2, what="the grandchild went with the group")


def test_children_die_with_a_supervisor_killed_by_sigkill() -> None:
    script = textwrap.dedent("""
        import sys, time
        from pathlib import Path
        from backplane.runtime.supervisor import ProgramSpec, Supervisor
        supervisor = Supervisor(env={"PATH": "/usr/bin:/bin"}, cwd=Path("."))
        program = supervisor.start(ProgramSpec("sleeper", ["sleep", "300"]))
        print(program.pid, flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.ppid() == parent.pid
        parent.kill()
        parent.wait()
        wait_until(lambda: not is_alive(child), timeout=2, what="the child died with its parent (PR_SET_PDEATHSIG)",
                   interval=0.02)
    finally:
        parent.kill()


def test_the_lock_is_exclusive_and_no_child_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "run" / "launcher.lock"
    first, second = InstanceLock(path), InstanceLock(path)
    assert first.acquire()
    assert not second.acquire()
    # A child started while the lock is held, even one allowed to inherit descriptors...
    child = subprocess.Popen(["sleep", "300"], close_fds=False)
    try:
        first.release()
        # ...does not hold it once we let go: the descriptor is close-on-exec.
        assert second.acquire()
    finally:
        second.release()
        child.kill()
        child.wait()


def test_a_record_names_one_process_and_not_a_later_one_with_the_same_pid() -> None:
    child = subprocess.Popen(["sleep", "300"])
    try:
        record = ProcessRecord.of(child.pid)
        assert record is not None
        assert record.find() is not None
        reused = ProcessRecord(pid=child.pid, create_time=record.create_time - 5, cmdline=record.cmdline)
        assert reused.find() is None
        assert ProcessRecord.from_json(record.as_json()) == record
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert record.find() is None
