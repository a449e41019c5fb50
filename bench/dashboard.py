"""The dashboard over a large event log: which index serves payload search, and what the pages
cost against plain SQL of the same rows, at two table sizes in one run.

    .venv/bin/python bench/dashboard.py [--events N --tasks M] [--sizes 100000:1000,1000000:10000]
                                        [--runs 20] [--page-runs 30] [--writes 10000]

Without ``--events`` every size of ``--sizes`` runs in a process of its own, one after the
other, each with its own throw-away database (``bench/_support.py``), and last tables set the
sizes side by side. With ``--events N --tasks M`` only that size runs, in this process.

Per size:
1. Load (``bench/_dashboard_data.py``): M tasks and N events by COPY, one task with 1,000
   events, sub-task links, payloads shaped like the product's, ``recorded_at`` over 7 days,
   then ``VACUUM ANALYZE``. Indexes over ``payload`` that the migrations made are dropped
   before the load and rebuilt after it (that build is timed too). The loader plants search
   probes and counts, from the JSON it generated, which tasks hold each one (case-insensitive
   substring): the ground truth the indexes are compared with.
2. Pages (``measure_pages``), on the product's schema as migrated: the task list (default, and
   with ``?q=`` a rare and a common value), the page of the 1,000-event task and the overview,
   through Django's test ``Client`` logged in as staff, median of ``--page-runs`` requests after
   3 to warm up; each against plain SQL of the rows it shows, through psycopg in this process.
3. Payload search candidates, one at a time, alone on the table (the product's own payload
   index dropped again): ``none`` (a sequential scan, ``ILIKE`` on ``payload::text``),
   (a) GIN ``jsonb_path_ops`` with ``@>`` (needs the key: the probe's containment document),
   (a2) GIN ``jsonb_ops`` with ``@? '$.** ? (@ == "value")'`` (an exact value under any key),
   (b) pg_trgm GIN on ``(payload::text)`` with ``ILIKE '%value%'``,
   (c) GIN on ``jsonb_to_tsvector('simple', payload, '["string", "numeric"]')`` with
   ``@@ phraseto_tsquery('simple', value)`` (c: words adjacent, as typed) and with
   ``@@ plainto_tsquery`` (c-and: every word somewhere in the payload), the same index
   with ``fastupdate = off`` (c-nofu), and (d) the same words in a stored generated column
   with a GIN index on it (a phrase's recheck reads them instead of recomputing them; last,
   since adding the column rewrites the table).
   For each: ``CREATE INDEX`` time (default ``maintenance_work_mem``), size, ``ANALYZE``; per
   probe the task-list query (tasks with a matching event, newest first, 51 rows) 3 times to
   warm up and ``--runs`` times timed (median, p95), whether its plan uses the index, and the
   tasks the match finds against the ground truth; then the write cost: single-row INSERTs
   into ``backplane_event`` (``--writes`` at 1M events, a hundredth of the events below), one
   transaction each, with only this payload index on the table, and ``synchronous_commit``
   off for them: the commit's fsync is the same with or without an index and, on a machine
   whose disk others share, varies more than the index's cost (0.6-2.9 ms a run); then the
   rare probe again, now that the inserts sit in the GIN pending list. ``none`` writes before
   every index and at the end; each index's extra cost per insert is against the mean of the
   ``none`` runs just before and after it.

Queries go through psycopg's client-side binding, as Django sends them (no prepared plans).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlencode

from _dashboard_data import COMMON_TOOL, NAMESPACE, NEEDLE, Dataset, Probe, load, write_payloads
from _support import bench_database, percentile

WARMUP = 3
SEQ_SCAN_RUNS = 3
PAGE = 51  # 50 rows and one to know whether there is a next page
PAGE_TARGET = 5.0  # a page within 5x its plain SQL
TSV = "jsonb_to_tsvector('simple'::regconfig, payload, '[\"string\", \"numeric\"]'::jsonb)"
# The task list's order (dashboard.selectors.tasks.task_page): newest created first.
PAGE_SQL = (
    "SELECT t.* FROM backplane_task t WHERE t.id IN (SELECT e.task_id FROM backplane_event e WHERE {match})"
    f" ORDER BY t.created_at DESC, t.id DESC LIMIT {PAGE}"
)


def like_pattern(value: str) -> str:
    """``%value%`` with LIKE's wildcards in the value escaped (``crm_lookup`` has one)."""
    return "%" + re.sub(r"([\\%_])", r"\\\1", value) + "%"


