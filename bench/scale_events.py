"""The event log at a hundred million events: appends, claims and the read paths, partitioned
against unpartitioned, each figure beside its plain-SQL floor, in one run.

    .venv/bin/python bench/scale_events.py [--events 100000000] [--tasks 1000000]
        [--layouts unpartitioned,partitioned] [--budget-minutes 240] [--out var/bench/scale-events]
    make bench-scale-events

One embedded PostgreSQL for the whole run, configured as docs/production.md sizes a database
server for this machine (``SERVER_SETTINGS``). Each case runs in a process of its own on a
database of its own, dropped when the case ends (a hundred million events and their indexes
take about 60 GiB, most of these machines' free disk, so the two layouts never exist at once):

- each layout at ``--base-events`` events over ``--base-tasks`` tasks (10⁵ over 10³): the
  figures appends and claims are held to;
- each layout at ``--events`` events over ``--tasks`` tasks.

Per case:
1. Migrations. ``partitioned`` is the schema as migrated (migration 0032: 16 hash partitions of
   ``task_id``); ``unpartitioned`` stops at 0031 and records 0032 as applied without running it,
   which is the table every release before 0032 had, under today's code.
2. Load, generated in SQL (``_FILLER_*``), a chunk of ``CHUNK_TASKS`` tasks per transaction on
   two connections: the tasks' rows, then their events in the order concurrent agents leave
   them (the chunk's tasks interleaved step by step, chunks in time order over ``DAYS`` days),
   about ``events / tasks`` events a task (half to one and a half times that). Product-shaped
   payloads: a start with a customer id, a claim, steps of a thought, a tool call and its answer,
   an end as the task's status says (completed, failed, stalled: 20 % are pending again, one in
   200 runs; one in ten of a smaller set). Hashes are 64 hex linked by ``prev_hash`` but not the events' digests: these
   chains do not verify. The table's indexes and keys are dropped for the load and made again
   after it (timed; the foreign key ``NOT VALID``, then validated), then ``VACUUM ANALYZE``.
   Loading stops starting chunks when its share of ``--budget-minutes`` is spent; the figures
   name the size reached.
3. Probe tasks whose chains do verify, ``PROBE_SIZES`` events each (those at most a tenth of the
   case's events), written by Python through the product's own hashing (``chain.compute_hash``)
   and COPY, cached between cases in ``--out``: per step a thought, a model call, a tool call and
   its answer, the last tool call left unanswered. Their events are sealed into the Merkle tree
   through the sealer's own path (``sealing._append_leaves_and_sign``).
4. Measured, each beside its floor through psycopg on a connection of its own, alternating call
   by call so that both see the same machine (medians; p99 where a latency is the target):
   - append: ``services.event_append`` of one step to a running task by its holder, against an
     ``UPDATE`` of the task row and an ``INSERT`` of the event in one transaction;
   - claim: ``leases.lease_claim`` of the oldest pending task, against ``SELECT … FOR UPDATE SKIP
     LOCKED`` of the same task, its ``UPDATE`` and the claim's ``INSERT``;
   - a task's page: ``event_page_visible`` (the API's events page, 100 events) of a random task,
     and of the largest probe in the middle of its log, against the same rows by ``(task_id, seq)``;
   - the task list: the API's (``task_list``, oldest first) and the dashboard's (``task_page``,
     newest first) without a search, and the dashboard's with ``?q=`` a customer id one task holds
     and a tool name most tasks called, against ``SELECT`` of the same page (with the search,
     the same index condition);
   - recovery context (``recovery_context``) of each probe, against reading the probe's events
     (seq, type, payload) in seq order;
   - verify (``chain_check``, the verifier's recomputation of every hash) of the probes up to
     ``VERIFY_MAX`` events, against reading their hashed columns;
   - an inclusion proof (``inclusion_proof_for_event``) of a random sealed event, against
     reading its leaf;
   - the overview's tiles (``overview_figures``), against counting the tasks by status and the
     last minute's and hour's events and claims without leaving sandboxes out.

Targets (issue 46): append (p50 and p99) and claim at ``--events`` within 1.2 × their figures at
``--base-events`` in the same layout; the task lists and the overview within 3 × their plain SQL;
recovery context at 10⁶ events in one task under 1 s. Everything else is reported.

Writes ``summary.md`` and ``summary.json`` to ``--out``. Exit status: 1 when a case failed, 0
otherwise (a missed target is a figure, not a failure).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _support import ROOT, percentile

from backplane.eventlog.chain import GENESIS_HASH  # importable: _support put ROOT on sys.path

BASE_EVENTS = 100_000
BASE_TASKS = 1_000
CHUNK_TASKS = 2_000
DAYS = 30
PROBE_SIZES = (1_000, 100_000, 1_000_000)
VERIFY_MAX = 100_000
NAMESPACE = "bench"
KINDS = ("support.triage", "billing.refund", "sales.followup", "research.brief", "ops.incident")
TOOLS = ("send_email", "crm_lookup", "crm_update", "search_web", "fetch_url", "create_ticket", "refund_payment",
         "calendar_book")
COMMON_TOOL = "crm_lookup"
PROBE_NAMESPACE_UUID = uuid.UUID("6f1d2c3e-46a0-4c1b-9d7e-5b0e2a4f7c11")
# A database server sized for this machine (24 GiB, 2 cores): a quarter of the memory for shared
# buffers, checkpoints far enough apart that a bulk load is not one checkpoint after another, yet
# little enough WAL kept that it fits beside the table on the disk. Durability stays on: every
# measured commit waits for fsync.
SERVER_SETTINGS = {
    "shared_buffers": "6GB",
    "effective_cache_size": "16GB",
    "maintenance_work_mem": "1GB",
    "work_mem": "32MB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "30min",
    "max_parallel_maintenance_workers": "2",
    "max_parallel_workers_per_gather": "2",
}


def say(text: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {text}", flush=True)


# --- the server -------------------------------------------------------------------------------


def start_server(root: Path) -> str:
    """The tuned embedded server; the admin URL (database ``postgres``)."""
    import psycopg

    from backplane.runtime import embedded_db

    pgdata = root / "pgdata"
    url = embedded_db.start(pgdata, database="postgres")
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in SERVER_SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
    embedded_db.restart(pgdata)
    return url


def database_url(admin_url: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


# --- one case: the schema -------------------------------------------------------------------------


def migrate(layout: str) -> str:
    """Migrate the case's database to ``layout``; the table's relkind as a check."""
    from django.core.management import call_command
    from django.db import connection

    if layout == "unpartitioned":
        call_command("migrate", "backplane", "0031", verbosity=0)
        call_command("migrate", "backplane", "0032", fake=True, verbosity=0)
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'backplane_event'")
        relkind = cursor.fetchone()[0]
    expected = {"unpartitioned": "r", "partitioned": "p"}[layout]
    if relkind != expected:
        raise SystemExit(f"backplane_event is relkind {relkind!r}, not {expected!r} ({layout})")
    return relkind


def event_table_keys(conn: Any) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The events table's constraints (primary, unique, foreign) and its other indexes, as
    (name, definition), for dropping them before the load and making them again after it."""
    constraints = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'backplane_event'::regclass"
        " AND contype IN ('p', 'u', 'f') ORDER BY contype DESC, conname"
    ).fetchall()
    indexes = conn.execute(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = 'backplane_event'::regclass"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY 1"
    ).fetchall()
    return constraints, indexes


