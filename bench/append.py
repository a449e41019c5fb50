"""In-process append rate of the event log, beside a raw psycopg baseline on the same server.

    .venv/bin/python bench/append.py [--events 3000] [--threads 1]

Baseline ("raw"): the least any append must do in PostgreSQL — one transaction that
locks a row, inserts a JSONB row and updates the locked row — written with psycopg
directly, no Django, no hashing. The ratio says what the append path (checks,
canonical JSON, SHA-256, the ORM) costs on top of the database's own work.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
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


def service_appends(events: int, threads: int, batch: int) -> tuple[float, list[float]]:
    from django.db import connection

    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    tasks = [
        services.task_create(namespace="bench", kind="bench", input={}, agent="bench").task for _ in range(threads)
    ]
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(index: int, count: int) -> None:
        local = []
        task = tasks[index]
        for n in range(0, count, batch):
            drafts = [
                EventDraft(type="ReasoningStepCompleted", payload={"step": n + i, "thought": "bench"})
                for i in range(batch)
            ]
            started = time.perf_counter()
            services.event_append_batch(namespace="bench", task_id=task.pk, drafts=drafts, agent="bench")
            local.append((time.perf_counter() - started) * 1000)
        connection.close()
        with lock:
            latencies.extend(local)

    return run_threads(worker, events, threads), latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON (bench/http_bench.py reads it)")
    args = parser.parse_args()

    with bench_database() as url:
        raw_rate, raw_lat = raw_baseline(url, args.events, args.threads)
        single_rate, single_lat = service_appends(args.events, args.threads, 1)
        batch_rate, batch_lat = service_appends(args.events * 5, args.threads, args.batch)
    print(f"append bench: {args.events} events, {args.threads} thread(s), same PostgreSQL server")
    print(f"  raw psycopg lock+insert+update: {raw_rate:9.0f} events/s  ({describe(raw_lat)})")
    print(f"  event_append (1 per txn):       {single_rate:9.0f} events/s  ({describe(single_lat)})"
          f"  ratio to raw {single_rate / raw_rate:.2f}")
    print(f"  event_append_batch ({args.batch}/txn):   {batch_rate:9.0f} events/s  ({describe(batch_lat)} per batch)"
          f"  ratio to raw {batch_rate / raw_rate:.2f}")
    if args.json:
        def figures(rate: float, latencies: list[float]) -> dict[str, float]:
            return {"per_s": rate, "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}

        Path(args.json).write_text(json.dumps({
            "events": args.events, "threads": args.threads, "batch": args.batch,
            "raw": figures(raw_rate, raw_lat), "event_append": figures(single_rate, single_lat),
            "event_append_batch": figures(batch_rate, batch_lat),
            "ratio_single_to_raw": single_rate / raw_rate, "ratio_batch_to_raw": batch_rate / raw_rate,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
