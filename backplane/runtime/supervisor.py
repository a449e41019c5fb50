"""A small process supervisor: the generic half of ``make run`` (``backplane.runtime.launcher``).

What it guarantees, and how:

1. **Children die with us, whatever kills us.** Each child leads its own session (so its own
   process group, which we signal as a whole) and is started with ``PR_SET_PDEATHSIG`` (Linux):
   the kernel sends it a signal when the thread that forked it dies, SIGKILL included. That is
   why every child is spawned from the main thread only. A child whose parent died between
   ``fork`` and ``prctl`` would never get the signal, so it checks its parent and exits.
2. **A child that dies comes back.** The death is logged at WARNING with its exit code or
   signal, and the child is started again after a backoff: 0.5 s doubling to 30 s for a child
   that keeps dying young, back to 0.5 s once it ran for a minute or proved healthy (a web
   process that answered, a worker that ran a duty): a crash loop is throttled, a process that
   was killed after doing its job is not.
3. **Stops escalate.** A stop or restart sends the child's stop signal to the leader (Celery
   and uvicorn shut down their own way), then SIGKILL to the whole group after a grace period;
   a wedged process ignores SIGTERM.
4. **One supervisor per directory.** ``InstanceLock`` is an exclusive, non-blocking ``flock``
   on a file whose descriptor is close-on-exec, so no child (nor a daemonized PostgreSQL) can
   inherit it and keep it after we die. ``ProcessRecord`` remembers each child by pid *and*
   start time, so a later run kills leftovers it can prove are its own and nothing else.

Nothing here knows about Django or the product; the launcher supplies the programs.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import psutil

logger = logging.getLogger("backplane.runtime.supervisor")

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, in the parent: the child between fork and exec should only call it.
_prctl = _load_prctl()


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of PID 1 (Linux), so it can
    reap them; where PID 1 reaps nothing (some containers), they would stay zombies otherwise."""
    return _prctl is not None and _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this thread dies (Linux only).

    Popen runs ``preexec_fn`` after any uid/gid change, which matters: changing credentials
    clears the parent-death signal. A parent that died between ``fork`` and ``prctl`` sends
    nothing, so the child checks and gives up before ``exec`` (not by signalling itself: until
    ``exec`` it still has the parent's Python signal handlers).
    """
    if _prctl is None:
        return None
    prctl = _prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: the signal will never come
            os._exit(1)

    return preexec


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads (every child leads one); gone already is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def is_alive(process: psutil.Process) -> bool:
    """Running and not a zombie: an orphan that died stays a zombie where PID 1 does not reap."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# --- who is ours: pid plus start time ---------------------------------------------------------


@dataclass(frozen=True)
class ProcessRecord:
    """A process as recorded when it started. A pid alone may be reused by anything later;
    pid plus start time names one process for good."""

    pid: int
    create_time: float
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ProcessRecord | None:
        try:
            process = psutil.Process(pid)
            return cls(pid=pid, create_time=process.create_time(), cmdline=tuple(process.cmdline()))
        except psutil.Error:
            return None

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(pid=int(data["pid"]), create_time=float(data["create_time"]),
                   cmdline=tuple(str(part) for part in data.get("cmdline", ())))

    def find(self) -> psutil.Process | None:
        """The live process this record names, or None (gone, a zombie, or the pid was reused)."""
        try:
            process = psutil.Process(self.pid)
            if abs(process.create_time() - self.create_time) > 0.01:
                return None
        except psutil.Error:
            return None
        return process if is_alive(process) else None


def stop_recorded(records: dict[str, ProcessRecord], *, grace: float) -> list[str]:
    """Stop the recorded processes that still run (SIGTERM to their groups, SIGKILL after
    ``grace``); return what was found running, as "name (pid N)"."""
    found = {name: process for name, record in records.items() if (process := record.find()) is not None}
    for process in found.values():
        signal_group(process.pid, signal.SIGTERM)
        _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(is_alive(p) for p in found.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in found.values():
        if is_alive(process):
            signal_group(process.pid, signal.SIGKILL)
            _signal(process, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(is_alive(p) for p in found.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [f"{name} (pid {process.pid})" for name, process in found.items()]


def _signal(process: psutil.Process, sig: int) -> None:
    try:
        process.send_signal(sig)
    except psutil.Error:
        pass


# --- one supervisor per directory ------------------------------------------------------------


class InstanceLock:
    """An exclusive, non-blocking ``flock``: held for as long as this process lives.

    The kernel drops it when the last descriptor closes, so a SIGKILLed holder frees it at
    once; the descriptor is close-on-exec and never passed to a child, so no child keeps it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --- backoff ---------------------------------------------------------------------------------


@dataclass
class Backoff:
    """Delay before restarting a child: ``initial`` doubling to ``maximum`` while it keeps dying
    young; back to ``initial`` once a run lasted ``reset_after`` seconds or proved healthy."""

    initial: float = 0.5
    maximum: float = 30.0
    reset_after: float = 60.0
    failures: int = 0

    def next_delay(self, *, ran_for: float, proven: bool) -> float:
        if proven or ran_for >= self.reset_after:
            self.failures = 0
        delay = min(self.initial * 2**self.failures, self.maximum)
        self.failures += 1
        return delay


# --- programs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    argv: list[str]
    # Sent by the kernel when we die. SIGKILL for processes that lose nothing by it; the
    # database guard gets SIGTERM, which it turns into a clean PostgreSQL shutdown.
    death_signal: int = signal.SIGKILL
    stop_signal: int = signal.SIGTERM
    # How long a stop waits for the child after its stop signal before SIGKILLing the group.
    stop_grace: float = 10.0
    # Give the child a pipe on stdin that only we hold: EOF tells it we are gone (a second
    # way to learn it besides the parent-death signal, and the only one off Linux).
    stdin_pipe: bool = False


class State(enum.Enum):
    RUNNING = "running"
    STOPPING = "stopping"
    WAITING = "waiting to restart"
    STOPPED = "stopped"


@dataclass
class Program:
    spec: ProgramSpec
    state: State = State.STOPPED
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0  # monotonic
    started_wall: datetime | None = None
    # Showed it works since its last start (the launcher decides what counts); resets the backoff.
    proven: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    restart_at: float = 0.0
    stop_grace: float = 0.0  # of the stop under way
    stop_deadline: float = 0.0
    restart_when_stopped: bool = False
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def uptime(self, now: float | None = None) -> float | None:
        if self.state is not State.RUNNING:
            return None
        return (now if now is not None else time.monotonic()) - self.started_at


class Supervisor:
    """Starts programs, restarts the ones that die, stops them in order. Call ``tick`` often
    (every 0.1 s) from the main thread; nothing here blocks except ``stop``."""

    def __init__(self, *, env: dict[str, str], cwd: Path,
                 on_spawn: Callable[[Program], None] | None = None,
                 before_backoff: Callable[[Program], None] | None = None) -> None:
        self.env = env
        self.cwd = cwd
        self.programs: dict[str, Program] = {}
        self.on_spawn = on_spawn
        # Called when a program died unexpectedly, before its backoff is chosen: the last
        # chance to notice that it had proven itself.
        self.before_backoff = before_backoff

    def start(self, spec: ProgramSpec) -> Program:
        program = self.programs.get(spec.name)
        if program is None:
            program = self.programs[spec.name] = Program(spec=spec)
        else:
            program.spec = spec
        self._spawn(program)
        return program

    def _spawn(self, program: Program) -> None:
        spec = program.spec
        program.process = subprocess.Popen(
            spec.argv, env=self.env, cwd=self.cwd,
            stdin=subprocess.PIPE if spec.stdin_pipe else subprocess.DEVNULL,
            start_new_session=True, preexec_fn=die_with_parent(spec.death_signal),
        )
        program.state = State.RUNNING
        program.started_at = time.monotonic()
        program.started_wall = datetime.now(UTC)
        program.proven = False
        program.restart_when_stopped = False
        logger.info("started %s (pid %d)", spec.name, program.process.pid)
        if self.on_spawn is not None:
            self.on_spawn(program)

    def running(self, name: str) -> Program | None:
        program = self.programs.get(name)
        return program if program is not None and program.state is State.RUNNING else None

    def tick(self) -> None:
        now = time.monotonic()
        for program in self.programs.values():
            if program.state in (State.RUNNING, State.STOPPING):
                assert program.process is not None
                returncode = program.process.poll()
                if returncode is not None:
                    self._exited(program, returncode, now)
                elif program.state is State.STOPPING and now >= program.stop_deadline:
                    logger.warning("%s (pid %d) did not stop within %g s; killing its process group",
                                   program.name, program.process.pid, program.stop_grace)
                    signal_group(program.process.pid, signal.SIGKILL)
                    program.stop_deadline = now + 5
            if program.state is State.WAITING and now >= program.restart_at:
                self._spawn(program)

    def _exited(self, program: Program, returncode: int, now: float) -> None:
        assert program.process is not None
        pid = program.process.pid
        # Whatever else is left in its group (none of ours forks, but a child's child would
        # otherwise outlive it) goes with it.
        signal_group(pid, signal.SIGKILL)
        _close(program.process.stdin)
        ran_for = now - program.started_at
        if program.state is State.STOPPING:
            if program.restart_when_stopped:
                program.state, program.restart_at = State.WAITING, now
            else:
                program.state = State.STOPPED
            return
        if self.before_backoff is not None:
            self.before_backoff(program)
        delay = program.backoff.next_delay(ran_for=ran_for, proven=program.proven)
        program.restarts += 1
        program.state, program.restart_at = State.WAITING, now + delay
        logger.warning("%s (pid %d) %s after %.1f s; restarting it in %.1f s (restart %d)",
                       program.name, pid, describe_exit(returncode), ran_for, delay, program.restarts)

    def restart(self, name: str, *, grace: float) -> None:
        """Stop ``name`` (its stop signal, SIGKILL to the group after ``grace``) and start it
        again as soon as it has exited, without backoff: a deliberate restart."""
        program = self.programs[name]
        if program.state is State.WAITING:
            program.restart_at = time.monotonic()
            return
        if program.state is not State.RUNNING:
            return
        assert program.process is not None
        program.state = State.STOPPING
        program.restart_when_stopped = True
        program.stop_grace = grace
        program.stop_deadline = time.monotonic() + grace
        _send(program.process, program.spec.stop_signal)

    def stop(self, names: Iterable[str]) -> None:
        """Stop these programs one after the other, each within its grace; blocks."""
        for name in names:
            program = self.programs.get(name)
            if program is None:
                continue
            if program.state is State.WAITING:
                program.state = State.STOPPED
            if program.state not in (State.RUNNING, State.STOPPING) or program.process is None:
                continue
            process = program.process
            program.state = State.STOPPING
            program.restart_when_stopped = False
            _send(process, program.spec.stop_signal)
            try:
                process.wait(timeout=program.spec.stop_grace)
            except subprocess.TimeoutExpired:
                logger.warning("%s (pid %d) did not stop within %g s; killing it",
                               name, process.pid, program.spec.stop_grace)
            signal_group(process.pid, signal.SIGKILL)
            process.wait()
            _close(process.stdin)
            program.state = State.STOPPED
            logger.info("stopped %s (%s)", name, describe_exit(process.returncode))

    def records(self) -> dict[str, ProcessRecord]:
        """Every child that runs now, by name, as recorded for a later run to find."""
        found = {}
        for name, program in self.programs.items():
            if program.state in (State.RUNNING, State.STOPPING) and program.pid is not None:
                record = ProcessRecord.of(program.pid)
                if record is not None:
                    found[name] = record
        return found


def _send(process: subprocess.Popen[bytes], sig: int) -> None:
    if process.poll() is None:
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            pass


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