# --- one case: the load ----------------------------------------------------------------------------

_FAKE_HASH = "md5(({i})::text || ':' || ({s})::text) || md5(({s})::text || ':' || ({i})::text)"
# The plan of every task, generated once: its number, id, length, status, kind and times.
_PLAN_SQL = f"""
CREATE UNLOGGED TABLE scale_plan AS
SELECT i, md5('scale-task-' || i)::uuid AS id, len, status, (ARRAY{list(KINDS)!r})[i %% 5 + 1] AS kind,
       'agent-' || lpad((i %% 12)::text, 2, '0') AS agent,
       %(start)s::timestamptz + ((i - 1) / {CHUNK_TASKS}) * %(chunk)s::interval AS created_at,
       %(chunk)s::interval / (2 * %(avg)s + 2) AS gap
  FROM (SELECT i, greatest(6, %(avg)s / 2 + abs(hashtext('len' || i)) %% (%(avg)s + 1)) AS len,
               CASE WHEN i %% least(200, greatest(2, %(tasks)s / 10)) = 0 THEN 'running'
                    ELSE (ARRAY['completed', 'pending', 'failed', 'dead_lettered'])[
                         CASE WHEN abs(hashtext('st' || i)) %% 100 < 60 THEN 1
                              WHEN abs(hashtext('st' || i)) %% 100 < 80 THEN 2
                              WHEN abs(hashtext('st' || i)) %% 100 < 92 THEN 3 ELSE 4 END] END AS status
          FROM generate_series(1, %(tasks)s) i) AS g
"""
_FILLER_TASKS_SQL = f"""
INSERT INTO backplane_task (id, namespace, kind, status, input, output, error, metadata, parent_id, attempts,
    max_attempts, lease_holder, lease_epoch, lease_expires_at, lease_seconds, dispatch_key, last_seq, head_hash,
    lamport, created_by, created_at, updated_at, last_event_at, finished_last_event_at, sandbox)
SELECT id, '{NAMESPACE}', kind, status, jsonb_build_object('customer', 'cus_' || i),
       CASE WHEN status = 'completed' THEN '{{"ok": true}}'::jsonb END,
       CASE WHEN status IN ('failed', 'dead_lettered') THEN 'tool crm_update rate limited' END,
       '{{}}'::jsonb, NULL, 1, 3,
       CASE WHEN status = 'running' THEN agent END, 1,
       CASE WHEN status = 'running' THEN now() + interval '30 days' END, 300, NULL, len,
       {_FAKE_HASH.format(i="i", s="len")}, len, 'bench', created_at, created_at + len * gap, created_at + len * gap,
       CASE WHEN status IN ('completed', 'failed', 'dead_lettered') THEN created_at + len * gap END, false
  FROM scale_plan WHERE i BETWEEN %(first)s AND %(last)s
"""
# The chunk's events in the order its tasks would have appended them: step by step across the
# chunk's tasks, so a task's events lie thousands of positions apart, as concurrent agents leave them.
_FILLER_EVENTS_SQL = f"""
INSERT INTO backplane_event (task_id, seq, type, payload, agent, lamport, recorded_at, prev_hash, hash)
SELECT id, s, type,
       CASE type
         WHEN 'TaskStarted' THEN jsonb_build_object(
             'kind', kind, 'input', jsonb_build_object('customer', 'cus_' || i), 'parent_task_id', NULL,
             'max_attempts', 3, 'metadata', '{{}}'::jsonb)
         WHEN 'TaskClaimed' THEN jsonb_build_object('holder', agent, 'lease_epoch', 1, 'lease_seconds', 300,
                                                    'recovered', false)
         WHEN 'ReasoningStepCompleted' THEN jsonb_build_object('step', (s - 3) / 3, 'thought',
             (ARRAY['check', 'compare', 'summarise', 'verify', 'escalate', 'look up'])[
                 abs(hashtext('v' || i || s)) %% 6 + 1]
             || ' ' || (ARRAY['the billing history', 'the open tickets', 'the renewal date', 'the refund rules',
                             'the shipping address', 'the contact owner'])[abs(hashtext('o' || i || s)) %% 6 + 1]
             || ' of customer cus_' || i)
         WHEN 'ToolCallDispatched' THEN jsonb_build_object('step', (s - 3) / 3, 'tool', tool,
             'idempotency_key', {_FAKE_HASH.format(i="i", s="-s")},
             'input', jsonb_build_object('customer', 'cus_' || i))
         WHEN 'ToolCallResultReceived' THEN jsonb_build_object('idempotency_key', {_FAKE_HASH.format(i="i", s="1 - s")},
             'status', 'succeeded', 'result', jsonb_build_object('records', s %% 7, 'tool', tool))
         WHEN 'TaskCompleted' THEN '{{"output": {{"ok": true}}}}'::jsonb
         WHEN 'TaskFailed' THEN '{{"error": "tool crm_update rate limited"}}'::jsonb
         ELSE jsonb_build_object('holder', agent, 'lease_epoch', 1)
       END,
       CASE WHEN type IN ('TaskStarted', 'TaskStalled', 'TaskFailed') THEN NULL ELSE agent END,
       s, created_at + s * gap + (i %% {CHUNK_TASKS}) * interval '1 ms',
       CASE WHEN s = 1 THEN '{GENESIS_HASH}' ELSE {_FAKE_HASH.format(i="i", s="s - 1")} END,
       {_FAKE_HASH.format(i="i", s="s")}
  FROM (SELECT p.*, s, (ARRAY{list(TOOLS)!r})[abs(hashtext('t' || i || (s - 3) / 3)) %% {len(TOOLS)} + 1] AS tool,
               CASE WHEN s = 1 THEN 'TaskStarted'
                    WHEN s = 2 THEN 'TaskClaimed'
                    WHEN s = len AND status = 'completed' THEN 'TaskCompleted'
                    WHEN s = len AND status IN ('failed', 'dead_lettered') THEN 'TaskFailed'
                    WHEN s = len AND status = 'pending' THEN 'TaskStalled'
                    ELSE (ARRAY['ReasoningStepCompleted', 'ToolCallDispatched', 'ToolCallResultReceived'])[
                        (s - 3) %% 3 + 1]
               END AS type
          FROM scale_plan p CROSS JOIN LATERAL generate_series(1, p.len) AS s
         WHERE i BETWEEN %(first)s AND %(last)s) AS e
 ORDER BY s, i
"""


