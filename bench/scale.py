"""The layout, measured: appends/s and p99 with 1, 2 and 4 web processes and 1, 2 Celery workers
against one PostgreSQL, the database's own ceiling in the same run, and where the knee is and why.

    .venv/bin/python bench/scale.py [--seconds 15] [--webs 1,2,4] [--workers 1,2] [--out var/bench/scale]
    make bench-scale

1. Starts the product as ``make run`` does (bench/http_bench.py's ``Bench`` and ``Product``: the
   launcher, a fresh var directory, its embedded PostgreSQL, the embedded filesystem broker, one
   Celery worker and beat), with ``BACKPLANE_OUTBOX_QUEUES`` binding a queue to every topic so
   that the relay's publishes are routed; an agent token and ``--tasks`` tasks.
2. The database's ceiling: pgbench's plain-SQL append (bench/baselines/pgbench_append.sql: head
   update, event insert, outbox insert, commit) on a scratch database of the same server, with the
   same client count as wrk, sampled like the runs below.
3. For each worker count (the launcher's worker, plus ``celery worker`` processes started here)
   and each web count: ``uvicorn --workers N`` on a port of its own (the launcher's flags), then
   wrk with bench/baselines/append.lua's single-event appends, each carrying one outbox message
   keyed by its task (``append_with_outbox_lua``), as pgbench's append writes an outbox row.
   N uvicorn workers share one listening socket and the kernel hands each connection to one of
   them: on one machine that is what N web containers behind a proxy come to (compose's web
   container itself runs ``uvicorn --workers 2``). The launcher's own web process stays up, idle.
   Then the control (unless ``--no-plain``): the smallest and largest web count with one worker
   under append.lua's plain appends, which write no outbox row and so fire no ``pg_notify``.
4. During each measured run, sampled: CPU of every process by role (psutil, each second), client
   backends of PostgreSQL by state and wait event (``pg_stat_activity``, every 100 ms: on CPU,
   ``Lock``, ``LWLock:WALWrite``, ``IO:WALSync``, other waits, idle in transaction), and WAL bytes
   (``pg_current_wal_lsn`` before and after). After it: the relay's delivered messages per second
   in the window, its lag (``delivered_at - created_at`` of the window's messages, once they are
   all delivered), the backlog left at the end and how long it took to drain.
5. Prints the table and the knee (the first web count after which one more step adds less than
   ``--knee-gain``) with the samples that say why; writes summary.md and summary.json to ``--out``.

A stand-in consumer (a thread here) deletes the bench queue's message files as the relay writes
them: the filesystem broker keeps every queue in one folder, which each Celery worker lists on
every poll, and a folder growing by hundreds of files a second would slow every later run.

Everything started here is stopped on every exit (``finally``); the product and its PostgreSQL are
stopped by ``Bench.run`` as in ``make bench``. Exit status: 1 if a measurement failed, 2 if the
product could not start, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from http_bench import (
    BASELINES,
    CHILD_GRACE_SECONDS,
    ROOT,
    Bench,
    fmt,
    free_port,
    say,
    seconds,
    wait_answering,
)

sys.path.insert(0, str(ROOT))

from backplane.runtime.launcher import APP_ROLE, with_user  # noqa: E402 - needs ROOT on sys.path
from backplane.runtime.supervisor import die_with_parent  # noqa: E402

TOPIC = "bench.scale"
QUEUE = "bench-scale"
DRAIN_SECONDS = 120.0
CPU_SAMPLE_SECONDS = 1.0
WAIT_SAMPLE_SECONDS = 0.1

# bench/baselines/append.lua's body, and the same body with one outbox message keyed by its task
# (per-key order, as the product keys its own messages), as pgbench's append writes an outbox row.
PLAIN_BODY_END = """',"note":"load"}}'"""
OUTBOX_BODY_END = """',"note":"load"},"outbox":[{"topic":"%s","key":"' .. id .. '","payload":{"i":' .. n .. '}}]}'"""


def append_with_outbox_lua() -> str:
    """bench/baselines/append.lua, each append carrying one outbox message to ``TOPIC``."""
    script = (BASELINES / "append.lua").read_text()
    if script.count(PLAIN_BODY_END) != 1:
        raise RuntimeError(f"bench/baselines/append.lua no longer ends its body with {PLAIN_BODY_END}")
    return script.replace(PLAIN_BODY_END, OUTBOX_BODY_END % TOPIC)

# --- what PostgreSQL's client backends were doing ------------------------------------------------

_ACTIVITY_SQL = """
SELECT state, wait_event_type, wait_event FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
WAIT_CLASSES = ("on CPU", "Lock", "LWLock:WALWrite", "IO:WALSync", "other wait", "idle in transaction")


