"""Stall-detector lag: lease expiry to ``TaskStalled``, for many leases expiring together, beside
a raw SQL baseline on the same rows' shape in the same database.

    .venv/bin/python bench/detector.py [--leases 1000] [--agents 1] [--detector celery|thread] [--concurrency 2]
                                       [--inprocess-repeats 3]

Phases:
1. Set-up: ``--leases`` tasks are created with ``task_create`` and claimed with ``lease_claim``
   round-robin by ``--agents`` agents without kind restrictions (long leases, so nothing
   expires yet). A sweep batch records its stalls in each holder's circuit breaker once, at
   the end of its transaction.
2. Detector, run as production runs it, started before the set-up. ``--detector celery``
   (default): a real Celery worker and a separate Celery beat as subprocesses (as
   docker-compose runs them) on the embedded filesystem broker, with the settings' own
   CELERY_BEAT_SCHEDULE: "detect-stalls" every ``schedule`` seconds, each run looping
   ``lease_expire_stalled()`` until it expires nothing (``recovery.tasks.detect_stalls``); the
   other periodic jobs (the outbox relay every second) share the worker, as in production.
   ``--detector thread``: a scheduler thread fires ``detect_stalls()`` every interval into a
   pool of ``--concurrency`` threads (runs overlap, as on a worker with that concurrency).
   After the set-up, one UPDATE sets every lease to expire at the same instant T, chosen as
   now + ``--lead`` + uniform(0, interval), so the detector's phase relative to T is random.
3. A poller (every ``--poll`` s) notes when each ``TaskStalled`` becomes visible.
4. Baseline ("raw"), once the detector has stopped: the same task rows are copied into a table
   of the same definition (``LIKE ... INCLUDING ALL``), made running with leases in the past,
   and one autocommitted ``UPDATE ... RETURNING`` frees them the way the detector's projection
   does (epoch + 1, attempts + 1, pending, lease released) — no events, no hashing, no per-row
   round trips. Repeated ``--raw-repeats`` times; the median is reported.
5. In process ("per-lease cost", less sensitive to the machine's load than the lag), once
   the detector has stopped: one UPDATE makes every task running again under a lease that
   ran out (same holders, epoch + 1, attempts 0; no TaskClaimed events, the sweep does not
   read them), then ``lease_expire_stalled()`` is looped in this process as ``detect_stalls``
   does, with nothing else running. ``--inprocess-repeats`` times; the median is reported.

Lag per task = the ``TaskStalled`` event's ``recorded_at`` − the payload's ``lease_expired_at``
(the figure the target is about). ``recorded_at`` is the ``now`` a sweep batch takes before it
locks and writes its (up to 100) tasks, so the lag until the event is committed and readable is
also shown ("visible": poll time − lease_expired_at, ±``--poll``). Detector throughput = leases /
(commit of the last ``TaskStalled`` − ``recorded_at`` of the first).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NamedTuple

from _support import ROOT, bench_database, percentile

LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[^\]]*\] (.*)$")
SUCCEEDED = re.compile(r"Task recovery\.tasks\.detect_stalls\[([0-9a-f-]+)\] succeeded in ([0-9.]+)s: (\d+)")
FAILED = re.compile(r"Task recovery\.tasks\.detect_stalls\[([0-9a-f-]+)\] raised unexpected: (\w+)\('([^\\']*)")
RECEIVED = re.compile(r"Task recovery\.tasks\.detect_stalls\[([0-9a-f-]+)\] received")


def detector_interval() -> float:
    from django.conf import settings

    return float(settings.CELERY_BEAT_SCHEDULE["detect-stalls"]["schedule"])


# --- set-up --------------------------------------------------------------------------------


def create_and_claim(leases: int, agents: int, threads: int) -> None:
    """``leases`` tasks, claimed round-robin by ``agents`` agents without kind restrictions."""
    from django.db import connection

    from backplane.eventlog import services
    from recovery.leases import lease_claim

    fleet = [services.agent_create(name=f"bench-agent-{i}", namespace="bench").agent for i in range(agents)]

    def create(n: int) -> None:
        services.task_create(namespace="bench", kind="bench", input={"n": n}, agent="bench")

    def claim(n: int) -> None:
        if lease_claim(agent=fleet[n % agents], kinds=None, lease_seconds=600) is None:
            raise SystemExit("lease_claim found no pending task")

    def run(step: Callable[[int], None]) -> float:
        def chunk(first: int) -> None:
            for n in range(first, leases, threads):
                step(n)
            connection.close()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(chunk, range(threads)))
        return time.perf_counter() - started

    created, claimed = run(create), run(claim)
    print(f"set-up: {leases} tasks created in {created:.1f} s, claimed by {agents} agent(s) in {claimed:.1f} s"
          f" ({threads} threads)", flush=True)


# --- baseline ------------------------------------------------------------------------------


def raw_baseline(url: str, repeats: int) -> tuple[float, int]:
    """Median seconds of one UPDATE ... RETURNING freeing a copy of every task's lease (autocommit)."""
    import psycopg

    from backplane.eventlog.models import Task, TaskStatus

    table = Task._meta.db_table
    timings = []
    rows = 0
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS raw_task")
        conn.execute(f"CREATE TABLE raw_task (LIKE {table} INCLUDING ALL)")
        for _ in range(repeats):
            conn.execute("TRUNCATE raw_task")
            conn.execute(f"INSERT INTO raw_task SELECT * FROM {table}")
            conn.execute(
                "UPDATE raw_task SET status = %s, lease_holder = 'bench-agent-0',"
                " lease_expires_at = now() - interval '1 second'",
                [TaskStatus.RUNNING],
            )
            conn.execute("VACUUM ANALYZE raw_task")
            started = time.perf_counter()
            rows = len(
                conn.execute(
                    "UPDATE raw_task SET status = %s, lease_holder = NULL, lease_expires_at = NULL,"
                    " lease_epoch = lease_epoch + 1, attempts = attempts + 1, updated_at = now()"
                    " WHERE status = %s AND lease_holder IS NOT NULL AND lease_expires_at < now()"
                    " RETURNING id, lease_epoch",
                    [TaskStatus.PENDING, TaskStatus.RUNNING],
                ).fetchall()
            )
            timings.append(time.perf_counter() - started)
        conn.execute("DROP TABLE raw_task")
    return statistics.median(timings), rows


