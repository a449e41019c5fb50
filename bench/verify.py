"""Chain verification and sealing rates over a large event log, beside raw baselines computed
over the same rows in the same run.

    .venv/bin/python bench/verify.py [--events 1000000] [--tasks 1000] [--workers 2]

Set-up (not timed): ``--tasks`` tasks with ``--events`` valid events between them, hashed with
the product's own rule (``backplane.eventlog.chain``) by ``--workers`` processes and loaded with COPY in
position order, tasks interleaved round-robin the way concurrent appends interleave them. Each
task row carries its last seq, head hash and lamport, so the product agrees every chain is
valid. Payloads are agent-step shaped (about 200 bytes of canonical JSON: a step, a thought, a
tool call with arguments, a token count); every fourth event has an idempotency key, every
third a trace id. Then ``VACUUM ANALYZE``, as autovacuum would leave a table this size.

Phases:
1. Raw chain verification: the rows of each task (the columns the hash covers, decoded as
   psycopg decodes them) are first fetched into memory, untimed; timed is only, per event, the
   hashed fields (``hashed_fields``), canonical JSON and SHA-256 (``compute_hash``), and the
   seq, prev-hash and hash comparisons. That is the least any verifier must compute. It runs
   before and after phase 2 (the two say how much the shared machine drifted); ratios use the
   mean.
2. Product chain verification: the periodic runs of ``backplane.integrity.verification`` as the Celery tasks
   drive them (``verification_run_start`` / ``verification_run_batch`` / ``verification_run_finish``,
   batches of ``BACKPLANE_VERIFY_BATCH_SIZE`` tasks): first an incremental run (every event is
   new to it), then a full run. Database reads, decoding and bookkeeping included.
3. Raw sealing: a minimal sealer over the same events: read ``(position, hash)`` above a
   high-water mark in batches of ``--seal-batch``, leaf hash SHA-256(0x00 || hash bytes), append
   to a compact range, COPY the leaf rows into a copy of the leaf table (same indexes, same
   foreign key to the events), commit per batch. No signature (one per batch in the product,
   ~0.1 ms), no late-commit handling. Before and after phase 4, like phase 1.
4. Product sealing: ``seal_new_events`` called until it seals nothing, as the beat task does;
   its final root must equal the raw one. Then the median of three runs that each find
   ``--next-run-events`` new events on top of the sealed log, first in this process, then as a
   process that has not sealed yet (what a run costs in steady state).
5. ``seal_verify_against_head`` (recompute every sealed event's hash and rebuild the root),
   compared with the raw chain verification rate, which is nearly all of its work.

Ratios are product / raw, target (issue 6) >= 0.5 for verification and sealing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from _support import bench_database

TARGET = 0.5
BASE_TIME = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EVENT_TYPES = ("ReasoningStepCompleted", "ToolCallRequested", "ToolCallCompleted", "Noted")
EVENT_COLUMNS = (
    "position", "task_id", "seq", "type", "payload", "agent", "idempotency_key", "lamport", "causation_id",
    "correlation_id", "trace_id", "recorded_at", "prev_hash", "hash",
)
COPY_SQL = f"COPY backplane_event ({', '.join(EVENT_COLUMNS)}) FROM STDIN"
HASHED_COLUMNS = (
    "seq", "type", "payload", "agent", "idempotency_key", "lamport", "causation_id", "correlation_id",
    "trace_id", "recorded_at", "prev_hash", "hash",
)


# --- set-up: valid chains, generated in processes, loaded with COPY -------------------------------


def event_position(task_index: int, seq: int, tasks: int) -> int:
    """Round-robin: the seq-th event of every task, then the next seq of every task."""
    return (seq - 1) * tasks + task_index + 1


def event_columns(task_id: str, task_index: int, seq: int, tasks: int) -> dict[str, Any]:
    """Everything of an event but its links, as a pure function of where it is."""
    position = event_position(task_index, seq, tasks)
    return {
        "type": EVENT_TYPES[seq % len(EVENT_TYPES)],
        "payload": {
            "step": seq,
            "thought": f"compare offer {seq % 17} with the customer's constraints before replying",
            "tool": {"name": "crm.search", "args": {"query": f"account {task_index}", "limit": 10 + seq % 5}},
            "tokens": (seq * 37) % 4000,
        },
        "agent": f"agent-{task_index % 10}",
        "idempotency_key": f"step-{seq}" if seq % 4 == 0 else None,
        "lamport": seq,
        "causation_id": f"cause-{seq - 1}" if seq > 1 else None,
        "correlation_id": f"corr-{task_id[:8]}",
        "trace_id": f"{position:032x}" if seq % 3 == 0 else None,
        "recorded_at": BASE_TIME + timedelta(milliseconds=position),
    }


def copy_text(value: Any) -> str:
    """A value in COPY's text format."""
    if value is None:
        return "\\N"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def load_chains(job: tuple[str, list[str], int, int, int]) -> list[str]:
    """Generate, hash (the product's rule) and COPY the events of a slice of the tasks, in
    position order; return each task's head hash. Runs in a worker process, without Django."""
    import psycopg

    from backplane.eventlog.chain import GENESIS_HASH, compute_hash, hashed_fields

    url, keys, first_index, per_task, tasks = job
    heads = [GENESIS_HASH] * len(keys)
    with psycopg.connect(url) as conn, conn.cursor() as cursor, cursor.copy(COPY_SQL) as copy:
        for seq in range(1, per_task + 1):
            lines = []
            for offset, key in enumerate(keys):
                index = first_index + offset
                columns = event_columns(key, index, seq, tasks)
                prev_hash = heads[offset]
                event_hash = compute_hash(hashed_fields(task_id=key, seq=seq, prev_hash=prev_hash, **columns))
                row = (
                    event_position(index, seq, tasks), key, seq, columns["type"], json.dumps(columns["payload"]),
                    columns["agent"], columns["idempotency_key"], columns["lamport"], columns["causation_id"],
                    columns["correlation_id"], columns["trace_id"], columns["recorded_at"], prev_hash, event_hash,
                )
                lines.append("\t".join(map(copy_text, row)) + "\n")
                heads[offset] = event_hash
            copy.write("".join(lines))
    return heads


