"""In-process append rate of the event log, beside a raw psycopg baseline on the same server.

    .venv/bin/python bench/append.py [--events 3000] [--threads 1]

Then the same single-event append with tracing off and on (an in-memory exporter), in
alternating rounds: what OpenTelemetry costs the hot path, called in process and as a request
through Django's handler (docs/observability.md), and what tracing leaves on an append's path
while it is off. ``--tracing-rounds 0`` skips the off/on rounds (the off-path hooks are still
measured, without their share of a request's CPU, which comes from the rounds).

Baseline ("raw"): the least any append must do in PostgreSQL — one transaction that
locks a row, inserts a JSONB row and updates the locked row — written with psycopg
directly, no Django, no hashing. The ratio says what the append path (checks,
canonical JSON, SHA-256, the ORM) costs on top of the database's own work.
"""

from __future__ import annotations

import argparse
import json
import os
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


def service_appends(events: int, threads: int, batch: int,
                    cpu: list[float] | None = None) -> tuple[float, list[float]]:
    from django.db import connection

    from backplane.eventlog import services
    from backplane.eventlog.models import Agent
    from backplane.eventlog.writer import EventDraft
    from recovery import leases

    # Each task is held under a lease, as an agent's work is: every append is checked against
    # its holder and epoch (backplane.eventlog.writer.check_lease).
    agent = (Agent.objects.filter(namespace="bench", name="bench").first()
             or services.agent_create(name="bench", namespace="bench").agent)
    tasks = [
        services.task_create(namespace="bench", kind="bench", input={}, agent="bench").task for _ in range(threads)
    ]
    epochs = []
    for task in tasks:
        claim = leases.lease_claim(agent=agent, kinds=["bench"], lease_seconds=3600, task_id=task.pk)
        assert claim is not None
        epochs.append(claim.lease_epoch)
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
            services.event_append_batch(namespace="bench", task_id=task.pk, drafts=drafts, agent="bench",
                                        lease_epoch=epochs[index])
            local.append((time.perf_counter() - started) * 1000)
        if cpu is not None:  # this thread's CPU per append, in ms (other threads' work is not in it)
            cpu.append((time.thread_time() - cpu_started) * 1000 / count)
        connection.close()
        with lock:
            latencies.extend(local)

    return run_threads(worker, events, threads), latencies


def request_appends(events: int, cpu: list[float]) -> float:
    """Single-event appends as the product serves them, through Django's request handler in this
    process (its middleware, authentication, the append view): the test client, no socket, one
    thread. With tracing on, each is a request with Django's server span around the append."""
    from django.db import connection
    from django.test import Client

    from backplane.eventlog import services

    agent = services.agent_create(name=f"bench-{time.monotonic_ns()}", namespace="bench", kinds=())
    task = services.task_create(namespace="bench", kind="bench", input={}, agent="bench").task
    # A new client loads the middleware as it is now: with Django's instrumentation when it is on.
    client = Client(HTTP_AUTHORIZATION=f"Bearer {agent.token}")
    cpu_started = time.thread_time()
    started = time.perf_counter()
    for n in range(events):
        response = client.post(f"/api/v1/tasks/{task.pk}/events/", {"type": "ReasoningStepCompleted",
                               "payload": {"step": n, "thought": "bench"}}, content_type="application/json")
        if response.status_code != 201:
            raise SystemExit(f"append request answered {response.status_code}: {response.content!r}")
    rate = events / (time.perf_counter() - started)
    cpu.append((time.thread_time() - cpu_started) * 1000 / events)
    connection.close()
    return rate


@dataclass
class Measured:
    """Appends per second and the appending thread's CPU per append (ms), round by round."""

    rates: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def cpu_ms(self) -> float:
        return statistics.median(self.cpu)

    def as_json(self) -> dict[str, object]:
        return {"per_s": self.rate, "cpu_ms": self.cpu_ms, "rounds": self.rates, "cpu_rounds": self.cpu}


@dataclass
class TracingRounds:
    off: Measured = field(default_factory=Measured)
    on: Measured = field(default_factory=Measured)
    requests_off: Measured = field(default_factory=Measured)
    requests_on: Measured = field(default_factory=Measured)