def jsonpath_equals(value: str) -> str:
    # A JSON string literal is a jsonpath string literal.
    return f"$.** ? (@ == {json.dumps(value)})"


Match = Callable[[Probe], tuple[str, str] | None]


@dataclass(frozen=True)
class Method:
    """One way to query an index: (match SQL with one %s, its parameter) for a probe, or None
    when the method cannot express the probe."""

    key: str
    label: str
    match: Match


@dataclass(frozen=True)
class Candidate:
    key: str
    label: str
    create: str | None  # CREATE INDEX with {name}; None: no index
    methods: tuple[Method, ...]
    runs: int | None = None  # timed runs, if not --runs
    drop: str = "DROP INDEX {name}"


ILIKE = Method("b", "ILIKE '%value%' on payload::text", lambda p: ("e.payload::text ILIKE %s", like_pattern(p.value)))
PHRASE = Method("c", "@@ phraseto_tsquery('simple', value)",
                lambda p: (f"{TSV} @@ phraseto_tsquery('simple'::regconfig, %s)", p.value))
CANDIDATES = (
    Candidate("none", "no index (sequential scan)", None,
              (Method("none", ILIKE.label, ILIKE.match),), runs=SEQ_SCAN_RUNS),
    Candidate("a", "(a) GIN (payload jsonb_path_ops)",
              "CREATE INDEX {name} ON backplane_event USING gin (payload jsonb_path_ops)",
              (Method("a", "@> containment document",
                      lambda p: ("e.payload @> %s::jsonb", json.dumps(p.containment)) if p.containment else None),)),
    Candidate("a2", "(a2) GIN (payload), default jsonb_ops",
              "CREATE INDEX {name} ON backplane_event USING gin (payload)",
              (Method("a2", "@? '$.** ? (@ == value)'",
                      lambda p: ("e.payload @? %s::jsonpath", jsonpath_equals(p.value)) if p.containment else None),)),
    Candidate("b", "(b) pg_trgm GIN ((payload::text) gin_trgm_ops)",
              "CREATE INDEX {name} ON backplane_event USING gin ((payload::text) gin_trgm_ops)", (ILIKE,)),
    Candidate("c", "(c) GIN (jsonb_to_tsvector('simple', payload, '[\"string\", \"numeric\"]'))",
              f"CREATE INDEX {{name}} ON backplane_event USING gin ({TSV})",
              (PHRASE, Method("c-and", "@@ plainto_tsquery('simple', value)",
                              lambda p: (f"{TSV} @@ plainto_tsquery('simple'::regconfig, %s)", p.value)))),
    Candidate("c-nofu", "(c) with fastupdate = off",
              f"CREATE INDEX {{name}} ON backplane_event USING gin ({TSV}) WITH (fastupdate = off)",
              (Method("c-nofu", PHRASE.label, PHRASE.match),)),
    # Last: it rewrites the table. The same words, stored, so that a phrase's recheck reads them
    # instead of computing them again from the payload for every candidate row.
    Candidate("d", "(d) stored generated tsvector column (same words) + GIN on it",
              f"ALTER TABLE backplane_event ADD COLUMN bench_words tsvector GENERATED ALWAYS AS ({TSV}) STORED;"
              " CREATE INDEX {name} ON backplane_event USING gin (bench_words)",
              (Method("d", "bench_words @@ phraseto_tsquery('simple', value)",
                      lambda p: ("e.bench_words @@ phraseto_tsquery('simple'::regconfig, %s)", p.value)),),
              drop="DROP INDEX {name}; ALTER TABLE backplane_event DROP COLUMN bench_words"),
)