def populate(url: str, *, events: int, tasks: int, workers: int) -> list[uuid.UUID]:
    import psycopg
    from django.db import connection
    from django.utils import timezone

    from backplane.eventlog.chain import GENESIS_HASH
    from backplane.eventlog.models import Task, TaskStatus

    per_task = events // tasks
    task_ids = [uuid.uuid4() for _ in range(tasks)]
    now = timezone.now()
    # The projection columns are final but head_hash, which the workers compute: what the
    # generated logs replay to (no claim in them, so pending), or every run would report drift.
    Task.objects.bulk_create(
        [
            Task(
                id=task_id, namespace="bench", kind="bench", status=TaskStatus.PENDING, input={},
                last_seq=per_task, lamport=per_task, head_hash=GENESIS_HASH, created_at=now, updated_at=now,
                last_event_at=BASE_TIME + timedelta(milliseconds=event_position(index, per_task, tasks)),
            )
            for index, task_id in enumerate(task_ids)
        ],
        batch_size=1000,
    )
    connection.close()  # no inherited connection in the workers
    keys = [str(task_id) for task_id in task_ids]
    step = -(-tasks // workers)
    jobs = [(url, keys[lo:lo + step], lo, per_task, tasks) for lo in range(0, tasks, step)]
    # Each worker COPYs its slice of the tasks round by round, so the rows of both land in the
    # table interleaved roughly in position order, as concurrent appends would leave them.
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        heads = [head for slice_heads in pool.map(load_chains, jobs) for head in slice_heads]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE backplane_task t SET head_hash = h.head_hash"
            " FROM unnest(%s::uuid[], %s::text[]) AS h (id, head_hash) WHERE t.id = h.id",
            [task_ids, heads],
        )
        # Explicit positions bypass the identity sequence: move it past them for later appends.
        conn.execute("SELECT setval(pg_get_serial_sequence('backplane_event', 'position'), max(position))"
                     " FROM backplane_event")
        conn.execute("VACUUM ANALYZE backplane_event")
        conn.execute("VACUUM ANALYZE backplane_task")
    return task_ids


# --- chain verification --------------------------------------------------------------------------