def load_filler(url: str, *, tasks: int, events: int, deadline: float) -> dict[str, Any]:
    """Generate ``tasks`` tasks and about ``events`` events in SQL, keys dropped meanwhile."""
    import psycopg

    figures: dict[str, Any] = {}
    now = datetime.now(UTC)
    start = now - timedelta(days=DAYS)
    chunks = (tasks + CHUNK_TASKS - 1) // CHUNK_TASKS
    params = {"start": start, "chunk": timedelta(days=DAYS) / chunks, "avg": max(6, events // tasks), "tasks": tasks}
    with psycopg.connect(url, autocommit=True) as conn:
        # Client-side binding: CREATE TABLE … AS takes no server-side parameters.
        psycopg.ClientCursor(conn).execute(_PLAN_SQL, params)
        conn.execute("CREATE UNIQUE INDEX ON scale_plan (i)")
        constraints, indexes = event_table_keys(conn)
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        for name, _ in constraints:
            conn.execute(f'ALTER TABLE backplane_event DROP CONSTRAINT "{name}"')

    started = time.perf_counter()
    loaded = {"chunks": 0}
    counting = threading.Lock()

    def load_chunk(chunk: int) -> None:
        if time.time() > deadline:
            return
        bounds = {"first": chunk * CHUNK_TASKS + 1, "last": min(tasks, (chunk + 1) * CHUNK_TASKS)}
        with psycopg.connect(url) as conn:  # one transaction: a chunk's tasks come with their events
            conn.execute(_FILLER_TASKS_SQL, bounds)
            conn.execute(_FILLER_EVENTS_SQL, bounds)
        with counting:
            loaded["chunks"] += 1
            if loaded["chunks"] % 25 == 0:
                say(f"  {loaded['chunks']}/{chunks} chunks, {time.perf_counter() - started:.0f} s")

    # Two connections: PostgreSQL runs each INSERT … SELECT on one core, and there are two.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(load_chunk, n) for n in range(chunks)]:
            future.result()
    figures["insert_seconds"] = time.perf_counter() - started

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '2GB'")
        started = time.perf_counter()
        for name, definition in constraints:
            if definition.startswith("FOREIGN KEY"):
                conn.execute(f'ALTER TABLE backplane_event ADD CONSTRAINT "{name}" {definition} NOT VALID')
                conn.execute(f'ALTER TABLE backplane_event VALIDATE CONSTRAINT "{name}"')
            else:
                conn.execute(f'ALTER TABLE backplane_event ADD CONSTRAINT "{name}" {definition}')
        for _, definition in indexes:
            # A partitioned table's index prints as ``ON ONLY``, which would index no partition.
            conn.execute(definition.replace(" ON ONLY ", " ON "))
        figures["index_seconds"] = time.perf_counter() - started
        conn.execute("DROP TABLE scale_plan")
        conn.execute("SELECT setval(pg_get_serial_sequence('backplane_event', 'position'),"
                     " (SELECT max(position) FROM backplane_event))")
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE backplane_task")
        conn.execute("VACUUM ANALYZE backplane_event")
        figures["vacuum_seconds"] = time.perf_counter() - started
        figures["tasks"], figures["events"] = conn.execute(
            "SELECT (SELECT count(*) FROM backplane_task), (SELECT count(*) FROM backplane_event)").fetchone()
    figures["chunks_loaded"], figures["chunks"] = loaded["chunks"], chunks
    return figures


# --- one case: probe tasks whose chains verify ------------------------------------------------------


def probe_id(size: int) -> uuid.UUID:
    return uuid.uuid5(PROBE_NAMESPACE_UUID, f"probe-{size}")


def probe_rows(size: int) -> Iterator[str]:
    """COPY lines of a probe task's ``size`` events, hashed as the writer hashes them."""
    from backplane.eventlog.chain import compute_hash, hashed_fields

    task_id = str(probe_id(size))
    base = datetime(2026, 11, 1, tzinfo=UTC)
    prev = GENESIS_HASH
    agent = "prober"
    for seq in range(1, size + 1):
        step = (seq - 3) // 4
        if seq == 1:
            kind, payload = "TaskStarted", {"kind": KINDS[0], "input": {"customer": "cus_probe"},
                                            "parent_task_id": None, "max_attempts": 3, "metadata": {}}
        elif seq == 2:
            kind, payload = "TaskClaimed", {"holder": agent, "lease_epoch": 1, "lease_seconds": 300,
                                            "recovered": False}
        else:
            key = f"{task_id}:{step}"
            kind, payload = [
                ("ReasoningStepCompleted", {"step": step, "thought": f"compare the refund rules, step {step}"}),
                ("LLMCalled", {"step": step, "model": "gpt-4o-mini", "provider": "openai",
                               "prompt_sha256": f"{step:064x}", "output": f"call {TOOLS[step % 8]} next",
                               "usage": {"input_tokens": 812, "output_tokens": 64}}),
                ("ToolCallDispatched", {"idempotency_key": f"{step:032x}{size:032x}", "step": step,
                                        "tool": TOOLS[step % 8], "input": {"customer": "cus_probe", "key": key}}),
                ("ToolCallResultReceived", {"idempotency_key": f"{step:032x}{size:032x}", "status": "succeeded",
                                            "result": {"records": step % 7}}),
            ][(seq - 3) % 4]
            if seq == size and kind != "ToolCallDispatched":  # the last call is in flight: a recovery's case
                kind, payload = "ToolCallDispatched", {"idempotency_key": f"{step + 1:032x}{size:032x}",
                                                       "step": step + 1, "tool": TOOLS[0], "input": {"key": key}}
        recorded_at = base + timedelta(milliseconds=seq)
        fields = hashed_fields(task_id=task_id, seq=seq, type=kind, payload=payload, agent=agent,
                               idempotency_key=None, lamport=seq, causation_id=None, correlation_id=None,
                               trace_id=None, recorded_at=recorded_at, prev_hash=prev)
        digest = compute_hash(fields)
        body = json.dumps(payload, separators=(",", ":")).replace("\\", "\\\\")
        yield (f"{task_id}\t{seq}\t{kind}\t{body}\t{agent}\t{seq}\t{fields['recorded_at']}\t{prev}\t{digest}\n")
        prev = digest


def load_probes(url: str, sizes: list[int], cache: Path) -> dict[str, Any]:
    """The probe tasks (their rows, their events by COPY from the cache), sealed."""
    import psycopg

    started = time.perf_counter()
    cache.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(url) as conn:
        for size in sizes:
            rows = cache / f"probe-{size}.tsv"
            if not rows.exists():
                partial = rows.with_suffix(".part")
                with partial.open("w") as out:
                    out.writelines(probe_rows(size))
                partial.rename(rows)
            with rows.open("rb") as tail:  # the last line's hash is the task's head
                tail.seek(max(0, rows.stat().st_size - 4096))
                head_hash = tail.read().decode().rstrip("\n").rsplit("\n", 1)[-1].rsplit("\t", 1)[-1]
            conn.execute(
                "INSERT INTO backplane_task (id, namespace, kind, status, input, metadata, attempts, max_attempts,"
                " lease_holder, lease_epoch, lease_expires_at, lease_seconds, last_seq, head_hash, lamport,"
                " created_by, created_at, updated_at, last_event_at, sandbox)"
                " VALUES (%s, %s, %s, 'running', '{\"customer\": \"cus_probe\"}', '{}', 1, 3, 'prober', 1,"
                " now() + interval '30 days', 300, %s, %s, %s, 'prober', now(), now(), now(), false)",
                [probe_id(size), NAMESPACE, KINDS[0], size, head_hash, size])
            with conn.cursor().copy("COPY backplane_event (task_id, seq, type, payload, agent, lamport,"
                                    " recorded_at, prev_hash, hash) FROM STDIN") as copy, rows.open() as lines:
                for line in lines:
                    copy.write(line)
        conn.commit()
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    sealed = seal_probes(sizes)
    return {"probe_load_seconds": loaded, "seal_seconds": time.perf_counter() - started, "leaves": sealed}


def seal_probes(sizes: list[int]) -> int:
    """The probes' events as the Merkle tree's leaves, in position order, a head every 100,000."""
    from django.db import connection, transaction

    from backplane.integrity import sealing

    with connection.cursor() as cursor:
        cursor.execute("SELECT position, hash FROM backplane_event WHERE task_id = ANY(%s) ORDER BY position",
                       [[probe_id(size) for size in sizes]])
        leaves = cursor.fetchall()
    head = None
    for first in range(0, len(leaves), 100_000):
        with transaction.atomic(durable=True):
            head = sealing._append_leaves_and_sign(head, leaves[first:first + 100_000], now=None)
    return len(leaves)


# --- one case: measuring ------------------------------------------------------------------------------


class Floor:
    """A psycopg connection of its own, for the plain SQL each figure is set beside."""

    def __init__(self, url: str) -> None:
        import psycopg

        # Planned for each call's values, as a hand-written query would be: no prepared statements.
        self.conn = psycopg.connect(url, prepare_threshold=None)

    def rows(self, sql: str, params: Any = None) -> list[Any]:
        with self.conn.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        self.conn.commit()
        return rows

    def execute(self, sql: str) -> None:
        self.conn.execute(sql)
        self.conn.commit()

    def write(self, *statements: tuple[str, Any]) -> None:
        with self.conn.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
        self.conn.commit()


def side_by_side(name: str, product: Callable[[int], Any], floor: Callable[[int], Any], *, runs: int,
                 warmup: int = 2) -> dict[str, Any]:
    """``runs`` calls of each, alternating; the ``n``th call's argument is ``n``. Milliseconds."""
    mine: list[float] = []
    plain: list[float] = []
    for n in range(-warmup, runs):
        for fn, samples in ((product, mine), (floor, plain)):
            started = time.perf_counter()
            fn(n)
            if n >= 0:
                samples.append((time.perf_counter() - started) * 1000)
    result = {"name": name, "runs": runs,
              "p50_ms": statistics.median(mine), "p99_ms": percentile(mine, 99),
              "floor_p50_ms": statistics.median(plain), "floor_p99_ms": percentile(plain, 99)}
    result["ratio"] = result["p50_ms"] / result["floor_p50_ms"]
    say(f"  {name}: {result['p50_ms']:.2f} ms (p99 {result['p99_ms']:.2f}) against {result['floor_p50_ms']:.2f} ms"
        f" (p99 {result['floor_p99_ms']:.2f}): {result['ratio']:.2f} ×")
    return result


def faster_statement(floor: Floor, statements: list[str], params: list[Any]) -> str:
    """The statement of ``statements`` that answered first, each after the first cut off at five
    times the fastest so far (the same rows either way: a check)."""
    import psycopg

    best, best_ms, answer = statements[0], float("inf"), None
    for sql in statements:
        limit = "0" if best_ms == float("inf") else str(int(best_ms * 5) + 100)
        floor.execute(f"SET statement_timeout = {limit}")
        started = time.perf_counter()
        try:
            rows = floor.rows(sql, params)
        except psycopg.errors.QueryCanceled:
            continue
        finally:
            floor.conn.rollback()
            floor.execute("SET statement_timeout = 0")
        took = (time.perf_counter() - started) * 1000
        if answer is not None and rows != answer:
            raise SystemExit(f"two plain statements found different tasks: {sql}")
        answer = rows
        if took < best_ms:
            best, best_ms = sql, took
    return best


_EVENT_COLUMNS = ("position, task_id, seq, type, payload, agent, idempotency_key, lamport, causation_id, "
                  "correlation_id, trace_id, recorded_at, prev_hash, hash")


def measure(url: str, *, probes: list[int], runs: int) -> list[dict[str, Any]]:
    from django.db import connection

    from backplane.eventlog import services
    from backplane.eventlog.models import Task
    from backplane.eventlog.selectors import TaskFilters, event_page_visible, task_list
    from backplane.eventlog.writer import EventDraft
    from backplane.integrity.sealing import inclusion_proof_for_event
    from backplane.integrity.verification import chain_check
    from dashboard.selectors.overview import overview_figures
    from dashboard.selectors.tasks import LIST_FIELDS, task_page
    from recovery.leases import lease_claim
    from recovery.selectors import recovery_context

    floor = Floor(url)
    results = []
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, lease_holder FROM backplane_task WHERE status = 'running' AND lease_holder"
                       " LIKE 'agent-%%'")
        running = cursor.fetchall()
        cursor.execute("SELECT count(*) FROM backplane_task WHERE status = 'pending'")
        pending = cursor.fetchone()[0]
        cursor.execute("SELECT id FROM backplane_task WHERE created_by = 'bench' ORDER BY random() LIMIT 500")
        sampled = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT input->>'customer' FROM backplane_task WHERE id = %s", [sampled[0]])
        rare = cursor.fetchone()[0]

    found = task_page(TaskFilters(q=rare), limit=50).tasks
    if [task.pk for task in found] != [sampled[0]]:
        raise SystemExit(f"?q={rare} found {[task.pk for task in found]}, not the one task that holds it")

    def append(n: int) -> None:
        task_id, holder = running[n % len(running)]
        services.event_append(namespace=NAMESPACE, task_id=task_id, agent=holder, lease_epoch=1,
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n, "thought": "go on"}))

    def append_floor(n: int) -> None:
        task_id, holder = running[(n + len(running) // 2) % len(running)]
        floor.write(
            ("UPDATE backplane_task SET last_seq = last_seq + 1, lamport = lamport + 1, updated_at = now(),"
             " last_event_at = now(), head_hash = md5(random()::text) || md5(random()::text) WHERE id = %s",
             [task_id]),
            ("INSERT INTO backplane_event (task_id, seq, type, payload, agent, lamport, recorded_at, prev_hash, hash)"
             " SELECT id, last_seq, 'ReasoningStepCompleted', %s, %s, lamport, now(), head_hash, head_hash"
             " FROM backplane_task WHERE id = %s", [json.dumps({"step": n, "thought": "go on"}), holder, task_id]),
        )

    results.append(side_by_side("append", append, append_floor, runs=runs * 10))

    agent = services.agent_create(name="claimer", namespace=NAMESPACE).agent  # each case's database is new

    def claim(n: int) -> None:
        if lease_claim(agent=agent, kinds=None, lease_seconds=300) is None:
            raise SystemExit("no pending task left to claim")

    def claim_floor(n: int) -> None:
        with floor.conn.cursor() as cursor:
            cursor.execute("SELECT id FROM backplane_task WHERE namespace = %s AND status = 'pending' AND NOT sandbox"
                           " ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED", [NAMESPACE])
            (task_id,) = cursor.fetchone()
            cursor.execute("UPDATE backplane_task SET status = 'running', lease_holder = 'floor', lease_epoch ="
                           " lease_epoch + 1, attempts = attempts + 1, lease_expires_at = now() + interval '300 s',"
                           " last_seq = last_seq + 1, lamport = lamport + 1, updated_at = now(), last_event_at = now()"
                           " WHERE id = %s RETURNING last_seq", [task_id])
            (seq,) = cursor.fetchone()
            cursor.execute("INSERT INTO backplane_event (task_id, seq, type, payload, agent, lamport, recorded_at,"
                           " prev_hash, hash) VALUES (%s, %s, 'TaskClaimed', '{\"holder\": \"floor\"}', 'floor', %s,"
                           " now(), %s, %s)", [task_id, seq, seq, "0" * 64, "1" * 64])
        floor.conn.commit()

    results.append(side_by_side("claim", claim, claim_floor, runs=min(runs * 4, pending // 2 - 4)))

    def page(task_id: uuid.UUID, after: int) -> tuple[Callable[[int], Any], Callable[[int], Any]]:
        return (lambda n: event_page_visible(namespace=NAMESPACE, task_id=task_id, after_seq=after, limit=100),
                lambda n: floor.rows(f"SELECT {_EVENT_COLUMNS} FROM backplane_event WHERE task_id = %s AND seq > %s"
                                     " ORDER BY seq LIMIT 101", [task_id, after]))

    # Another task for the plain SQL than the product's call just before it: the same task's rows
    # would be in memory by then, and at a table larger than memory a random task's are not.
    half = len(sampled) // 2
    results.append(side_by_side("task page (100 events)",
                                lambda n: page(sampled[n % len(sampled)], 0)[0](n),
                                lambda n: page(sampled[(n + half) % len(sampled)], 0)[1](n), runs=runs))
    if probes:
        big = max(probes)
        mine, plain = page(probe_id(big), big // 2)
        results.append(side_by_side(f"task page, seq {big // 2:,} of {big:,}", mine, plain, runs=runs))

    results.append(side_by_side(
        "task list, API (50, oldest first)",
        lambda n: task_list(namespace=NAMESPACE, status=None, kind=None, limit=50, cursor=None),
        lambda n: floor.rows("SELECT * FROM backplane_task WHERE namespace = %s ORDER BY created_at, id LIMIT 51",
                             [NAMESPACE]), runs=runs))
    columns = ", ".join(LIST_FIELDS)
    newest = "ORDER BY created_at DESC, id DESC LIMIT 51"
    results.append(side_by_side(
        "task list, dashboard (50, newest first)", lambda n: task_page(TaskFilters(), limit=50),
        lambda n: floor.rows(f"SELECT {columns} FROM backplane_task WHERE NOT sandbox {newest}"), runs=runs))
    # Two plain statements find the newest tasks with a matching event: the index's matches first
    # (best when few events match), or the newest tasks first, each probed for a match (best when
    # most tasks hold one). The floor is whichever was faster on a first try (the other is cut
    # off at five times as long).
    matches = ("jsonb_to_tsvector('simple'::regconfig, payload, '[\"string\", \"numeric\"]'::jsonb)"
               " @@ phraseto_tsquery('simple', %s)")
    index_first = (f"SELECT {columns} FROM backplane_task WHERE NOT sandbox AND id IN"
                   f" (SELECT task_id FROM backplane_event WHERE {matches}) {newest}")
    newest_first = (f"SELECT {columns} FROM backplane_task t WHERE NOT sandbox AND EXISTS"
                    f" (SELECT 1 FROM backplane_event e WHERE e.task_id = t.id AND {matches}) {newest}")
    for label, value in (("a customer one task holds", rare), ("a tool most tasks called", COMMON_TOOL)):
        search_floor = faster_statement(floor, [index_first, newest_first], [value])
        results.append(side_by_side(
            f"task list, dashboard ?q= {label}", lambda n, v=value: task_page(TaskFilters(q=v), limit=50),
            lambda n, v=value, sql=search_floor: floor.rows(sql, [v]), runs=max(3, runs // 10)))

    for size in probes:
        task_id = probe_id(size)
        context_runs = 10 if size <= 1_000 else 3
        results.append(context_parts(task_id, size))
        results.append(side_by_side(
            f"recovery context, {size:,} events", lambda n, t=task_id: recovery_context(namespace=NAMESPACE, task_id=t),
            lambda n, t=task_id: floor.rows("SELECT seq, type, payload FROM backplane_event WHERE task_id = %s"
                                            " ORDER BY seq", [t]), runs=context_runs, warmup=1))
        if size <= VERIFY_MAX:
            task = Task.objects.get(pk=task_id)

            def verify(n: int, task: Task = task) -> None:
                found = chain_check(task=task)
                if not found.valid:
                    raise SystemExit(f"the probe's chain does not verify: {found}")

            results.append(side_by_side(
                f"verify, {size:,} events", verify,
                lambda n, t=task_id: floor.rows(
                    "SELECT task_id, seq, type, payload, agent, idempotency_key, lamport, causation_id,"
                    " correlation_id, trace_id, recorded_at, prev_hash, hash FROM backplane_event"
                    " WHERE task_id = %s ORDER BY seq", [t]), runs=context_runs, warmup=1))
    if probes:
        with connection.cursor() as cursor:
            cursor.execute("SELECT event_id FROM backplane_merkleleaf ORDER BY random() LIMIT 200")
            positions = [row[0] for row in cursor.fetchall()]
        results.append(side_by_side(
            "inclusion proof", lambda n: inclusion_proof_for_event(position=positions[n % len(positions)],
                                                                   tree_size=None),
            lambda n: floor.rows("SELECT leaf_index FROM backplane_merkleleaf WHERE event_id = %s",
                                 [positions[n % len(positions)]]), runs=runs))

    def overview_floor(n: int) -> None:
        floor.rows("SELECT status, count(*) FROM backplane_task GROUP BY status")
        floor.rows("SELECT count(*) FILTER (WHERE recorded_at > now() - interval '1 minute'),"
                   " count(*) FILTER (WHERE type = 'TaskStalled'), count(*) FILTER (WHERE type = 'TaskClaimed')"
                   " FROM backplane_event WHERE recorded_at >= now() - interval '1 hour'")

    results.append(side_by_side("overview tiles", lambda n: overview_figures(), overview_floor, runs=max(3, runs // 5)))
    return results


def context_parts(task_id: uuid.UUID, size: int) -> dict[str, Any]:
    """Where one recovery context of a probe goes: reading and folding the log, the personal-data
    pass, the resume prompt, and the answer's size as JSON (what a cache of the folded state
    would still have to do each time is everything but the first)."""
    import cProfile
    import pstats

    import orjson

    from backplane.eventlog import lineage
    from backplane.privacy import services as privacy
    from recovery import selectors

    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    context = selectors.recovery_context(namespace=NAMESPACE, task_id=task_id)
    profile.disable()
    total = (time.perf_counter() - started) * 1000
    stats = pstats.Stats(profile).stats

    def cumulative_ms(module: Any, name: str) -> float:
        path = module.__file__
        return sum(row[3] for (file, _, function), row in stats.items() if file == path and function == name) * 1000

    started = time.perf_counter()
    body = orjson.dumps(context)
    dumped = (time.perf_counter() - started) * 1000
    parts = {"name": f"recovery context, {size:,} events: its parts", "profiled_ms": total,
             "history_ms": cumulative_ms(lineage, "history_of"),
             "personal_ms": cumulative_ms(privacy, "personal_shown"),
             "prompt_ms": cumulative_ms(selectors, "resume_prompt"), "json_ms": dumped, "json_bytes": len(body),
             "prompt_bytes": len(context["resume_prompt"].encode())}
    say(f"  {parts['name']}: {total:.0f} ms under the profiler, reading and folding the log"
        f" {parts['history_ms']:.0f} ms, personal data {parts['personal_ms']:.0f} ms, resume prompt"
        f" {parts['prompt_ms']:.0f} ms; JSON {len(body) / 2**20:.1f} MiB in {dumped:.0f} ms"
        f" (prompt {parts['prompt_bytes'] / 2**20:.1f} MiB)")
    return parts


def table_sizes(url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        heap, total = conn.execute(
            "SELECT sum(pg_table_size(c.oid)), sum(pg_total_relation_size(c.oid)) FROM pg_class c"
            " WHERE c.oid = 'backplane_event'::regclass OR c.oid IN"
            " (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'backplane_event'::regclass)").fetchone()
    return {"events_heap_bytes": int(heap), "events_total_bytes": int(total)}


def run_case(args: argparse.Namespace) -> None:
    """One case, in this process: migrate, load, measure; the figures to ``--json``."""
    os.environ["DATABASE_URL"] = args.url
    os.environ.setdefault("BACKPLANE_ENV", "test")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")
    var = Path(tempfile.mkdtemp(prefix="scale-case-", dir=ROOT / "var"))
    os.environ["BACKPLANE_VAR_DIR"] = str(var)
    try:
        import django

        django.setup()
        case: dict[str, Any] = {"layout": args.case, "target_events": args.events, "target_tasks": args.tasks}
        case["relkind"] = migrate(args.case)
        say(f"{args.case}, {args.events:,} events over {args.tasks:,} tasks: loading")
        case.update(load_filler(args.url, tasks=args.tasks, events=args.events, deadline=args.deadline))
        if case["chunks_loaded"] == 0:
            raise SystemExit(f"{args.case}: the budget ran out before the first chunk was loaded")
        probes = ([int(size) for size in args.probes.split(",")] if args.probes else
                  [size for size in PROBE_SIZES if size <= max(1_000, args.events // 10)])
        case["probes"] = probes
        case.update(load_probes(args.url, probes, Path(args.cache)))
        case.update(table_sizes(args.url))
        say(f"{args.case}: {case['events']:,} events, {case['tasks']:,} tasks loaded"
            f" (insert {case['insert_seconds']:.0f} s, keys {case['index_seconds']:.0f} s,"
            f" vacuum {case['vacuum_seconds']:.0f} s); measuring")
        case["results"] = measure(args.url, probes=probes, runs=args.runs)
        Path(args.json).write_text(json.dumps(case, indent=2, default=str) + "\n")
    finally:
        shutil.rmtree(var, ignore_errors=True)


# --- the run ------------------------------------------------------------------------------------------


def find(case: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in case.get("results", []) if r["name"] == name), None)


def verdicts(cases: list[dict[str, Any]], base_events: int, big_events: int) -> list[tuple[str, str, str, bool]]:
    """(case, what, figure, met) for each target."""
    found = []
    for layout in ("unpartitioned", "partitioned"):
        base = next((c for c in cases if c["layout"] == layout and c["target_events"] == base_events), None)
        big = next((c for c in cases if c["layout"] == layout and c["target_events"] == big_events), None)
        if base is None or big is None or "results" not in big or "results" not in base:
            continue
        for name, field in (("append", "p50_ms"), ("append", "p99_ms"), ("claim", "p50_ms")):
            mine, then = find(big, name), find(base, name)
            if mine and then:
                ratio = mine[field] / then[field]
                # The floor's own change between the two cases says how much the machine moved.
                moved = mine[f"floor_{field}"] / then[f"floor_{field}"]
                found.append((layout, f"{name} {field[:3]} at {big['events']:,} / at {base['events']:,} events",
                              f"{ratio:.2f} × ({mine[field]:.2f} / {then[field]:.2f} ms; plain SQL {moved:.2f} ×)",
                              ratio <= 1.2))
        for result in big["results"]:
            if result["name"].startswith(("task list", "overview")):
                found.append((layout, f"{result['name']} / plain SQL", f"{result['ratio']:.2f} ×",
                              result["ratio"] <= 3))
            if result["name"] == "recovery context, 1,000,000 events":
                found.append((layout, "recovery context, 10⁶ events", f"{result['p50_ms']:.0f} ms",
                              result["p50_ms"] < 1000))
    return found


def report(cases: list[dict[str, Any]], base_events: int, big_events: int, out: Path) -> None:
    lines = ["| | " + " | ".join(f"{c['layout']}, {c.get('events', 0):,} events" for c in cases) + " |",
             "| --- |" + " ---: |" * len(cases)]
    names: list[str] = []
    for case in cases:
        names += [r["name"] for r in case.get("results", []) if r["name"] not in names]
    for name in names:
        cells = []
        for case in cases:
            result = find(case, name)
            if result is None:
                cells.append("")
            elif "history_ms" in result:
                cells.append(f"log {result['history_ms']:.0f}, personal data {result['personal_ms']:.0f}, prompt"
                             f" {result['prompt_ms']:.0f} of {result['profiled_ms']:.0f} ms profiled; JSON"
                             f" {result['json_bytes'] / 2**20:.1f} MiB in {result['json_ms']:.0f} ms")
            else:
                cells.append(f"{result['p50_ms']:.2f} ms / {result['floor_p50_ms']:.2f} ms ({result['ratio']:.2f} ×)"
                             + (f", p99 {result['p99_ms']:.2f}" if name in ("append", "claim") else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| events table with indexes | " + " | ".join(
        f"{c.get('events_total_bytes', 0) / 2**30:.1f} GiB" for c in cases) + " |")
    lines.append("| load: insert / keys / vacuum | " + " | ".join(
        f"{c.get('insert_seconds', 0):.0f} / {c.get('index_seconds', 0):.0f} / {c.get('vacuum_seconds', 0):.0f} s"
        for c in cases) + " |")
    lines += ["", "| layout | target | figure | met |", "| --- | --- | ---: | --- |"]
    lines += [f"| {layout} | {what} | {figure} | {'yes' if met else '**no**'} |"
              for layout, what, figure, met in verdicts(cases, base_events, big_events)]
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(cases, indent=2, default=str) + "\n")
    print(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000_000)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--layouts", default="unpartitioned,partitioned")
    parser.add_argument("--base-events", type=int, default=BASE_EVENTS)
    parser.add_argument("--base-tasks", type=int, default=BASE_TASKS)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--probes", help="probe sizes, comma-separated (default: those of PROBE_SIZES up to a"
                                         " tenth of --events)")
    parser.add_argument("--budget-minutes", type=float, default=240)
    parser.add_argument("--out", default="var/bench/scale-events")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # A stop (Ctrl-C, SIGTERM) still drops the case's database and the server: ``finally`` runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.case:
        run_case(args)
        return 0

    from backplane.runtime import embedded_db

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (ROOT / "var").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-scale-events-", dir=ROOT / "var"))
    started = time.time()
    layouts = args.layouts.split(",")
    # Each layout's small case just before its large one, so the two are measured close in time.
    plan = [case for layout in layouts for case in ((layout, args.base_events, args.base_tasks),
                                                    (layout, args.events, args.tasks))]
    cases: list[dict[str, Any]] = []
    failed = False
    try:
        admin = start_server(root)
        for number, (layout, events, tasks) in enumerate(plan):
            name = f"scale_{layout}_{events}"
            import psycopg

            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            # Loading gets what is left of the budget, shared by the cases still to come by their
            # sizes, less a quarter kept for indexes, probes and measuring; a small case at least
            # the two minutes it needs.
            left = args.budget_minutes * 60 - (time.time() - started)
            deadline = time.time() + max(120.0, 0.75 * left * events / sum(e for _, e, _ in plan[number:]))
            json_path = out / f"{layout}-{events}.json"
            json_path.unlink(missing_ok=True)
            code = subprocess.call([sys.executable, __file__, "--case", layout, "--events", str(events),
                                    "--tasks", str(tasks), "--runs", str(args.runs), "--probes", args.probes or "",
                                    "--url", database_url(admin, name), "--json", str(json_path),
                                    "--cache", str(out / "probes"), "--deadline", str(deadline)])
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if code != 0 or not json_path.exists():
                say(f"{layout} at {events:,} events failed (exit {code})")
                failed = True
                cases.append({"layout": layout, "target_events": events, "events": 0})
                continue
            cases.append(json.loads(json_path.read_text()))
    finally:
        embedded_db.destroy(root / "pgdata")
        shutil.rmtree(root, ignore_errors=True)
    report(cases, args.base_events, args.events, out)
    say(f"done in {(time.time() - started) / 60:.1f} min")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