@dataclass
class QueryResult:
    method: str
    probe: str
    supported: bool
    uses_index: bool = False
    events_found: int = 0
    tasks_found: int = 0
    tasks_expected: int = 0
    missing: int = 0
    extra: int = 0
    page_ok: bool = False
    p50_ms: float = 0.0
    p95_ms: float = 0.0


@dataclass
class WriteResult:
    candidate: str
    inserts: int
    mean_ms: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    extra_ms: float | None = None  # mean, against the "none" runs around it
    extra_p50_ms: float | None = None  # median, likewise (less moved by other load on the machine)
    rare_after_ms: float | None = None  # the rare probe's p50 after the inserts


@dataclass
class IndexResult:
    candidate: str
    build_s: float = 0.0
    size_mb: float = 0.0
    analyze_s: float = 0.0
    table_growth_mb: float = 0.0  # what the candidate added to the table itself (a stored column)


@dataclass
class PageResult:
    page: str
    url: str
    plain: str
    queries: int
    page_ms: float
    plain_ms: float

    @property
    def ratio(self) -> float:
        return self.page_ms / self.plain_ms


@dataclass
class SizeResult:
    events: int
    tasks: int
    table_mb: float
    payload_bytes: float
    events_last_hour: int
    generate_s: float
    copy_s: float
    vacuum_s: float
    product_indexes: dict[str, float]  # payload indexes of the migrations: name -> rebuild seconds
    settings: dict[str, str]
    trgm_available: bool
    load_average: list[float] = field(default_factory=list)  # 1-minute, at the start and at the end
    indexes: list[IndexResult] = field(default_factory=list)
    writes: list[WriteResult] = field(default_factory=list)
    queries: list[QueryResult] = field(default_factory=list)
    pages: list[PageResult] | None = None
    pages_missing: str | None = None


# --- measuring helpers --------------------------------------------------------------------------


def timed_ms(fn: Callable[[], Any], runs: int, warmup: int = WARMUP) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def measure_query(conn: Any, method: Method, probe: Probe, expected_page: list[uuid.UUID], index: str | None,
                  runs: int) -> QueryResult:
    result = QueryResult(method=method.key, probe=probe.kind, supported=False, tasks_expected=len(probe.task_ids))
    shaped = method.match(probe)
    if shaped is None:
        return result
    match, param = shaped
    result.supported = True
    found = conn.execute(
        f"SELECT e.task_id, count(*) FROM backplane_event e WHERE {match} GROUP BY e.task_id", [param]
    ).fetchall()
    tasks = {row[0] for row in found}
    result.events_found = sum(row[1] for row in found)
    result.tasks_found = len(tasks)
    result.missing = len(probe.task_ids - tasks)
    result.extra = len(tasks - probe.task_ids)
    sql = PAGE_SQL.format(match=match)
    plan = json.dumps(conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", [param]).fetchone()[0])
    result.uses_index = index is not None and f'"{index}"' in plan
    # The first run checks the page and counts as the first warm-up run.
    page = [row[0] for row in conn.execute(sql, [param]).fetchall()]
    result.page_ok = page == expected_page
    samples = timed_ms(lambda: conn.execute(sql, [param]).fetchall(), runs, warmup=WARMUP - 1)
    result.p50_ms = statistics.median(samples)
    result.p95_ms = percentile(samples, 95)
    return result


def measure_writes(url: str, candidate: str, payloads: list[tuple[str, str]]) -> WriteResult:
    """Single-row INSERTs, one transaction each (without waiting for the WAL flush), into a task
    of their own (created 30 days ago, so it stays off the first page of the task list)."""
    import psycopg

    task_id = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute(
            "INSERT INTO backplane_task (id, namespace, kind, status, input, metadata, attempts, max_attempts,"
            " lease_epoch, lease_seconds, last_seq, head_hash, lamport, created_at, updated_at)"
            " VALUES (%s, %s, 'bench.write', 'running', '{}', '{}', 0, 3, 1, 300, 0, %s, 0,"
            " now() - interval '30 days', now() - interval '30 days')",
            [task_id, NAMESPACE, "0" * 64],
        )
        sql = (
            "INSERT INTO backplane_event (task_id, seq, type, payload, agent, lamport, recorded_at, prev_hash, hash)"
            " VALUES (%s, %s, %s, %s::jsonb, 'agent-00', %s, now(), %s, %s)"
        )
        samples = []
        prev = "0" * 64
        for seq, (kind, payload) in enumerate(payloads, start=1):
            digest = f"{seq:064x}"
            started = time.perf_counter()
            conn.execute(sql, [task_id, seq, kind, payload, seq, prev, digest])
            samples.append((time.perf_counter() - started) * 1000)
            prev = digest
    return WriteResult(candidate=candidate, inserts=len(samples), mean_ms=statistics.fmean(samples),
                       p50_ms=statistics.median(samples), p99_ms=percentile(samples, 99), max_ms=max(samples))


def payload_indexes(conn: Any) -> dict[str, str]:
    """The migrations' indexes over backplane_event.payload: name -> definition."""
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'backplane_event'"
        " AND indexdef ~ '\\mpayload\\M'"
    ).fetchall()
    return dict(rows)