def raw_chain_verification(url: str, task_ids: list[uuid.UUID]) -> tuple[int, float]:
    """(events, seconds of hashing and comparing); fetching into memory is not timed."""
    import psycopg

    from backplane.eventlog.chain import GENESIS_HASH, compute_hash, hashed_fields

    checked = 0
    seconds = 0.0
    sql = f"SELECT {', '.join(HASHED_COLUMNS)} FROM backplane_event WHERE task_id = %s ORDER BY seq"
    with psycopg.connect(url) as conn:
        for task_id in task_ids:
            rows = conn.execute(sql, [task_id]).fetchall()
            key = str(task_id)
            started = time.perf_counter()
            expected, prev = 1, GENESIS_HASH
            for seq, type_, payload, agent, idem, lamport, cause, corr, trace, recorded_at, link, stored in rows:
                fields = hashed_fields(
                    task_id=key, seq=seq, type=type_, payload=payload, agent=agent, idempotency_key=idem,
                    lamport=lamport, causation_id=cause, correlation_id=corr, trace_id=trace,
                    recorded_at=recorded_at, prev_hash=link,
                )
                if seq != expected or link != prev or compute_hash(fields) != stored:
                    raise SystemExit(f"raw verification: task {key} broken at seq {seq}")
                prev = stored
                expected += 1
            seconds += time.perf_counter() - started
            checked += len(rows)
    return checked, seconds


def product_chain_verification(mode: str) -> tuple[int, float]:
    """One periodic run, driven as backplane.tasks._verify_chains drives it."""
    from django.conf import settings

    from backplane.integrity import verification as integrity

    started = time.perf_counter()
    run = integrity.verification_run_start(mode=mode)
    after = None
    while (
        step := integrity.verification_run_batch(
            run=run, after_task_id=after, batch_size=settings.BACKPLANE_VERIFY_BATCH_SIZE
        )
    ).tasks_checked:
        after = step.last_task_id
    run = integrity.verification_run_finish(run_id=run.pk)
    seconds = time.perf_counter() - started
    if run.failures:
        raise SystemExit(f"{mode} verification found {run.failures} broken chain(s) in valid data")
    return run.events_checked, seconds


# --- sealing ---------------------------------------------------------------------------------------


def raw_sealing(url: str, batch: int) -> tuple[int, float, str]:
    """(leaves, seconds, root hex) of a minimal sealer writing into a copy of the leaf table."""
    import psycopg

    sha256 = hashlib.sha256
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw_leaf")
        conn.execute("CREATE TABLE bench_raw_leaf (LIKE backplane_merkleleaf INCLUDING ALL)")
    frontier: list[bytes] = []
    size = 0
    high = 0
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        while True:
            rows = conn.execute(
                "SELECT position, hash FROM backplane_event WHERE position > %s ORDER BY position LIMIT %s",
                [high, batch],
            ).fetchall()
            if not rows:
                conn.rollback()
                break
            lines = []
            for position, event_hash in rows:
                node = sha256(b"\x00" + bytes.fromhex(event_hash)).digest()
                n = size
                while n & 1:
                    node = sha256(b"\x01" + frontier.pop() + node).digest()
                    n >>= 1
                frontier.append(node)
                lines.append(f"{size}\t{position}\t{event_hash}\n")
                size += 1
            with conn.cursor() as cursor, cursor.copy(
                "COPY bench_raw_leaf (leaf_index, event_id, event_hash) FROM STDIN"
            ) as copy:
                copy.write("".join(lines))
            conn.commit()
            high = rows[-1][0]
    seconds = time.perf_counter() - started
    root = frontier[-1] if frontier else sha256(b"").digest()
    for node in reversed(frontier[:-1]):
        root = sha256(b"\x01" + node + root).digest()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_raw_leaf")
    return size, seconds, root.hex()


def product_sealing() -> tuple[int, float, int]:
    """(leaves, seconds, runs): seal_new_events until nothing is left, as the beat task loops."""
    from backplane.integrity import sealing

    total = runs = 0
    started = time.perf_counter()
    while (step := sealing.seal_new_events()).sealed:
        total += step.sealed
        runs += 1
    return total, time.perf_counter() - started, runs


def product_sealing_next_run(new_events: int, repeats: int = 3) -> tuple[float, float]:
    """Median milliseconds of one ``seal_new_events`` run that finds ``new_events`` new events
    on top of everything sealed: in this process (which has sealed before), and as a process
    that has not sealed yet runs it."""
    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft
    from backplane.integrity import sealing

    task = services.task_create(namespace="bench", kind="bench", input={}, agent="bench").task
    sealing.seal_new_events()

    def one_run(*, fresh_process: bool) -> float:
        drafts = [EventDraft(type="Noted", payload={"n": n}) for n in range(new_events)]
        services.event_append_batch(namespace="bench", task_id=task.pk, drafts=drafts, agent="bench")
        if fresh_process and hasattr(sealing, "_horizon"):
            sealing._horizon = None  # what a new worker process knows
        started = time.perf_counter()
        step = sealing.seal_new_events()
        took = (time.perf_counter() - started) * 1000
        if step.sealed != new_events:
            raise SystemExit(f"a run sealed {step.sealed} events, expected {new_events}")
        return took

    warm = statistics.median(one_run(fresh_process=False) for _ in range(repeats))
    fresh = statistics.median(one_run(fresh_process=True) for _ in range(repeats))
    return warm, fresh