def wait_class(state: str | None, wait_type: str | None, wait_event: str | None) -> str | None:
    """The column a sampled backend counts in; None for an idle one (no transaction open).

    ``active`` with no wait event is running (or runnable: PostgreSQL cannot tell a backend that
    waits for a CPU from one that has it). ``idle in transaction`` waits for its client, inside a
    transaction: the database waiting for the web process.
    """
    if state == "active":
        if wait_type is None:
            return "on CPU"
        if wait_type == "Lock":
            return "Lock"
        # PostgreSQL 17 renamed the IO events (WALSync became WalSync); LWLock names kept their case.
        name = f"{wait_type}:{wait_event}".lower()
        return next((column for column in WAIT_CLASSES if column.lower() == name), "other wait")
    if state in ("idle in transaction", "idle in transaction (aborted)"):
        return "idle in transaction"
    return None


# --- CPU by role ---------------------------------------------------------------------------------

ROLES = ("web", "worker", "beat", "postgres", "load generator", "bench (sampler, consumer)", "rest of the product",
         "outside the run")


@dataclass
class Roles:
    """Which processes count as what: by ancestry, since uvicorn's and Celery's children do not
    carry their parent's command line (they start as ``multiprocessing`` spawns or threads)."""

    me: int
    postmaster: int
    web_parent: int | None = None

    def role(self, pid: int, parents: dict[int, int], names: dict[int, str], cmdlines: dict[int, str]) -> str:
        if pid == self.me:
            return "bench (sampler, consumer)"
        if pid == self.postmaster or parents.get(pid) == self.postmaster:
            return "postgres"
        chain, at = [], pid
        while at and at not in chain and len(chain) < 32:
            chain.append(at)
            at = parents.get(at, 0)
        if self.me not in chain:
            return "outside the run"
        if self.web_parent is not None and self.web_parent in chain:
            return "web"
        if names.get(pid) in ("wrk", "pgbench"):
            return "load generator"
        for ancestor in chain:
            command = cmdlines.get(ancestor, "")
            if "celery" in command and " worker" in command:
                return "worker"
            if "celery" in command and " beat" in command:
                return "beat"
        return "rest of the product"


@dataclass
class Window:
    """What one measured run saw: cores used by role, backends by wait class, WAL written."""

    seconds: float = 0.0
    cores_by_role: dict[str, float] = field(default_factory=dict)
    machine_busy_cores: float = 0.0
    machine_steal_cores: float = 0.0
    backends: dict[str, float] = field(default_factory=dict)  # mean backends per sample, by class
    top_waits: dict[str, float] = field(default_factory=dict)  # mean per sample, by type:event
    wait_samples: int = 0
    wal_bytes_per_s: float = 0.0
    started_at: datetime | None = None
    ended_at: datetime | None = None


