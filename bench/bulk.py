"""A bulk cancel job over many tasks, beside a plain SQL UPDATE of as many rows, same run.

    .venv/bin/python bench/bulk.py [--tasks 100000] [--chunk-size 500] [--out var/bench]

1. Plant 2 × ``--tasks`` pending tasks, each with its ``TaskStarted`` (one ``INSERT … SELECT``
   each for the rows and the events; hashes are random, the chains do not verify, and nothing
   here reads them).
2. The job: a dry run over the first half (``bulk_job_plan``, a task-list filter on their
   kind), started, then ``bulk_job_step`` called in this process until it has nothing left, the
   rate unlimited. Each item writes a ``TaskCancelled`` through the writer (event, projection,
   lifecycle message) and its result row, a chunk per transaction.
3. The floor: ``UPDATE backplane_task SET status = 'cancelled' WHERE id = ANY(%s)`` over the
   other half (fresh rows, the same count), one statement. Target: the job's items per second
   ≥ 0.2 × the UPDATE's rows per second (the rest is the events every item writes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _support import bench_database

PLANT_TASKS_SQL = """
INSERT INTO backplane_task (id, namespace, kind, status, input, metadata, attempts, max_attempts, lease_epoch,
                            lease_seconds, last_seq, head_hash, lamport, created_by, created_at, updated_at,
                            last_event_at, sandbox)
SELECT gen_random_uuid(), 'bench', %s, 'pending', '{"lead": 7}', '{}', 0, 3, 0, 30, 1,
       encode(sha256(g::text::bytea), 'hex'), 1, 'bench', now(), now(), now(), false
  FROM generate_series(1, %s) g
"""
PLANT_EVENTS_SQL = """
INSERT INTO backplane_event (task_id, seq, type, payload, agent, lamport, recorded_at, prev_hash, hash)
SELECT id, 1, 'TaskStarted', '{"input": {"lead": 7}}', 'bench', 1, now(), repeat('0', 64), head_hash
  FROM backplane_task WHERE kind = %s
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--chunk-size", type=int, default=500)
    parser.add_argument("--out", default="var/bench")
    args = parser.parse_args()

    with bench_database():
        from django.db import connection

        from recovery import bulk
        from recovery.models import BulkJob

        with connection.cursor() as cursor:
            for kind in ("bench-job", "bench-sql"):
                cursor.execute(PLANT_TASKS_SQL, [kind, args.tasks])
                cursor.execute(PLANT_EVENTS_SQL, [kind])
            cursor.execute("VACUUM ANALYZE backplane_task")
            cursor.execute("VACUUM ANALYZE backplane_event")
            cursor.execute("SELECT array_agg(id) FROM backplane_task WHERE kind = 'bench-sql'")
            sql_ids = cursor.fetchone()[0]

        started = time.perf_counter()
        job = bulk.bulk_job_plan(action="cancel", selection={"filter": {"kind": "bench-job"}}, reason="bench",
                                 created_by="bench", rate_per_second=0, chunk_size=args.chunk_size)
        plan_s = time.perf_counter() - started
        bulk.bulk_job_start(job_id=job.pk, selection_hash=job.selection_hash, decided_by="bench")
        started = time.perf_counter()
        while bulk.bulk_job_step(job.pk):
            pass
        job_s = time.perf_counter() - started
        job = BulkJob.objects.get(pk=job.pk)
        assert (job.status, job.done) == ("finished", args.tasks), (job.status, job.done)

        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("UPDATE backplane_task SET status = 'cancelled' WHERE id = ANY(%s)", [sql_ids])
            updated = cursor.rowcount
            cursor.execute("COMMIT")
        sql_s = time.perf_counter() - started
        assert updated == args.tasks

    result = {
        "tasks": args.tasks,
        "chunk_size": args.chunk_size,
        "plan_s": plan_s,
        "job_s": job_s,
        "job_items_per_s": args.tasks / job_s,
        "sql_s": sql_s,
        "sql_rows_per_s": args.tasks / sql_s,
        "job_over_sql": (args.tasks / job_s) / (args.tasks / sql_s),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bulk.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.tasks} tasks, chunks of {args.chunk_size}, rate unlimited")
    print(f"  dry run (frozen list of {args.tasks}):     {plan_s:8.2f} s")
    print(f"  bulk cancel job:                      {result['job_items_per_s']:10.0f} items/s ({job_s:.1f} s)")
    print(f"  UPDATE … WHERE id = ANY(…) of as many: {result['sql_rows_per_s']:10.0f} rows/s ({sql_s:.2f} s)")
    print(f"  job / UPDATE = {result['job_over_sql']:.3f} (target ≥ 0.2)")


if __name__ == "__main__":
    main()