def tracing_off_and_on(events: int, *, rounds: int) -> TracingRounds:
    """The single-event append rate with tracing off and on, in alternating rounds (so a drift of
    the machine's speed hits both alike). On: the SDK with every instrumentation the product
    installs and a batch processor, as with OTEL_EXPORTER_OTLP_ENDPOINT set, but exporting to
    memory. Measured twice: ``event_append`` called in process (what tracing costs the append:
    its statement's span), and the append request through Django's handler (what it costs a
    request: Django's server span and its attributes too). The rate includes the database's time
    (fsync mostly), which moves by ±20 % between rounds here; the CPU per append is what tracing
    adds, without that noise."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from backplane.telemetry import tracing

    exporter = InMemorySpanExporter()
    measured = TracingRounds()
    for _ in range(rounds):
        measured.off.rates.append(service_appends(events, 1, 1, cpu=measured.off.cpu)[0])
        measured.requests_off.rates.append(request_appends(events // 3, measured.requests_off.cpu))
        tracing.tracing_install(exporter, service_name="bench", batch=True)
        try:
            measured.on.rates.append(service_appends(events, 1, 1, cpu=measured.on.cpu)[0])
            measured.requests_on.rates.append(request_appends(events // 3, measured.requests_on.cpu))
        finally:
            tracing.tracing_uninstall()
        if not exporter.get_finished_spans():
            raise SystemExit("tracing on recorded no span: the bench measured nothing")
        exporter.clear()
    return measured


def tracing_off_hooks(calls: int) -> float:
    """CPU per append request, in µs, of what tracing leaves on the path while it is off: the
    ``traceparent`` check (``TraceContextMiddleware``, a request without one), the writer's read
    of the current trace (``current_trace_ids``) and the span annotation (``span_annotate_write``,
    which returns at its first line). A loop over fresh requests, so per-request caches start
    empty as they do in a server: a lower bound of the cost in place, where caches are colder."""
    import uuid

    from django.test import RequestFactory

    from backplane.telemetry import tracing

    if tracing.tracing_enabled():
        raise SystemExit("tracing is on: the off-path hooks cannot be measured")
    factory = RequestFactory()
    requests = [factory.post("/api/v1/tasks/x/events/", data=b"{}", content_type="application/json",
                             HTTP_AUTHORIZATION="Bearer bench", HTTP_USER_AGENT="bench/1") for _ in range(calls)]
    middleware = tracing.TraceContextMiddleware(lambda request: None)
    task_id = str(uuid.uuid4())
    started = time.thread_time()
    for request in requests:
        middleware(request)
        tracing.current_trace_ids()
        tracing.span_annotate_write(task_id=task_id, kind="bench", seq=1, events=(), agent="bench", lease_epoch=0)
    return (time.thread_time() - started) / calls * 1e6


def report_tracing(label: str, off: Measured, on: Measured, *, target: bool) -> None:
    print(f"  {label}, tracing off: {off.rate:7.0f}/s  (median of {len(off.rates)} rounds:"
          f" {', '.join(f'{r:.0f}' for r in off.rates)})")
    print(f"  {label}, tracing on:  {on.rate:7.0f}/s  (median of {len(on.rates)} rounds:"
          f" {', '.join(f'{r:.0f}' for r in on.rates)}; spans to an in-memory exporter)")
    print(f"    tracing costs {100 * (1 - on.rate / off.rate):.1f} % of the rate"
          f"{' (target: at most 15 %)' if target else ''}; CPU per append {off.cpu_ms:.2f} ms off,"
          f" {on.cpu_ms:.2f} ms on (+{on.cpu_ms - off.cpu_ms:.2f} ms, +{100 * (on.cpu_ms / off.cpu_ms - 1):.0f} %)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--tracing-rounds", type=int, default=3,
                        help="rounds of the tracing off/on comparison (each: --events appends in process and a"
                             " third as many requests, off, then on; 0 skips the comparison)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/http_bench.py reads it)")
    args = parser.parse_args()
    if args.tracing_rounds < 0:
        parser.error("--tracing-rounds must be 0 or more")

    # The request rounds send as fast as one thread can; the per-token limit is not what they measure.
    os.environ.setdefault("BACKPLANE_RATE_LIMIT", "1000000/s")
    with bench_database() as url:
        raw_rate, raw_lat = raw_baseline(url, args.events, args.threads)
        single_rate, single_lat = service_appends(args.events, args.threads, 1)
        batch_rate, batch_lat = service_appends(args.events * 5, args.threads, args.batch)
        tracing_rounds = tracing_off_and_on(args.events, rounds=args.tracing_rounds) if args.tracing_rounds else None
        off_hooks_us = tracing_off_hooks(20_000)
    print(f"append bench: {args.events} events, {args.threads} thread(s), same PostgreSQL server")
    print(f"  raw psycopg lock+insert+update: {raw_rate:9.0f} events/s  ({describe(raw_lat)})")
    print(f"  event_append (1 per txn):       {single_rate:9.0f} events/s  ({describe(single_lat)})"
          f"  ratio to raw {single_rate / raw_rate:.2f}")
    print(f"  event_append_batch ({args.batch}/txn):   {batch_rate:9.0f} events/s  ({describe(batch_lat)} per batch)"
          f"  ratio to raw {batch_rate / raw_rate:.2f}")
    hooks = f"  tracing off: the hooks left on an append's path cost {off_hooks_us:.2f} us of CPU per request"
    if tracing_rounds is None:
        print("  tracing off/on comparison: skipped (--tracing-rounds 0)")
        print(hooks)
    else:
        report_tracing("event_append in process", tracing_rounds.off, tracing_rounds.on, target=True)
        report_tracing("append request through Django", tracing_rounds.requests_off, tracing_rounds.requests_on,
                       target=False)
        print(f"{hooks} ({100 * off_hooks_us / (tracing_rounds.requests_off.cpu_ms * 1000):.2f} %"
              " of the request's CPU)")
    if args.json:
        def figures(rate: float, latencies: list[float]) -> dict[str, float]:
            return {"per_s": rate, "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}

        # With --tracing-rounds 0, "tracing" holds the rounds (0) and the off-path hooks only.
        tracing_figures: dict[str, object] = {"rounds": args.tracing_rounds, "off_hooks_us_per_request": off_hooks_us}
        if tracing_rounds is not None:
            tracing_figures.update({
                "off": tracing_rounds.off.as_json(), "on": tracing_rounds.on.as_json(),
                "cost": 1 - tracing_rounds.on.rate / tracing_rounds.off.rate,
                "requests_off": tracing_rounds.requests_off.as_json(),
                "requests_on": tracing_rounds.requests_on.as_json(),
                "requests_cost": 1 - tracing_rounds.requests_on.rate / tracing_rounds.requests_off.rate,
            })
        Path(args.json).write_text(json.dumps({
            "events": args.events, "threads": args.threads, "batch": args.batch,
            "raw": figures(raw_rate, raw_lat), "event_append": figures(single_rate, single_lat),
            "event_append_batch": figures(batch_rate, batch_lat),
            "ratio_single_to_raw": single_rate / raw_rate, "ratio_batch_to_raw": batch_rate / raw_rate,
            "tracing": tracing_figures,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
