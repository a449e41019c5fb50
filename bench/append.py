"""In-process append rate of the event log, beside a raw psycopg baseline on the same server.

    .venv/bin/python bench/append.py [--events 3000] [--threads 1]

Then the same single-event append with tracing off and on (an in-memory exporter), in
alternating rounds: what OpenTelemetry costs the hot path (docs/observability.md).

Baseline ("raw"): the least any append must do in PostgreSQL — one transaction that
locks a row, inserts a JSONB row and updates the locked row — written with psycopg
directly, no Django, no hashing. The ratio says what the append path (checks,
canonical JSON, SHA-256, the ORM) costs on top of the database's own work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from _support import bench_database, describe, percentile


def raw_baseline(url: str, events: int, threads: int) -> tuple[float, list[float]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS raw_event, raw_task")
        conn.execute("CREATE TABLE raw_task (id int PRIMARY KEY, last_seq int NOT NULL)")
        conn.execute(
            "CREATE TABLE raw_event (position bigserial PRIMARY KEY, task_id int, seq int, payload jsonb,"
            " hash text, UNIQUE (task_id, seq))"
        )
        conn.execute("INSERT INTO raw_task SELECT g, 0 FROM generate_series(0, %s) g", [threads])
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(index: int, count: int) -> None:
        local = []
        with psycopg.connect(url) as conn:
            for n in range(count):
                started = time.perf_counter()
                with conn.transaction():
                    (seq,) = conn.execute("SELECT last_seq FROM raw_task WHERE id = %s FOR UPDATE", [index]).fetchone()
                    conn.execute(
                        "INSERT INTO raw_event (task_id, seq, payload, hash) VALUES (%s, %s, %s, %s)",
                        [index, seq + 1, f'{{"step": {n}, "thought": "raw"}}', "0" * 64],
                    )
                    conn.execute("UPDATE raw_task SET last_seq = %s WHERE id = %s", [seq + 1, index])
                local.append((time.perf_counter() - started) * 1000)
        with lock:
            latencies.extend(local)

    return run_threads(worker, events, threads), latencies


def run_threads(worker, events: int, threads: int) -> float:  # type: ignore[no-untyped-def]
    per_thread = events // threads
    pool = [threading.Thread(target=worker, args=(i, per_thread)) for i in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return per_thread * threads / (time.perf_counter() - started)


def service_appends(events: int, threads: int, batch: int, *, traced: bool = False,
                    cpu: list[float] | None = None) -> tuple[float, list[float]]:
    """``traced``: each append runs inside a server span, as a request's does with tracing on."""
    from contextlib import nullcontext

    from django.db import connection
    from opentelemetry import trace

    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    tracer = trace.get_tracer("bench")

    tasks = [
        services.task_create(namespace="bench", kind="bench", input={}, agent="bench").task for _ in range(threads)
    ]
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(index: int, count: int) -> None:
        local = []
        task = tasks[index]
        cpu_started = time.thread_time()
        for n in range(0, count, batch):
            drafts = [
                EventDraft(type="ReasoningStepCompleted", payload={"step": n + i, "thought": "bench"})
                for i in range(batch)
            ]
            started = time.perf_counter()
            span = tracer.start_as_current_span("POST events", kind=trace.SpanKind.SERVER) if traced else nullcontext()
            with span:
                services.event_append_batch(namespace="bench", task_id=task.pk, drafts=drafts, agent="bench")
            local.append((time.perf_counter() - started) * 1000)
        if cpu is not None:  # this thread's CPU per append, in ms (other threads' work is not in it)
            cpu.append((time.thread_time() - cpu_started) * 1000 / count)
        connection.close()
        with lock:
            latencies.extend(local)

    return run_threads(worker, events, threads), latencies


@dataclass
class TracingRounds:
    """Appends per second and the appending thread's CPU per append (ms), round by round."""

    off: list[float] = field(default_factory=list)
    on: list[float] = field(default_factory=list)
    on_without_statements: list[float] = field(default_factory=list)
    cpu_off: list[float] = field(default_factory=list)
    cpu_on: list[float] = field(default_factory=list)
    cpu_on_without_statements: list[float] = field(default_factory=list)