# --- part 2: the pages --------------------------------------------------------------------------


def dashboard_missing() -> str | None:
    """Why the pages cannot be measured in this tree, or None."""
    from django.urls import NoReverseMatch, reverse

    for module, name in (("overview", "overview_figures"), ("tasks", "task_page"), ("task_detail", "event_rows")):
        dotted = f"dashboard.selectors.{module}"
        if importlib.util.find_spec("dashboard.selectors") is None or importlib.util.find_spec(dotted) is None:
            return f"dashboard/selectors/{module}.py does not exist"
        if not hasattr(importlib.import_module(dotted), name):
            return f"{dotted} has no {name}"
    for name, kwargs in (("overview", {}), ("tasks", {}), ("task", {"task_id": uuid.uuid4()})):
        try:
            reverse(f"dashboard:{name}", kwargs=kwargs)
        except NoReverseMatch:
            return f"no URL named dashboard:{name}"
    return None


# Plain SQL of what each page shows, written out here (not the selectors' own SQL) so that a
# selector that reads more than it shows, or reads it slowly, shows in the ratio.
LIST_COLUMNS = (
    "id, namespace, kind, status, attempts, max_attempts, lease_holder, lease_expires_at, last_seq, parent_id,"
    " created_at, updated_at, last_event_at"
)
PLAIN_LIST = [f"SELECT {LIST_COLUMNS} FROM backplane_task ORDER BY created_at DESC, id DESC LIMIT {PAGE}"]
PLAIN_SEARCH = [
    f"SELECT {LIST_COLUMNS} FROM backplane_task WHERE id IN (SELECT task_id FROM backplane_event WHERE {TSV}"
    f" @@ phraseto_tsquery('simple'::regconfig, %(q)s)) ORDER BY created_at DESC, id DESC LIMIT {PAGE}"
]
PLAIN_DETAIL = ["SELECT * FROM backplane_task WHERE id = %(task)s",
                "SELECT * FROM backplane_event WHERE task_id = %(task)s ORDER BY seq"]
PLAIN_OVERVIEW = [
    "SELECT status, count(*) FROM backplane_task GROUP BY status",
    "SELECT (SELECT count(*) FROM backplane_event WHERE recorded_at > now() - interval '1 minute'),"
    " (SELECT count(DISTINCT task_id) FROM backplane_event"
    "   WHERE recorded_at >= now() - interval '1 hour' AND type = 'TaskStalled'),"
    " (SELECT count(*) FROM backplane_event WHERE recorded_at >= now() - interval '1 hour'"
    "   AND type = 'TaskClaimed' AND payload @> '{\"recovered\": true}'),"
    " (SELECT count(*) FROM backplane_task WHERE status IN ('pending', 'running') AND attempts > 0)",
    "SELECT date_trunc('minute', recorded_at), count(*), count(*) FILTER (WHERE type = 'TaskCompleted'),"
    " count(*) FILTER (WHERE type = 'TaskStalled') FROM backplane_event"
    " WHERE recorded_at >= now() - interval '1 hour' GROUP BY 1",
    "SELECT e.position, e.task_id, e.seq, e.type, e.agent, e.recorded_at, t.kind, t.status FROM backplane_event e"
    " JOIN backplane_task t ON t.id = e.task_id ORDER BY e.position DESC LIMIT 30",
]


