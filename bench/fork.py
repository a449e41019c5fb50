"""Forking and diffing long histories, beside a plain copy of the same rows on the same server.

    .venv/bin/python bench/fork.py [--events 10000] [--rounds 15] [--out var/bench]

1. A task with ``--events`` events (its own agent appending in batches).
2. Fork it at its last seq (``task_fork``: the provenance events only; the history stays in the
   source) against the floor a copying design could not go below: one plain
   ``INSERT … SELECT`` of the same rows into a table shaped and indexed like the events table,
   in the same run, alternating rounds. Target: fork ≤ 3 × the copy.
3. What the fork's history costs where it is read instead: the fork's recovery context (every
   inherited event read through the source) beside the source's own, and the first dispatch of a
   step the source recorded (answered from the record, a search of the inherited range).
4. The diff of two ``--events``-event histories (``tasks_diff``): the source against a second task
   whose log differs in one field in the middle. Target: ≤ 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from _support import bench_database

BATCH = 1000


def build_task(namespace: str, events: int, *, changed_at: int | None = None) -> uuid.UUID:
    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    task = services.task_create(namespace=namespace, kind="bench", input={"lead": 7}, agent="bench").task
    # The second step dispatches a tool, and its answer is recorded, so a fork's dispatch of that
    # step is answered from the record (tool calls go through the proxy, as agents make them).
    from recovery.tool_calls import tool_call_dispatch, tool_call_record_result

    call = tool_call_dispatch(namespace=namespace, task_id=task.pk, step=1, tool="crm-lookup", input={"lead": 7},
                              agent="bench", lease_epoch=None).call
    tool_call_record_result(namespace=namespace, key=call.pk, status="succeeded", result={"employees": 40},
                            agent="bench", lease_epoch=None)
    last_step = events - 2  # TaskStarted and the tool call's two events come first
    for first in range(2, last_step + 1, BATCH):
        steps = range(first, min(first + BATCH, last_step + 1))
        drafts = [EventDraft(type="ReasoningStepCompleted",
                             payload={"step": n, "thought": "changed" if n == changed_at else f"thought {n}"})
                  for n in steps]
        services.event_append_batch(namespace=namespace, task_id=task.pk, drafts=drafts, agent="bench")
    return task.pk


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="var/bench")
    args = parser.parse_args()

    with bench_database():
        from django.db import connection

        from backplane.eventlog import forks, lineage
        from backplane.eventlog.models import Task
        from recovery.selectors import recovery_context
        from recovery.tool_calls import tool_call_dispatch

        source = build_task("bench", args.events)
        other = build_task("bench", args.events, changed_at=args.events // 2)
        head = Task.objects.get(pk=source).last_seq
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE copy_event (LIKE backplane_event INCLUDING DEFAULTS INCLUDING INDEXES)")
            cursor.execute("VACUUM ANALYZE backplane_event")

        def copy() -> None:
            with connection.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("INSERT INTO copy_event SELECT * FROM backplane_event WHERE task_id = %s AND seq <= %s",
                               [source, head])
                cursor.execute("COMMIT")
                cursor.execute("TRUNCATE copy_event")

        fork_ids: list[uuid.UUID] = []

        def fork() -> None:
            fork_ids.append(forks.task_fork(namespace="bench", source_task_id=source, at_seq=head, reason="bench",
                                            forked_by="bench", by_staff=False).task.pk)

        copy_ms, fork_ms = [], []
        for _ in range(args.rounds):  # alternating, so both see the same machine
            copy_ms.append(timed(copy))
            fork_ms.append(timed(fork))

        first = fork_ids[0]
        context_source_ms, context_fork_ms = [], []
        for _ in range(5):  # alternating, as above
            context_source_ms.append(timed(lambda: recovery_context(namespace="bench", task_id=source)))
            context_fork_ms.append(timed(lambda: recovery_context(namespace="bench", task_id=first)))
        answered = [timed(lambda fork_id=fork_id: tool_call_dispatch(
            namespace="bench", task_id=fork_id, step=1, tool="crm-lookup", input={"lead": 7}, agent="bench",
            lease_epoch=None)) for fork_id in fork_ids[1:6]]
        diff_ms = []
        drift: dict[str, Any] = {}
        for _ in range(3):
            started = time.perf_counter()
            drift = lineage.tasks_diff(namespace="bench", a_id=source, b_id=other)
            diff_ms.append((time.perf_counter() - started) * 1000)

    result = {
        "events": head,
        "copy_ms": statistics.median(copy_ms),
        "fork_ms": statistics.median(fork_ms),
        "fork_over_copy": statistics.median(fork_ms) / statistics.median(copy_ms),
        "recovery_context_source_ms": statistics.median(context_source_ms),
        "recovery_context_fork_ms": statistics.median(context_fork_ms),
        "answered_from_record_ms": statistics.median(answered),
        "diff_ms": statistics.median(diff_ms),
        "diff_counts": drift["counts"],
        "diff_first_path": (drift["first_divergence"] or {}).get("path"),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fork.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"history of {head} events, medians of {args.rounds} alternating rounds")
    print(f"  fork at seq {head}:                  {result['fork_ms']:8.2f} ms")
    print(f"  INSERT … SELECT of the same rows:    {result['copy_ms']:8.2f} ms"
          f"   fork / copy = {result['fork_over_copy']:.2f} (target ≤ 3)")
    print(f"  recovery context, source / fork:     {result['recovery_context_source_ms']:8.2f} / "
          f"{result['recovery_context_fork_ms']:.2f} ms")
    print(f"  a recorded step, answered to a fork: {result['answered_from_record_ms']:8.2f} ms")
    print(f"  diff of two {head}-event histories: {result['diff_ms']:8.2f} ms (target ≤ 1000); "
          f"counts {result['diff_counts']}, first at {result['diff_first_path']}")


if __name__ == "__main__":
    main()