def tracing_off_and_on(events: int, threads: int, *, rounds: int) -> TracingRounds:
    """The single-event append rate with tracing off and on, in alternating rounds (so a drift of
    the machine's speed hits both alike). On: the SDK with every instrumentation the product
    installs (psycopg's spans included) and a batch processor, as with OTEL_EXPORTER_OTLP_ENDPOINT
    set, but exporting to memory; each append runs in a server span, as a request's does. The
    rate includes the database's time (fsync mostly), which moves by ±20 % between rounds here;
    the CPU per append is what tracing adds, without that noise. A third configuration leaves the
    statements untraced (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=psycopg)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from backplane.telemetry import tracing

    exporter = InMemorySpanExporter()
    measured = TracingRounds()
    for _ in range(rounds):
        measured.off.append(service_appends(events, threads, 1, cpu=measured.cpu_off)[0])
        for disabled, rates, cpu in (((), measured.on, measured.cpu_on),
                                     (("psycopg",), measured.on_without_statements,
                                      measured.cpu_on_without_statements)):
            tracing.tracing_install(exporter, service_name="bench", batch=True, disabled=disabled)
            try:
                rates.append(service_appends(events, threads, 1, traced=True, cpu=cpu)[0])
            finally:
                tracing.tracing_uninstall()
            if not exporter.get_finished_spans():
                raise SystemExit("tracing on recorded no span: the bench measured nothing")
            exporter.clear()
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--tracing-rounds", type=int, default=3,
                        help="rounds of the tracing off/on comparison (each: --events appends off, then on)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/http_bench.py reads it)")
    args = parser.parse_args()

    with bench_database() as url:
        raw_rate, raw_lat = raw_baseline(url, args.events, args.threads)
        single_rate, single_lat = service_appends(args.events, args.threads, 1)
        batch_rate, batch_lat = service_appends(args.events * 5, args.threads, args.batch)
        tracing_rounds = tracing_off_and_on(args.events, args.threads, rounds=args.tracing_rounds)
    untraced, traced = tracing_rounds.off, tracing_rounds.on
    cpu_off, cpu_on = statistics.median(tracing_rounds.cpu_off), statistics.median(tracing_rounds.cpu_on)
    print(f"append bench: {args.events} events, {args.threads} thread(s), same PostgreSQL server")
    print(f"  raw psycopg lock+insert+update: {raw_rate:9.0f} events/s  ({describe(raw_lat)})")
    print(f"  event_append (1 per txn):       {single_rate:9.0f} events/s  ({describe(single_lat)})"
          f"  ratio to raw {single_rate / raw_rate:.2f}")
    print(f"  event_append_batch ({args.batch}/txn):   {batch_rate:9.0f} events/s  ({describe(batch_lat)} per batch)"
          f"  ratio to raw {batch_rate / raw_rate:.2f}")
    off, on = statistics.median(untraced), statistics.median(traced)
    print(f"  event_append, tracing off:      {off:9.0f} events/s  (median of {len(untraced)} rounds:"
          f" {', '.join(f'{r:.0f}' for r in untraced)})")
    print(f"  event_append, tracing on:       {on:9.0f} events/s  (median of {len(traced)} rounds:"
          f" {', '.join(f'{r:.0f}' for r in traced)}; spans to an in-memory exporter)")
    print(f"  tracing costs {100 * (1 - on / off):.1f} % of the append rate (target: at most 15 %)")
    print(f"  CPU per append, appending thread: {cpu_off:.2f} ms off, {cpu_on:.2f} ms on"
          f" (+{cpu_on - cpu_off:.2f} ms, +{100 * (cpu_on / cpu_off - 1):.0f} %)")
    bare = statistics.median(tracing_rounds.on_without_statements)
    cpu_bare = statistics.median(tracing_rounds.cpu_on_without_statements)
    print(f"  tracing on, statements untraced: {bare:8.0f} events/s  (median of"
          f" {len(tracing_rounds.on_without_statements)} rounds:"
          f" {', '.join(f'{r:.0f}' for r in tracing_rounds.on_without_statements)}),"
          f" costs {100 * (1 - bare / off):.1f} %; CPU per append {cpu_bare:.2f} ms")
    if args.json:
        def figures(rate: float, latencies: list[float]) -> dict[str, float]:
            return {"per_s": rate, "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}

        Path(args.json).write_text(json.dumps({
            "events": args.events, "threads": args.threads, "batch": args.batch,
            "raw": figures(raw_rate, raw_lat), "event_append": figures(single_rate, single_lat),
            "event_append_batch": figures(batch_rate, batch_lat),
            "ratio_single_to_raw": single_rate / raw_rate, "ratio_batch_to_raw": batch_rate / raw_rate,
            "tracing": {"off_per_s": off, "on_per_s": on, "rounds_off": untraced, "rounds_on": traced,
                        "cost": 1 - on / off, "cpu_ms_off": cpu_off, "cpu_ms_on": cpu_on,
                        "cpu_rounds_off": tracing_rounds.cpu_off, "cpu_rounds_on": tracing_rounds.cpu_on,
                        "without_statements": {
                            "per_s": bare, "cost": 1 - bare / off, "cpu_ms": cpu_bare,
                            "rounds": tracing_rounds.on_without_statements,
                            "cpu_rounds": tracing_rounds.cpu_on_without_statements}},
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