def in_process_sweeps(url: str, agents: int) -> tuple[int, float, list[float]]:
    """Every task under a lease that ran out again, then swept in this process:
    (leases expired, seconds, seconds per batch)."""
    import psycopg

    from backplane.eventlog.models import Task, TaskStatus
    from recovery.detector import lease_expire_stalled

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {Task._meta.db_table} SET status = %s, attempts = 0, lease_epoch = lease_epoch + 1,"
            " lease_holder = 'bench-agent-' || (abs(hashtext(id::text)) %% %s),"
            " lease_expires_at = now() - interval '1 second'",
            [TaskStatus.RUNNING, agents],
        )
        conn.execute(f"VACUUM ANALYZE {Task._meta.db_table}")
    batches = []
    expired = 0
    started = time.perf_counter()
    while True:
        batch_started = time.perf_counter()
        sweep = lease_expire_stalled()
        if not sweep.expired:
            break
        batches.append(time.perf_counter() - batch_started)
        expired += sweep.expired
    return expired, time.perf_counter() - started, batches


# --- the detector, two ways ----------------------------------------------------------------


class Run(NamedTuple):
    started: float  # epoch seconds the worker received it (celery) or started it (thread)
    seconds: float
    expired: int | None  # None: the run raised
    error: str | None = None