class Sampler:
    """Samples CPU by role and PostgreSQL's backends in two threads while a block runs."""

    def __init__(self, *, database_url: str, roles: Roles) -> None:
        self.database_url = database_url
        self.roles = roles
        self.window = Window()
        self._stop = threading.Event()
        self._cpu: dict[tuple[int, float], tuple[str, float, float]] = {}  # (pid, created): role, first, last
        self._waits: Counter[str] = Counter()
        self._events: Counter[str] = Counter()
        self._samples = 0
        self._errors: list[str] = []

    def _scan_cpu(self, started: float) -> None:
        import psutil

        infos = []
        for proc in psutil.process_iter(["pid", "ppid", "name", "create_time"]):
            infos.append((proc, proc.info))
        parents = {info["pid"]: info["ppid"] for _, info in infos}
        names = {info["pid"]: info["name"] or "" for _, info in infos}
        cmdlines: dict[int, str] = {}
        for proc, info in infos:
            key = (info["pid"], info["create_time"] or 0.0)
            known = self._cpu.get(key)
            if known is None:
                for pid in {info["pid"], parents.get(info["pid"], 0)}:
                    if pid and pid not in cmdlines:
                        with contextlib.suppress(psutil.Error):
                            cmdlines[pid] = " ".join(psutil.Process(pid).cmdline())
                role = self.roles.role(info["pid"], parents, names, cmdlines)
                if role == "outside the run":
                    self._cpu[key] = (role, 0.0, 0.0)
                    continue
            elif known[0] == "outside the run":
                continue
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            used = times.user + times.system
            if known is None:
                # A process that existed when the window opened counts from its first sample;
                # one born inside the window counts from zero.
                first = used if (info["create_time"] or 0.0) < started else 0.0
                self._cpu[key] = (role, first, used)
            else:
                self._cpu[key] = (known[0], known[1], used)

    def _cpu_loop(self, started: float) -> None:
        while not self._stop.wait(CPU_SAMPLE_SECONDS):
            self._scan_cpu(started)

    def _wait_loop(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.database_url, autocommit=True) as conn:
                while not self._stop.wait(WAIT_SAMPLE_SECONDS):
                    rows = conn.execute(_ACTIVITY_SQL).fetchall()
                    self._samples += 1
                    for state, wait_type, wait_event in rows:
                        column = wait_class(state, wait_type, wait_event)
                        if column is not None:
                            self._waits[column] += 1
                        if state == "active" and wait_type is not None:
                            self._events[f"{wait_type}:{wait_event}"] += 1
        except psycopg.Error as exc:
            self._errors.append(f"pg_stat_activity sampling stopped: {exc}")

    def _database_now(self) -> tuple[datetime, int]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            row = conn.execute("SELECT clock_timestamp(), pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return row[0], int(row[1])

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Window]:
        import psutil

        window = self.window
        window.started_at, wal_before = self._database_now()
        machine_before = psutil.cpu_times()
        started = time.time()
        self._scan_cpu(started)
        threads = [threading.Thread(target=self._cpu_loop, args=(started,), daemon=True),
                   threading.Thread(target=self._wait_loop, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            yield window
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=10)
            self._scan_cpu(started)
            elapsed = time.time() - started
            machine_after = psutil.cpu_times()
            window.ended_at, wal_after = self._database_now()
            window.seconds = round(elapsed, 2)
            # Busy: user, nice, system, irq and softirq time (guest time is inside user already;
            # steal is time the hypervisor gave to someone else, reported apart).
            busy = sum(getattr(machine_after, name) - getattr(machine_before, name)
                       for name in ("user", "nice", "system", "irq", "softirq"))
            window.machine_busy_cores = round(busy / elapsed, 3)
            window.machine_steal_cores = round((machine_after.steal - machine_before.steal) / elapsed, 3)
            used: Counter[str] = Counter()
            for role, first, last in self._cpu.values():
                used[role] += max(0.0, last - first)
            window.cores_by_role = {role: round(used[role] / elapsed, 3) for role in ROLES if role in used}
            samples = max(1, self._samples)
            window.wait_samples = self._samples
            window.backends = {column: round(self._waits[column] / samples, 3) for column in WAIT_CLASSES}
            window.top_waits = {name: round(count / samples, 3) for name, count in self._events.most_common(8)}
            window.wal_bytes_per_s = round((wal_after - wal_before) / elapsed, 1)
            if self._errors:
                say("   " + "; ".join(self._errors))


# --- the relay's side ----------------------------------------------------------------------------

_RELAY_SQL = """
SELECT
  count(*) FILTER (WHERE created_at >= %(t0)s AND created_at < %(t1)s),
  count(*) FILTER (WHERE delivered_at >= %(t0)s AND delivered_at < %(t1)s),
  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))
      FILTER (WHERE created_at >= %(t0)s AND created_at < %(t1)s AND delivered_at IS NOT NULL),
  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))
      FILTER (WHERE created_at >= %(t0)s AND created_at < %(t1)s AND delivered_at IS NOT NULL),
  count(*) FILTER (WHERE created_at >= %(t0)s AND created_at < %(t1)s AND status <> 'delivered')
FROM backplane_outboxmessage WHERE topic = %(topic)s
"""
_PENDING_SQL = "SELECT count(*) FROM backplane_outboxmessage WHERE topic = %s AND status = 'pending'"


class QueueDrain:
    """The bench queue's stand-in consumer: deletes its message files from the filesystem broker's
    folder as they land and counts them (the relay renames each into place whole)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        suffix = f"{QUEUE}.msg"
        while not self._stop.wait(0.2):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(self.folder):
                    if name.partition(".")[2] == suffix:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(self.folder / name)
                            self.count += 1

    def __enter__(self) -> QueueDrain:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# --- processes started here ----------------------------------------------------------------------


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its session (uvicorn's or Celery's children too), SIGKILL after the grace."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=CHILD_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def spawn(argv: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A child in a session of its own (stopped as a group) that gets SIGKILL if we die."""
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))