def measure_pages(url: str, data: Dataset, *, runs: int) -> list[PageResult]:
    """Server time of each page through Django's test Client (a staff user, force_login),
    against plain SQL of the same rows through psycopg, both medians of ``runs`` after warm-up."""
    import psycopg
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    user = get_user_model().objects.create_user(username="bench-staff", password=None, is_staff=True)
    client = Client()
    client.force_login(user)
    rare = next(p for p in data.probes if p.value == NEEDLE)
    tasks_url = reverse("dashboard:tasks")
    pages: list[tuple[str, str, str, list[str], dict[str, Any], uuid.UUID | None]] = [
        # (page, url, what the plain SQL reads, statements, parameters, a task id the page must show)
        ("task list", tasks_url, "51 task rows", PLAIN_LIST, {}, data.task_order[0]),
        (f"task list ?q={NEEDLE}", f"{tasks_url}?{urlencode({'q': NEEDLE})}", "the search query, 1 task",
         PLAIN_SEARCH, {"q": NEEDLE}, next(iter(rare.task_ids))),
        (f"task list ?q={COMMON_TOOL}", f"{tasks_url}?{urlencode({'q': COMMON_TOOL})}", "the search query, 51 tasks",
         PLAIN_SEARCH, {"q": COMMON_TOOL}, None),
        ("task detail, 1,000 events", reverse("dashboard:task", kwargs={"task_id": data.big_task_id}),
         "the task row and its 1,000 events", PLAIN_DETAIL, {"task": data.big_task_id}, None),
        ("overview", reverse("dashboard:overview"),
         "status counts, 3 event counts, per-minute chart of the hour, 30 newest events", PLAIN_OVERVIEW, {}, None),
    ]
    results = []
    with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        for name, path, plain, statements, params, must_show in pages:
            response = client.get(path)
            if response.status_code != 200:
                raise SystemExit(f"{path} answered {response.status_code}")
            if must_show is not None and str(must_show) not in response.content.decode():
                raise SystemExit(f"{path} does not show task {must_show}")
            with CaptureQueriesContext(connection) as captured:
                client.get(path)
            # Now: the next request clears the connection's query log.
            queries = len(captured)

            def plain_sql(statements: list[str] = statements, params: dict[str, Any] = params) -> None:
                for sql in statements:
                    conn.execute(sql, params if "%(" in sql else None).fetchall()

            page_ms = statistics.median(timed_ms(lambda path=path: client.get(path), runs))
            plain_ms = statistics.median(timed_ms(plain_sql, runs))
            results.append(PageResult(page=name, url=path, plain=plain, queries=queries, page_ms=page_ms,
                                      plain_ms=plain_ms))
            print(f"  {name}: {page_ms:.1f} ms, plain SQL {plain_ms:.2f} ms, {page_ms / plain_ms:.1f}x,"
                  f" {queries} queries", flush=True)
    return results


# --- one size -----------------------------------------------------------------------------------