class CeleryDetector:
    """A Celery worker and a Celery beat as subprocesses, with the bench's environment."""

    mode = "celery worker + celery beat subprocesses (filesystem broker)"

    def __init__(self, concurrency: int) -> None:
        var = Path(os.environ["BACKPLANE_VAR_DIR"])
        self.worker_log = var / "worker.log"
        self.beat_log = var / "beat.log"
        celery = str(Path(sys.executable).parent / "celery")
        common = {"cwd": ROOT, "env": dict(os.environ), "start_new_session": True,
                  "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        self.processes = [
            subprocess.Popen([celery, "-A", "backplane", "worker", "--loglevel", "INFO",
                              "--concurrency", str(concurrency), "--logfile", str(self.worker_log),
                              "--hostname", "bench-detector@%h"], **common),
            subprocess.Popen([celery, "-A", "backplane", "beat", "--loglevel", "INFO",
                              "--logfile", str(self.beat_log),
                              "--schedule", str(var / "celerybeat-schedule")], **common),
        ]

    def wait_ready(self, timeout: float) -> None:
        """Until the worker has finished at least one detect_stalls run that beat sent."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise SystemExit(f"celery exited early ({process.args[3]}); see {self.worker_log}, {self.beat_log}")
            if any(SUCCEEDED.search(line) for _, line in read_log(self.worker_log)):
                return
            time.sleep(0.1)
        raise SystemExit(f"celery did not run detect_stalls within {timeout:.0f} s; see {self.worker_log}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def sends(self) -> list[float]:
        return [t for t, line in read_log(self.beat_log) if "Sending due task detect-stalls" in line]

    def runs(self) -> list[Run]:
        """Every detect_stalls run the worker finished or that raised."""
        received: dict[str, float] = {}
        done = []
        for moment, line in read_log(self.worker_log):
            if match := RECEIVED.search(line):
                received[match.group(1)] = moment
            elif match := SUCCEEDED.search(line):
                done.append(Run(received.get(match.group(1), moment), float(match.group(2)), int(match.group(3))))
            elif match := FAILED.search(line):
                start = received.get(match.group(1), moment)
                done.append(Run(start, moment - start, None, f"{match.group(2)}: {match.group(3)}"))
        return done


class ThreadDetector:
    """A scheduler thread firing detect_stalls() every interval into a thread pool."""

    mode = "in-process scheduler thread + thread pool calling recovery.tasks.detect_stalls()"

    def __init__(self, concurrency: int, interval: float) -> None:
        self.interval = interval
        self.pool = ThreadPoolExecutor(max_workers=concurrency)
        self.stopping = threading.Event()
        self._sends: list[float] = []
        self._runs: list[Run] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.schedule, daemon=True)
        self.thread.start()

    def schedule(self) -> None:
        next_at = time.time() + random.uniform(0, self.interval)
        while not self.stopping.wait(max(0.0, next_at - time.time())):
            self._sends.append(time.time())
            self.pool.submit(self.run_once)
            next_at += self.interval

    def run_once(self) -> None:
        from django.db import connection

        from recovery.tasks import detect_stalls

        started = time.time()
        try:
            run = Run(started, 0.0, detect_stalls())
        except Exception as exc:  # noqa: BLE001 - what the Celery worker logs as "raised unexpected"
            run = Run(started, 0.0, None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
        connection.close()
        with self.lock:
            self._runs.append(run._replace(seconds=time.time() - started))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._runs and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.pool.shutdown(wait=True)

    def sends(self) -> list[float]:
        return list(self._sends)

    def runs(self) -> list[Run]:
        with self.lock:
            return list(self._runs)


def read_log(path: Path) -> list[tuple[float, str]]:
    """(epoch seconds, message) of every line of a Celery log; Celery writes local time."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        if match := LOG_LINE.match(raw):
            moment = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").astimezone().timestamp()
            lines.append((moment, match.group(2)))
    return lines


# --- measurement ---------------------------------------------------------------------------