def product_seal_verification() -> tuple[int, float]:
    from backplane.integrity import sealing

    started = time.perf_counter()
    result = sealing.seal_verify_against_head()
    seconds = time.perf_counter() - started
    if not result.valid:
        raise SystemExit(f"seal_verify_against_head: {result.problem}")
    return result.tree_size, seconds


# --- report ----------------------------------------------------------------------------------------


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def verdict(ratio: float) -> str:
    return "PASS" if ratio >= TARGET else "FAIL"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2, help="processes generating and loading the chains")
    parser.add_argument("--seal-batch", type=int, default=10_000, help="raw sealer batch (the product's default)")
    parser.add_argument("--next-run-events", type=int, default=100,
                        help="new events for the timed sealer runs on top of the sealed log")
    args = parser.parse_args()
    if args.events < args.tasks:
        parser.error("--events must be at least --tasks")

    rows: list[tuple[str, float, str, str]] = []

    def report(name: str, rate: float, detail: str, ratio: str = "") -> None:
        rows.append((name, rate, detail, ratio))
        print(f"  {name}: {rate:,.0f} events/s ({detail}) {ratio}", flush=True)

    with bench_database() as url:
        from backplane.integrity.models import VerificationMode

        print(f"load average at start: {load()}", flush=True)
        started = time.perf_counter()
        task_ids = populate(url, events=args.events, tasks=args.tasks, workers=args.workers)
        print(f"populated {args.events // args.tasks * args.tasks:,} events over {args.tasks:,} tasks"
              f" in {time.perf_counter() - started:.1f} s; load average {load()}", flush=True)

        # Raw before and after the product's runs: the two say how much the shared machine drifted.
        raw_events, before = raw_chain_verification(url, task_ids)
        report("raw chain verification, before", raw_events / before, f"{before:.1f} s")
        product = [(mode, *product_chain_verification(mode))
                   for mode in (VerificationMode.INCREMENTAL, VerificationMode.FULL)]
        _, after = raw_chain_verification(url, task_ids)
        report("raw chain verification, after", raw_events / after, f"{after:.1f} s")
        raw_rate = 2 * raw_events / (before + after)
        for mode, events, seconds in product:
            if events != raw_events:
                raise SystemExit(f"the {mode} run checked {events} events, expected {raw_events}")
            ratio = events / seconds / raw_rate
            report(f"integrity {mode} run", events / seconds, f"{seconds:.1f} s",
                   f"ratio {ratio:.2f} {verdict(ratio)}")

        raw_leaves, seal_before, raw_root = raw_sealing(url, args.seal_batch)
        report("raw sealing, before", raw_leaves / seal_before, f"{seal_before:.1f} s")
        leaves, seconds, runs = product_sealing()
        _, seal_after, _ = raw_sealing(url, args.seal_batch)
        report("raw sealing, after", raw_leaves / seal_after, f"{seal_after:.1f} s")
        from backplane.integrity.sealing import latest_head

        root = latest_head().root_hash
        if leaves != raw_leaves or root != raw_root:
            raise SystemExit(f"the product sealed {leaves} leaves, root {root}; raw {raw_leaves}, {raw_root}")
        ratio = leaves / seconds / (2 * raw_leaves / (seal_before + seal_after))
        report("seal_new_events until idle", leaves / seconds, f"{seconds:.1f} s, {runs} runs",
               f"ratio {ratio:.2f} {verdict(ratio)}")
        warm, fresh = product_sealing_next_run(args.next_run_events)
        report(f"next run, {args.next_run_events} new events", args.next_run_events / warm * 1000,
               f"{warm:.1f} ms a run; {fresh:.1f} ms in a new process")
        size, seconds = product_seal_verification()
        report("seal_verify_against_head", size / seconds, f"{seconds:.1f} s",
               f"ratio to raw chain verification {size / seconds / raw_rate:.2f}")
        end_load = load()

    print()
    print(f"verify bench: {raw_events:,} events over {args.tasks:,} tasks, same PostgreSQL server;"
          f" load average at the end {end_load}; ratios against the mean of the raw runs, target {TARGET}")
    for name, rate, detail, ratio in rows:
        print(f"  {name:<34} {rate:>9,.0f} events/s  {detail:<20} {ratio}")


if __name__ == "__main__":
    main()