def run_size(*, events: int, tasks: int, runs: int, page_runs: int, writes: int) -> SizeResult:
    import psycopg

    load_at_start = os.getloadavg()[0]
    with bench_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            product = payload_indexes(conn)
            for name in product:
                conn.execute(f"DROP INDEX {name}")
        started = time.perf_counter()
        data: Dataset = load(url, tasks=tasks, events=events)
        print(f"loaded {data.tasks:,} tasks and {data.events:,} events in {time.perf_counter() - started:.1f} s"
              f" (generate {data.generate_seconds:.1f} s, COPY {data.copy_seconds:.1f} s,"
              f" VACUUM ANALYZE {data.vacuum_seconds:.1f} s); {data.events_last_hour:,} in the last hour", flush=True)
        with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            rebuilt = {}
            for name, definition in product.items():
                started = time.perf_counter()
                conn.execute(definition)
                rebuilt[name] = time.perf_counter() - started
                print(f"rebuilt the migrations' {name} in {rebuilt[name]:.1f} s", flush=True)
            conn.execute("ANALYZE backplane_event")
            settings = {
                name: conn.execute(f"SHOW {name}").fetchone()[0]
                for name in ("server_version", "shared_buffers", "work_mem", "maintenance_work_mem",
                             "gin_pending_list_limit", "max_parallel_maintenance_workers")
            }
            table_mb = conn.execute("SELECT pg_table_size('backplane_event')").fetchone()[0] / 2**20
            payload_bytes = conn.execute(
                "SELECT avg(octet_length(payload::text)) FROM backplane_event TABLESAMPLE SYSTEM (5)"
            ).fetchone()[0]
        result = SizeResult(
            events=data.events, tasks=data.tasks, table_mb=table_mb, payload_bytes=float(payload_bytes),
            events_last_hour=data.events_last_hour, generate_s=data.generate_seconds, copy_s=data.copy_seconds,
            vacuum_s=data.vacuum_seconds, product_indexes=rebuilt, settings=settings, trgm_available=False,
        )

        result.pages_missing = dashboard_missing()
        if result.pages_missing:
            print(f"pages not measured: {result.pages_missing}", flush=True)
        else:
            print("pages:", flush=True)
            result.pages = measure_pages(url, data, runs=page_runs)

        with psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            for name in product:
                conn.execute(f"DROP INDEX {name}")
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
                result.trgm_available = True
            except psycopg.Error as exc:
                print(f"pg_trgm is not available: {exc}", flush=True)
            measure_candidates(url, conn, data, result, runs=runs, writes=writes)
    result.load_average = [load_at_start, os.getloadavg()[0]]
    return result


def measure_candidates(url: str, conn: Any, data: Dataset, result: SizeResult, *, runs: int, writes: int) -> None:
    payloads = write_payloads(writes, avoid=[probe.value for probe in data.probes])
    pages = {
        probe.kind: [task_id for task_id in data.task_order if task_id in probe.task_ids][:PAGE]
        for probe in data.probes
    }
    rare = data.probes[0]
    for candidate in CANDIDATES:
        if candidate.key == "b" and not result.trgm_available:
            continue
        if candidate.create:
            result.writes.append(measure_writes(url, "none", payloads))
        name = f"bench_search_{candidate.key.replace('-', '_')}"
        built = IndexResult(candidate=candidate.key)
        if candidate.create:
            table_bytes = conn.execute("SELECT pg_table_size('backplane_event')").fetchone()[0]
            started = time.perf_counter()
            conn.execute(candidate.create.format(name=name))
            built.build_s = time.perf_counter() - started
            built.size_mb = conn.execute("SELECT pg_relation_size(%s::regclass)", [name]).fetchone()[0] / 2**20
            built.table_growth_mb = (
                conn.execute("SELECT pg_table_size('backplane_event')").fetchone()[0] - table_bytes
            ) / 2**20
            # Statistics of the indexed expression, which the planner's estimates need.
            started = time.perf_counter()
            conn.execute("ANALYZE backplane_event")
            built.analyze_s = time.perf_counter() - started
        print(f"{candidate.label}: built in {built.build_s:.1f} s, {built.size_mb:.0f} MB", flush=True)
        result.indexes.append(built)
        for method in candidate.methods:
            for probe in data.probes:
                measured = measure_query(conn, method, probe, pages[probe.kind], name if candidate.create else None,
                                         candidate.runs or runs)
                result.queries.append(measured)
                print(f"  {method.key} {probe.kind}: " + (
                    f"p50 {measured.p50_ms:.2f} ms, p95 {measured.p95_ms:.2f} ms, {measured.tasks_found} tasks"
                    f" (expected {measured.tasks_expected}), index used: {measured.uses_index}"
                    if measured.supported else "cannot be expressed"), flush=True)
        if candidate.create:
            written = measure_writes(url, candidate.key, payloads)
            shaped = candidate.methods[0].match(rare)
            if shaped:
                sql = PAGE_SQL.format(match=shaped[0])
                written.rare_after_ms = statistics.median(
                    timed_ms(lambda sql=sql, param=shaped[1]: conn.execute(sql, [param]).fetchall(), runs)
                )
            result.writes.append(written)
            conn.execute(candidate.drop.format(name=name))
    result.writes.append(measure_writes(url, "none", payloads))
    # Each index against the "none" runs just before and after it.
    for index, written in enumerate(result.writes):
        if written.candidate == "none":
            continue
        before = next(w for w in reversed(result.writes[:index]) if w.candidate == "none")
        after = next(w for w in result.writes[index:] if w.candidate == "none")
        written.extra_ms = written.mean_ms - (before.mean_ms + after.mean_ms) / 2
        written.extra_p50_ms = written.p50_ms - (before.p50_ms + after.p50_ms) / 2