def wait_for_lines(log: Path, pattern: str, count: int, process: subprocess.Popen[bytes], what: str,
                   timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(re.findall(pattern, log.read_text(errors="replace"))) < count:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}): {log.read_text(errors='replace')[-1500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: fewer than {count} lines matching {pattern!r} within {timeout:.0f} s")
        time.sleep(0.25)


# --- the run -------------------------------------------------------------------------------------


class ScaleBench(Bench):
    """``Bench``'s product, fixtures, wrk and pgbench; its own measurements and report."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        # Every topic reaches a queue: an unroutable publish is retried, not delivered, and the
        # tasks' own lifecycle messages share their key (the task id) with the bench's messages,
        # which per-key order would hold behind them.
        self.product.env["BACKPLANE_OUTBOX_QUEUES"] = f"{QUEUE}=#"
        self.script = self.raw / "scale-append.lua"
        self.script.write_text(append_with_outbox_lua())
        self.runs: list[dict[str, Any]] = []

    # -- the product's processes, as the launcher starts them --

    def app_env(self) -> dict[str, str]:
        """What the launcher gives its children: the application's role, the shared metrics folder."""
        env = self.product.manage_env()
        env["DATABASE_URL"] = with_user(self.product.database_url(), env.get("BACKPLANE_DB_APP_ROLE", APP_ROLE))
        env["BACKPLANE_METRICS_DIR"] = str(self.product.var_dir / "metrics")
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    @contextlib.contextmanager
    def web(self, processes: int) -> Iterator[tuple[str, int]]:
        """``uvicorn --workers N`` with the launcher's flags on a port of its own; yields (URL, pid)."""
        port = free_port()
        log = self.raw / f"scale-web-{processes}.log"
        process = spawn([sys.executable, "-m", "uvicorn", "backplane.asgi:application", "--host", "127.0.0.1",
                         "--port", str(port), "--workers", str(processes), "--no-access-log", "--lifespan", "off",
                         "--timeout-graceful-shutdown", "5"], env=self.app_env(), log=log)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_answering(f"{url}/healthz", process, log, f"uvicorn --workers {processes}")
            # Each worker logs this once it has imported the application, before it serves.
            wait_for_lines(log, r"Started server process", processes, process, f"uvicorn --workers {processes}")
            yield url, process.pid
        finally:
            stop_process(process)

    @contextlib.contextmanager
    def extra_workers(self, count: int) -> Iterator[None]:
        """``count`` Celery workers beside the launcher's, started as it starts its own."""
        processes: list[subprocess.Popen[bytes]] = []
        try:
            for n in range(count):
                log = self.raw / f"scale-worker-{n + 2}.log"
                process = spawn([sys.executable, "-m", "celery", "-A", "backplane", "worker", "--loglevel", "INFO",
                                 "--hostname", f"scale{n + 2}@{os.uname().nodename}"], env=self.app_env(), log=log)
                processes.append(process)
                wait_for_lines(log, r"\bready\.", 1, process, f"Celery worker {n + 2}")
            yield
        finally:
            for process in processes:
                stop_process(process)

    # -- measurements --

    def roles(self) -> Roles:
        return Roles(me=os.getpid(), postmaster=int((self.product.pgdata / "postmaster.pid").read_text().split()[0]))

    def pending(self) -> int:
        import psycopg

        with psycopg.connect(self.product.database_url(), autocommit=True) as conn:
            row = conn.execute(_PENDING_SQL, [TOPIC]).fetchone()
        return int(row[0]) if row else 0

    def drain(self) -> float:
        """Seconds until the bench's outbox messages are all delivered (at most DRAIN_SECONDS)."""
        started = time.monotonic()
        while self.pending():
            if time.monotonic() - started > DRAIN_SECONDS:
                raise RuntimeError(f"{self.pending()} outbox messages still pending after {DRAIN_SECONDS:.0f} s")
            time.sleep(0.5)
        return round(time.monotonic() - started, 1)

    def relay_figures(self, window: Window) -> dict[str, Any]:
        import psycopg

        with psycopg.connect(self.product.database_url(), autocommit=True) as conn:
            row = conn.execute(_RELAY_SQL, {"t0": window.started_at, "t1": window.ended_at, "topic": TOPIC}).fetchone()
        assert row is not None
        created, delivered, p50, p99, undelivered = row
        return {"created": int(created), "delivered_in_window": int(delivered),
                "delivered_per_s": round(int(delivered) / window.seconds, 1),
                "lag_p50_ms": round(float(p50) * 1000, 1) if p50 is not None else None,
                "lag_p99_ms": round(float(p99) * 1000, 1) if p99 is not None else None,
                "undelivered_after_drain": int(undelivered)}

    def pgbench_sampled(self) -> dict[str, Any]:
        sampler = Sampler(database_url=self.product.database_url(), roles=self.roles())
        with sampler.sampling() as window:
            figures = self.pgbench()
        return {**figures, "window": asdict(window)}

    def measure_layout(self, webs: int, workers: int, *, outbox: bool = True) -> dict[str, Any]:
        """One layout under appends with an outbox message each, or (``outbox=False``) under
        bench/baselines/append.lua's plain appends, the control that writes no outbox row."""
        args = self.args
        # An absolute path: Bench.wrk joins the script to bench/baselines/, which keeps it as is.
        script = str(self.script) if outbox else "append.lua"
        name = f"{webs}w{workers}" + ("" if outbox else "-plain")
        with self.web(webs) as (url, pid):
            if args.warmup > 0:
                self.wrk(script, args.warmup, f"scale-wrk-{name}-warmup.txt", url)
            self.drain()
            roles = self.roles()
            roles.web_parent = pid
            sampler = Sampler(database_url=self.product.database_url(), roles=roles)
            with sampler.sampling() as window:
                wrk = self.wrk(script, args.duration, f"scale-wrk-{name}.txt", url)
            backlog = self.pending()
            drained = self.drain()
        relay = self.relay_figures(window)
        relay.update(backlog_at_end=backlog, drain_s=drained)
        return {"webs": webs, "workers": workers, "outbox": outbox, "wrk": wrk, "relay": relay,
                "window": asdict(window)}

    def measure(self) -> None:
        args = self.args
        self.phase("pgbench", self.pgbench_sampled)
        with QueueDrain(self.product.var_dir / "broker" / "queue") as consumer:
            for workers in args.workers:
                with self.extra_workers(workers - 1):
                    for webs in args.webs:
                        name = f"layout_{webs}web_{workers}worker"
                        self.phase(name, lambda webs=webs, workers=workers: self.measure_layout(webs, workers))
                        if name in self.results:
                            self.runs.append(self.results[name])
            # The control: the smallest and the largest web count with one worker, appends that
            # write no outbox row (so no NOTIFY from its trigger, migration 0005).
            for webs in sorted({min(args.webs), max(args.webs)}) if args.plain else []:
                name = f"plain_{webs}web_{min(args.workers)}worker"
                self.phase(name, lambda webs=webs: self.measure_layout(webs, min(args.workers), outbox=False))
                if name in self.results:
                    self.runs.append(self.results[name])
            self.results["consumer_removed"] = consumer.count

    # -- the report --

    def report(self, started_at: datetime, load_before: list[float]) -> int:
        args = self.args
        pgbench = self.results.get("pgbench")
        ceiling = float(pgbench["tps"]) if pgbench else None
        knees = {workers: knee([run for run in self.runs if run["workers"] == workers and run["outbox"]],
                               args.knee_gain)
                 for workers in args.workers}
        text = report_markdown(self.runs, pgbench, knees, header=[
            f"# The layout, measured ({started_at:%Y-%m-%d %H:%M} UTC)",
            "",
            f"`bench/scale.py --seconds {args.duration:g} --tasks {args.tasks}` on {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}: wrk -t{args.threads} -c{args.connections} "
            f"-d{seconds(args.duration)}s, single-event appends each carrying one outbox message; "
            f"pgbench -c {args.connections} -j {args.threads} -T {seconds(args.duration)} with the plain-SQL append "
            f"on the same server. Load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}.",
        ])
        say("")
        say(text)
        (self.out / "summary.md").write_text(text)
        (self.out / "summary.json").write_text(json.dumps({
            "started_at": started_at.isoformat(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "load_average_before": load_before, "load_average_after_phase": self.loads,
            "pgbench_ceiling_tps": ceiling, "knees": {str(k): v for k, v in knees.items()},
            "results": self.results,
        }, indent=2, default=str) + "\n")
        say(f"written: {self.out / 'summary.md'}, {self.out / 'summary.json'} (raw outputs in {self.raw})")
        failed = [name.removesuffix("_error") for name in self.results if name.endswith("_error")]
        if failed:
            say(f"measurements that failed: {', '.join(failed)}")
            return 1
        return 0


# --- reading the figures -------------------------------------------------------------------------


def knee(runs: list[dict[str, Any]], gain: float) -> dict[str, Any] | None:
    """The first web count after which the next step adds less than ``gain`` (a fraction) of
    appends/s, and why, from that run's samples. None with fewer than two runs."""
    runs = sorted(runs, key=lambda run: run["webs"])
    if len(runs) < 2:
        return None
    at = runs[-1]
    for run, following in zip(runs, runs[1:], strict=False):
        if following["wrk"]["rps"] < run["wrk"]["rps"] * (1 + gain):
            at = run
            break
    return {"webs": at["webs"], "appends_per_s": at["wrk"]["rps"], "why": why(at)}


def outside(window: dict[str, Any]) -> float:
    """Cores busy with anything but this run's processes: the machine's busy time minus theirs."""
    ours = sum(cores for role, cores in window["cores_by_role"].items() if role != "outside the run")
    return max(0.0, window["machine_busy_cores"] - ours)


# What a sampled lock wait means, for the events a run of appends meets.
LOCK_MEANINGS = {
    "Lock:object": "PostgreSQL's NOTIFY lock, held from a notifying transaction's pre-commit to its end, "
                   "its WAL flush included, so notifying commits go one at a time",
    "Lock:transactionid": "a row another transaction has locked (a task's row)",
    "Lock:tuple": "a row another transaction has locked (a task's row)",
}


def why(run: dict[str, Any]) -> str:
    """One sentence from a run's samples: how busy the machine was and with what, and what the
    database's backends were doing."""
    window = run["window"]
    cpus = os.cpu_count() or 1
    busy = window["machine_busy_cores"] / cpus
    roles = sorted(window["cores_by_role"].items(), key=lambda item: -item[1])
    spent = ", ".join(f"{role} {cores:.2f}" for role, cores in [*roles, ("outside the run", outside(window))]
                      if cores >= 0.05)
    backends = window["backends"]
    named = {column.lower() for column in WAIT_CLASSES}
    others = [name for name in window["top_waits"] if name.lower() not in named and not name.startswith("Lock:")]
    locks = [name for name in window["top_waits"] if name.startswith("Lock:")]
    causes = []
    if busy >= 0.9:
        causes.append(f"the CPU is saturated ({busy:.0%} of {cpus} cores busy)")
    if backends["Lock"] >= 1 and locks:
        meaning = LOCK_MEANINGS.get(locks[0], "")
        causes.append(f"commits queue on {locks[0]}" + (f" ({meaning})" if meaning else ""))
    if backends["LWLock:WALWrite"] + backends["IO:WALSync"] >= 1:
        causes.append("backends wait for WAL flushes")
    lock_detail = ", ".join(f"{name} {window['top_waits'][name]:.2f}" for name in locks) or "none"
    causes_text = "; ".join(causes) or "no CPU, lock or WAL limit in the samples"
    return causes_text[0].upper() + causes_text[1:] + (
        f". Cores: {spent}. PostgreSQL's client backends on average: {backends['on CPU']:.2f} on CPU, "
        f"{backends['Lock']:.2f} on Lock ({lock_detail}), "
        f"{backends['LWLock:WALWrite']:.2f} on LWLock:WALWrite, {backends['IO:WALSync']:.2f} on IO:WALSync, "
        f"{backends['other wait']:.2f} on other waits (most: {others[0] if others else 'none'}), "
        f"{backends['idle in transaction']:.2f} idle in transaction; WAL {window['wal_bytes_per_s'] / 1e6:.2f} MB/s")


def report_markdown(runs: list[dict[str, Any]], pgbench: dict[str, Any] | None,
                    knees: dict[int, dict[str, Any] | None], *, header: list[str]) -> str:
    ceiling = float(pgbench["tps"]) if pgbench else None
    lines = [*header, ""]
    if pgbench:
        window = pgbench["window"]
        lines.append(f"Ceiling: pgbench's append, {fmt(ceiling)} tx/s, latency average "
                     f"{fmt(pgbench['latency_avg_ms'], 1)} ms; the machine {window['machine_busy_cores']:.2f} cores "
                     f"busy, PostgreSQL {window['cores_by_role'].get('postgres', 0):.2f}, WAL "
                     f"{window['wal_bytes_per_s'] / 1e6:.2f} MB/s.")
        lines.append("")
    lines += ["| web processes | workers | outbox | appends/s | p99 ms | × pgbench | errors | relay msgs/s "
              "| relay lag p50 / p99 ms | backlog at end | cores busy: web / worker / postgres / wrk / outside "
              "| PG backends: CPU / Lock / WALWrite / WALSync / idle in tx | WAL MB/s |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---|---|---:|"]
    for run in runs:
        wrk, relay, window = run["wrk"], run["relay"], run["window"]
        cores, backends = window["cores_by_role"], window["backends"]
        errors = int(max(wrk.get("non201", 0), wrk.get("non_2xx", 0)) + wrk.get("socket_errors", 0))
        ratio = f"{wrk['rps'] / ceiling:.2f}" if ceiling else "—"
        lag = f"{fmt(relay['lag_p50_ms'] or float('nan'))} / {fmt(relay['lag_p99_ms'] or float('nan'))}"
        lines.append(
            f"| {run['webs']} | {run['workers']} | {'yes' if run['outbox'] else 'no'} "
            f"| {fmt(wrk['rps'])} | {fmt(wrk['p99_ms'], 1)} | {ratio} | {errors} "
            f"| {fmt(relay['delivered_per_s'])} | {lag} | {relay['backlog_at_end']} "
            f"| {window['machine_busy_cores']:.2f}: {cores.get('web', 0):.2f} / {cores.get('worker', 0):.2f} / "
            f"{cores.get('postgres', 0):.2f} / {cores.get('load generator', 0):.2f} / "
            f"{outside(window):.2f} "
            f"| {backends['on CPU']:.2f} / {backends['Lock']:.2f} / {backends['LWLock:WALWrite']:.2f} / "
            f"{backends['IO:WALSync']:.2f} / {backends['idle in transaction']:.2f} "
            f"| {window['wal_bytes_per_s'] / 1e6:.2f} |")
    lines.append("")
    for workers, found in knees.items():
        if found:
            lines.append(f"- Knee with {workers} worker(s): {found['webs']} web process(es), "
                         f"{fmt(found['appends_per_s'])} appends/s. {found['why']}.")
    return "\n".join(lines) + "\n"


def counts(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated counts of at least 1")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", "--duration", dest="duration", type=float, default=15.0,
                        help="seconds of each measured wrk run and of pgbench (default 15)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of appends before each measured run")
    parser.add_argument("--webs", type=counts, default=[1, 2, 4], help="web process counts (default 1,2,4)")
    parser.add_argument("--workers", type=counts, default=[1, 2], help="Celery worker counts (default 1,2)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections and pgbench clients")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads and pgbench jobs")
    parser.add_argument("--wrk-timeout", type=float, default=30.0, help="wrk's per-request timeout")
    parser.add_argument("--tasks", type=int, default=300, help="tasks the appends go to (round robin)")
    parser.add_argument("--no-plain", dest="plain", action="store_false",
                        help="skip the control runs whose appends write no outbox row")
    parser.add_argument("--knee-gain", type=float, default=0.10,
                        help="a step of web processes that adds less than this fraction is past the knee")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "scale"), help="where summary.md/.json go")
    parser.add_argument("--keep", action="store_true", help="keep the product's var directory (its database)")
    args = parser.parse_args()
    missing = [tool for tool in ("wrk", "pgbench", "psql") if shutil.which(tool) is None]
    if missing:
        parser.error(f"{', '.join(missing)} not found: `make wrk` installs wrk; pgbench and psql come with "
                     "PostgreSQL's client tools")
    return ScaleBench(args).run()


if __name__ == "__main__":
    sys.exit(main())