def expire_all_at(url: str, moment: datetime) -> int:
    import psycopg

    from backplane.eventlog.models import Task, TaskStatus

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            f"UPDATE {Task._meta.db_table} SET lease_expires_at = %s WHERE status = %s AND lease_holder IS NOT NULL",
            [moment, TaskStatus.RUNNING],
        ).rowcount


def watch_stalls(url: str, leases: int, poll: float, timeout: float) -> dict[str, float]:
    """task_id -> epoch seconds at which its TaskStalled was first visible to another session."""
    import psycopg

    from backplane.eventlog import event_types as et
    from backplane.eventlog.models import Event

    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while len(seen) < leases and time.monotonic() < deadline:
            rows = conn.execute(
                f"SELECT task_id::text FROM {Event._meta.db_table} WHERE type = %s", [et.TASK_STALLED]
            ).fetchall()
            now = time.time()
            for (task_id,) in rows:
                seen.setdefault(task_id, now)
            time.sleep(poll)
    return seen


def stalled_events() -> list[tuple[str, datetime, datetime]]:
    """(task_id, recorded_at, lease_expired_at) of every TaskStalled."""
    from backplane.eventlog import event_types as et
    from backplane.eventlog.models import Event

    return [
        (str(task_id), recorded_at, datetime.fromisoformat(payload["lease_expired_at"].replace("Z", "+00:00")))
        for task_id, recorded_at, payload in Event.objects.filter(type=et.TASK_STALLED).values_list(
            "task_id", "recorded_at", "payload"
        )
    ]