# --- reporting ------------------------------------------------------------------------------------


def label(key: str) -> str:
    return next(c.label for c in CANDIDATES if c.key == key)


def method_label(key: str) -> str:
    return next(m.label for c in CANDIDATES for m in c.methods if m.key == key)


def report(size: SizeResult) -> None:
    print()
    print(f"### {size.events:,} events, {size.tasks:,} tasks")
    print()
    print(f"Event table {size.table_mb:,.0f} MB without indexes, payload {size.payload_bytes:.0f} bytes on average"
          f" as text, {size.events_last_hour:,} events in the last hour. Load: generate {size.generate_s:.1f} s,"
          f" COPY {size.copy_s:.1f} s, VACUUM ANALYZE {size.vacuum_s:.1f} s; the migrations' payload indexes"
          f" rebuilt after it: " + (", ".join(f"{k} {v:.1f} s" for k, v in size.product_indexes.items()) or "none")
          + ". PostgreSQL " + ", ".join(f"{k} {v}" for k, v in size.settings.items())
          + ". Load average " + " -> ".join(f"{v:.1f}" for v in size.load_average) + ".")
    if size.pages is not None:
        print()
        print("| page | server time (p50) | plain SQL of the same rows (p50) | ratio | queries | target < 5x |")
        print("| --- | ---: | --- | ---: | ---: | --- |")
        for p in size.pages:
            print(f"| {p.page} | {p.page_ms:.1f} ms | {p.plain_ms:.2f} ms ({p.plain}) | {p.ratio:.1f}x | {p.queries} |"
                  f" {'met' if p.ratio < PAGE_TARGET else '**not met**'} |")
    else:
        print(f"\nPages not measured: {size.pages_missing}.")
    print()
    print("| index | build | size | inserts | insert mean | p50 / p99 / max | extra a row: mean, p50 |"
          " rare probe after |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for w in size.writes:
        built = next((i for i in size.indexes if i.candidate == w.candidate and w.candidate != "none"), None)
        size_mb = ""
        if built:
            size_mb = f"{built.size_mb:,.0f} MB"
            if built.table_growth_mb >= 1:
                size_mb += f" + {built.table_growth_mb:,.0f} MB of table"
        print(f"| {label(w.candidate)} | {f'{built.build_s:.1f} s' if built else ''} |"
              f" {size_mb} | {w.inserts:,} | {w.mean_ms:.3f} ms | {w.p50_ms:.2f} / {w.p99_ms:.2f} / {w.max_ms:.1f} ms |"
              f" {'' if w.extra_ms is None else f'{w.extra_ms:+.3f}, {w.extra_p50_ms:+.3f} ms'} |"
              f" {'' if w.rare_after_ms is None else f'{w.rare_after_ms:.2f} ms'} |")
    print()
    print("| method | probe | index used | tasks found / expected | first page right | p50 | p95 |")
    print("| --- | --- | --- | ---: | --- | ---: | ---: |")
    for q in size.queries:
        if not q.supported:
            print(f"| {q.method} | {q.probe} | cannot be expressed | | | | |")
            continue
        found = f"{q.tasks_found:,} / {q.tasks_expected:,}"
        if q.missing or q.extra:
            found += f" ({q.missing:,} missing, {q.extra:,} extra)"
        print(f"| {q.method} | {q.probe} | {'yes' if q.uses_index else 'no'} | {found} |"
              f" {'yes' if q.page_ok else 'no'} | {q.p50_ms:.2f} ms | {q.p95_ms:.2f} ms |")


def report_sizes(sizes: list[SizeResult]) -> None:
    heads = " | ".join(f"{s.events:,} events" for s in sizes)
    if all(s.pages is not None for s in sizes):
        print()
        print("### Pages at each size: server time p50, plain SQL p50, ratio")
        print()
        print(f"| page | {heads} |")
        print(f"| --- |{' --- |' * len(sizes)}")
        for p in sizes[0].pages or []:
            cells = []
            for size in sizes:
                other = next(o for o in size.pages or [] if o.page == p.page)
                cells.append(f"{other.page_ms:.1f} ms / {other.plain_ms:.2f} ms = {other.ratio:.1f}x")
            print(f"| {p.page} | {' | '.join(cells)} |")
    print()
    print("### Payload search at each size: task-list query p50 (ms)")
    print()
    print(f"| method | probe | {heads} |")
    print(f"| --- | --- |{' ---: |' * len(sizes)}")
    for q in sizes[0].queries:
        if not q.supported:
            continue
        cells = []
        for size in sizes:
            other = next((o for o in size.queries if o.method == q.method and o.probe == q.probe), None)
            cells.append(f"{other.p50_ms:.2f}" if other else "")
        print(f"| {q.method} | {q.probe} | {' | '.join(cells)} |")


def from_json(data: dict[str, Any]) -> SizeResult:
    nested = ("indexes", "writes", "queries", "pages")
    size = SizeResult(**{k: v for k, v in data.items() if k not in nested})
    size.indexes = [IndexResult(**i) for i in data["indexes"]]
    size.writes = [WriteResult(**w) for w in data["writes"]]
    size.queries = [QueryResult(**q) for q in data["queries"]]
    size.pages = None if data["pages"] is None else [PageResult(**p) for p in data["pages"]]
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--events", type=int, help="one size only: this many events (with --tasks)")
    parser.add_argument("--tasks", type=int, default=None)
    parser.add_argument("--sizes", default="100000:1000,1000000:10000", help="events:tasks,... (without --events)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each search query")
    parser.add_argument("--page-runs", type=int, default=30, help="timed requests of each page")
    parser.add_argument("--writes", type=int, default=10000, help="single-row inserts per index at 1M events")
    parser.add_argument("--json", help="also write the results here (used between the processes)")
    args = parser.parse_args()

    if args.events:
        tasks = args.tasks or max(1, args.events // 100)
        writes = min(args.writes, max(100, args.events // 100))
        size = run_size(events=args.events, tasks=tasks, runs=args.runs, page_runs=args.page_runs, writes=writes)
        report(size)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(asdict(size), out)
        return

    results = []
    for spec in args.sizes.split(","):
        events, tasks = (int(part) for part in spec.split(":"))
        print(f"\n== {events:,} events, {tasks:,} tasks ==", flush=True)
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            subprocess.run(
                [sys.executable, __file__, "--events", str(events), "--tasks", str(tasks), "--runs", str(args.runs),
                 "--page-runs", str(args.page_runs), "--writes", str(args.writes), "--json", path],
                check=True,
            )
            with open(path) as data:
                results.append(from_json(json.load(data)))
        finally:
            os.unlink(path)
    if len(results) > 1:
        report_sizes(results)


if __name__ == "__main__":
    main()