def seconds(samples: list[float]) -> str:
    return (f"p50 {percentile(samples, 50):.2f} s, p99 {percentile(samples, 99):.2f} s, "
            f"max {max(samples):.2f} s, min {min(samples):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--agents", type=int, default=1, help="lease holders (claims are round-robin)")
    parser.add_argument("--setup-threads", type=int, default=2)
    parser.add_argument("--detector", choices=["celery", "thread"], default="celery")
    parser.add_argument("--concurrency", type=int, default=2, help="worker processes (celery) or threads")
    parser.add_argument("--lead", type=float, default=3.0, help="seconds from the UPDATE to the earliest T")
    parser.add_argument("--poll", type=float, default=0.05)
    parser.add_argument("--raw-repeats", type=int, default=5)
    parser.add_argument("--inprocess-repeats", type=int, default=3, help="0: skip the in-process phase")
    parser.add_argument("--timeout", type=float, default=45.0, help="seconds to wait for every TaskStalled")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    began = time.monotonic()

    with bench_database() as url:
        from django.db.models import Count

        from backplane.delivery.models import DeadLetter
        from backplane.eventlog.models import Task

        interval = detector_interval()
        load_before = os.getloadavg()[0]
        # The detector (and, with Celery, the relay and the other periodic jobs) runs from the
        # start, as in production; the relay drains the set-up's lifecycle messages meanwhile.
        if args.detector == "celery":
            detector: CeleryDetector | ThreadDetector = CeleryDetector(args.concurrency)
        else:
            detector = ThreadDetector(args.concurrency, interval)
        try:
            create_and_claim(args.leases, args.agents, args.setup_threads)
            detector.wait_ready(timeout=30)
            offset = rng.uniform(0, interval)
            expiry = datetime.now(UTC) + timedelta(seconds=args.lead + offset)
            updated = expire_all_at(url, expiry)
            seen = watch_stalls(url, args.leases, args.poll, timeout=args.lead + interval + args.timeout)
            load_after = os.getloadavg()[0]
        finally:
            detector.stop()

        events = stalled_events()
        statuses = dict(Task.objects.values_list("status").annotate(n=Count("id")).order_by())
        dead = DeadLetter.objects.count()
        sends = detector.sends()
        runs = detector.runs()
        raw_seconds, raw_rows = raw_baseline(url, args.raw_repeats)
        load_in_process = os.getloadavg()[0]
        in_process = [in_process_sweeps(url, args.agents) for _ in range(args.inprocess_repeats)]

    t = expiry.timestamp()
    lags = [(recorded - expired).total_seconds() for _, recorded, expired in events]
    visible = [seen[task_id] - expired.timestamp() for task_id, _, expired in events if task_id in seen]
    last_send_before = max((s for s in sends if s < t), default=float("nan"))
    first_run_after = min((run.started for run in runs if run.started >= t), default=float("nan"))
    first_recorded = min(recorded for _, recorded, _ in events).timestamp() if events else float("nan")
    last_visible = max(seen.values()) if seen else float("nan")
    span = last_visible - first_recorded
    working = [run for run in runs if run.expired != 0 and run.started >= t - 2 * interval]
    failed = [run for run in runs if run.error]

    print(f"detector bench: {args.leases} leases held by {args.agents} agent(s) expiring at one instant,"
          f" same PostgreSQL server; 1-min load average {load_before:.1f} before set-up, {load_after:.1f} after")
    print(f"  detector: {detector.mode}, concurrency {args.concurrency}, "
          f"interval {interval:.1f} s (CELERY_BEAT_SCHEDULE['detect-stalls'])")
    print(f"  leases set to expire: {updated}; TaskStalled events: {len(events)}; "
          f"distinct lease_expired_at: {len({e for _, _, e in events})}; "
          f"tasks now {statuses}; dead letters {dead}")
    print(f"  phase: last detect-stalls sent {t - last_send_before:.2f} s before expiry, first run started "
          f"{first_run_after - t:.2f} s after it (random offset {offset:.2f} s)")
    print(f"  detect_stalls runs: {len(runs)} in all, {len([r for r in runs if r.expired])} expired leases, "
          f"{len(failed)} raised, the rest found none")
    for run in working[:12]:
        outcome = f"expired {run.expired}" if run.error is None else f"RAISED {run.error}"
        print(f"    run started {run.started - t:+.2f} s after expiry, took {run.seconds:.2f} s, {outcome}")
    if len(working) > 12:
        print(f"    ... {len(working) - 12} more")
    if lags:
        print(f"  lag recorded_at - lease_expired_at: {seconds(lags)}")
        print(f"  lag until visible (±{args.poll:.2f} s):   {seconds(visible)}")
    raw_rate = raw_rows / raw_seconds
    det_rate = len(events) / span if span > 0 else float("nan")
    print(f"  raw UPDATE ... RETURNING of {raw_rows} leases: {raw_seconds * 1000:.1f} ms "
          f"(median of {args.raw_repeats}) = {raw_rate:,.0f} leases/s")
    print(f"  detector: first sweep start to last commit {span:.2f} s = {det_rate:,.0f} leases/s, "
          f"ratio to raw {det_rate / raw_rate:.4f}")
    if in_process:
        expired, took, batches = sorted(in_process, key=lambda sweep: sweep[1])[len(in_process) // 2]
        print(f"  in process (lease_expire_stalled() looped, nothing else running; 1-min load average"
              f" {load_in_process:.1f}): {expired} leases in {took:.2f} s = {took / expired * 1000:.2f} ms a lease"
              f" = {expired / took:,.0f} leases/s (median of {len(in_process)}: "
              f"{', '.join(f'{sweep[1]:.2f}' for sweep in in_process)} s); {len(batches)} batches,"
              f" p50 {percentile(batches, 50) * 1000:.0f} ms, max {max(batches) * 1000:.0f} ms")
    if lags:
        p99 = percentile(lags, 99)
        verdict = "met" if p99 <= 2 * interval and len(events) == args.leases and not failed else "NOT met"
        print(f"  target p99 lag <= 2 x interval = {2 * interval:.1f} s: p99 {p99:.2f} s — {verdict}"
              f" (visible p99 {percentile(visible, 99):.2f} s)")
    else:
        print("  target: NOT met — no TaskStalled event was recorded")
    print(f"  bench wall time {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
