"""The crash report: what a demo run did, checked against the log, the ledger and the chains.

Built from the database after the run (``build_report``), so it judges the product by what it
stored, not by what the agents believe they did:

- **tasks**: every lead-qualification task of the run and its sub-agent tasks by final status;
  *lost* is a task that is neither finished nor waiting for a person (a pending dead letter):
  it must be 0;
- **crashes** per failure zone (the agents report each one just before their SIGKILL) and
  **recoveries**: the time from a crash to the task's next ``TaskClaimed`` (resumed work);
- **side effects**: every tool call the backplane recorded as succeeded against the tools'
  ledger (exactly one effect each), and every ledger subject (task and step) acted on once;
- **duplicates prevented**: answers the proxy gave instead of the tool, and repeats the tools
  answered from their own idempotency record;
- **integrity**: every chain recomputed (docs/api.md's hash rule) and every task row compared with
  the replay of its log.

``write_html`` draws it with Plotly (inlined: the file opens offline).
"""

from __future__ import annotations

import html
import json
import statistics
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.eventlog import event_types as et
from backplane.eventlog.models import CLOSED_STATUSES, Event, Task, TaskStatus
from backplane.eventlog.projections import projection_check
from backplane.integrity.verification import chain_check
from demo.models import LedgerEntry, Observation, ObservationKind
from recovery.models import ToolCall, ToolCallStatus

FINISHED = CLOSED_STATUSES


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(ordered[index], 3)


def tasks_of_run(root_ids: Iterable[str]) -> tuple[list[Task], list[Task]]:
    roots = list(Task.objects.filter(pk__in=[uuid.UUID(str(i)) for i in root_ids]))
    children = list(Task.objects.filter(parent_id__in=[t.pk for t in roots]))
    return roots, children


def awaiting_review(task_ids: Iterable[uuid.UUID]) -> set[uuid.UUID]:
    """Compensating tasks whose saga waits on a failed compensation: a person decides."""
    return set(DeadLetter.objects.filter(task_id__in=list(task_ids), status=DeadLetterStatus.PENDING,
                                         source=DeadLetterSource.COMPENSATION)
               .values_list("task_id", flat=True))


def settled(task: Task, waiting: set[uuid.UUID]) -> bool:
    """Finished (closed to writes), or compensating and stopped at a failed compensation that
    waits for a person. Anything else is still being worked on, or lost."""
    return task.status in FINISHED or (task.status == TaskStatus.COMPENSATING and task.pk in waiting)


def unsettled(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """``settled``, negated, in SQL: the tasks of ``tasks`` still open (by the status index)."""
    waiting = DeadLetter.objects.filter(status=DeadLetterStatus.PENDING, source=DeadLetterSource.COMPENSATION,
                                        task_id=OuterRef("pk"))
    return tasks.exclude(status__in=FINISHED).exclude(Q(status=TaskStatus.COMPENSATING) & Exists(waiting))


def _status_counts(tasks: Sequence[Task], waiting: set[uuid.UUID]) -> dict[str, int]:
    counts = Counter(str(t.status) for t in tasks)
    lost = [t for t in tasks if not settled(t, waiting)]
    return {**{s: counts.get(s, 0) for s in TaskStatus.values}, "total": len(tasks),
            "awaiting_review": sum(1 for t in tasks if t.status == TaskStatus.DEAD_LETTERED or (
                t.status == TaskStatus.COMPENSATING and t.pk in waiting)),
            "lost": len(lost)}


def _recoveries(crashes: list[Observation]) -> list[dict[str, Any]]:
    """For each crash, the next claim of its task (the stall detector freed it, an agent took it)."""
    claims: dict[uuid.UUID, list[datetime]] = defaultdict(list)
    for task_id, recorded_at in (Event.objects.filter(task_id__in={c.task_id for c in crashes},
                                                      type=et.TASK_CLAIMED)
                                 .order_by("recorded_at").values_list("task_id", "recorded_at")):
        claims[task_id].append(recorded_at)
    out = []
    for crash in crashes:
        resumed = next((at for at in claims.get(crash.task_id, []) if at > crash.at), None)
        out.append({"task_id": str(crash.task_id), "zone": crash.zone, "crashed_at": crash.at.isoformat(),
                    "resumed_at": resumed.isoformat() if resumed else None,
                    "seconds": round((resumed - crash.at).total_seconds(), 3) if resumed else None})
    return out


def _side_effects(task_ids: set[uuid.UUID]) -> dict[str, Any]:
    calls = list(ToolCall.objects.filter(task_id__in=task_ids).values("idempotency_key", "tool", "status",
                                                                     "compensation_of"))
    ledger = list(LedgerEntry.objects.filter(task_id__in=task_ids).values("tool", "idempotency_key", "subject",
                                                                         "status_code", "replays"))
    effects_by_key = Counter((row["tool"], row["idempotency_key"]) for row in ledger)
    effects_by_subject = Counter((row["tool"], row["subject"]) for row in ledger)
    succeeded = [c for c in calls if c["status"] == ToolCallStatus.SUCCEEDED]
    per_call = Counter(effects_by_key.get((c["tool"], c["idempotency_key"]), 0) for c in succeeded)
    recorded_keys = {(c["tool"], c["idempotency_key"]) for c in calls}
    by_tool: dict[str, dict[str, int]] = defaultdict(lambda: {"calls_succeeded": 0, "effects": 0, "replays": 0})
    for c in succeeded:
        by_tool[c["tool"]]["calls_succeeded"] += 1
    for row in ledger:
        by_tool[row["tool"]]["effects"] += 1
        by_tool[row["tool"]]["replays"] += row["replays"]
    return {
        "tool_calls_recorded": len(calls),
        "tool_calls_succeeded": len(succeeded),
        "compensations_succeeded": sum(1 for c in succeeded if c["compensation_of"]),
        "ledger_effects": len(ledger),
        # How many effects each succeeded call had: the only right answer is {"1": all of them}.
        "effects_per_succeeded_call": {str(k): v for k, v in sorted(per_call.items())},
        "duplicate_effects": sum(n - 1 for n in effects_by_subject.values() if n > 1),
        "succeeded_calls_without_effect": per_call.get(0, 0),
        "effects_without_recorded_call": sum(1 for key in effects_by_key if key not in recorded_keys),
        "tool_replays": sum(row["replays"] for row in ledger),
        "by_tool": dict(sorted(by_tool.items())),
    }


def build_report(*, root_ids: Sequence[str], started_at: datetime, finished_at: datetime,
                 config: dict[str, Any], agent_restarts: int) -> dict[str, Any]:
    roots, children = tasks_of_run(root_ids)
    everything = roots + children
    # A task the run created that is no longer in the database was pruned (retention is off
    # for batches) or deleted: either way it cannot be checked, and that is a failure.
    missing = len(set(root_ids)) - len(roots)
    ids = {t.pk for t in everything}
    waiting = awaiting_review(ids)
    observations = list(Observation.objects.filter(task_id__in=ids).order_by("at"))
    crashes = [o for o in observations if o.kind == ObservationKind.CRASH]
    recoveries = _recoveries(crashes)
    seconds = [r["seconds"] for r in recoveries if r["seconds"] is not None]
    kinds = Counter(o.kind for o in observations)

    chains_valid, broken = 0, []
    for task in everything:
        result = chain_check(task=task)
        if result.valid:
            chains_valid += 1
        else:
            broken.append({"task_id": str(task.pk), "first_invalid_seq": result.first_invalid_seq})
    drift = [str(d.task_id) for d in projection_check(task_ids=sorted(ids))]

    dead_letters = Counter((str(d.source), str(d.status)) for d in DeadLetter.objects.filter(task_id__in=ids))
    elapsed = (finished_at - started_at).total_seconds()
    effects = _side_effects(ids)
    events = Event.objects.filter(task_id__in=ids).count()
    root_counts = _status_counts(roots, waiting)
    report = {
        "config": config,
        "started_at": started_at.isoformat(),
        "finished_at": finished_at.isoformat(),
        "elapsed_seconds": round(elapsed, 1),
        "tasks": {**root_counts, "missing": missing},
        "subtasks": _status_counts(children, waiting),
        "tasks_per_second": round(len(roots) / elapsed, 2) if elapsed > 0 else None,
        "events": events,
        "crashes": {"total": len(crashes),
                    "by_zone": {f"zone{z}": sum(1 for c in crashes if c.zone == z) for z in (1, 2, 3, 4)},
                    "agent_restarts": agent_restarts},
        "recoveries": {"total": len(seconds), "crashes_not_resumed": len(recoveries) - len(seconds),
                       "p50_seconds": percentile(seconds, 0.5), "p99_seconds": percentile(seconds, 0.99),
                       "max_seconds": max(seconds) if seconds else None,
                       "mean_seconds": round(statistics.fmean(seconds), 3) if seconds else None},
        "side_effects": effects,
        "duplicates_prevented": {"by_proxy": kinds.get(ObservationKind.PROXY_REPLAY, 0),
                                 "by_tool_idempotency_key": effects["tool_replays"]},
        "transient_tool_failures_retried": kinds.get(ObservationKind.TOOL_RETRY, 0),
        "circuit_open_waits": kinds.get(ObservationKind.BREAKER_WAIT, 0),
        "dead_letters": {f"{source}/{status}": n for (source, status), n in sorted(dead_letters.items())},
        "chains": {"verified": len(everything), "valid": chains_valid, "broken": broken},
        "projections": {"checked": len(everything), "differ_from_replay": drift},
        "recovery_samples": recoveries,
    }
    report["problems"] = problems(report)
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What makes the run a failure (the command exits non-zero when this is not empty)."""
    found = []
    effects = report["side_effects"]
    if effects["duplicate_effects"]:
        found.append(f"{effects['duplicate_effects']} duplicate side effect(s)")
    if effects["succeeded_calls_without_effect"]:
        found.append(f"{effects['succeeded_calls_without_effect']} succeeded tool call(s) with no effect in the ledger")
    if effects["effects_without_recorded_call"]:
        found.append(f"{effects['effects_without_recorded_call']} effect(s) the backplane has no record of")
    if report["tasks"].get("missing"):
        found.append(f"{report['tasks']['missing']} task(s) of the run are no longer in the database")
    for scope in ("tasks", "subtasks"):
        if report[scope]["lost"]:
            if report["config"].get("timed_out"):
                # Stopped at the timeout: open tasks are unfinished, not proven lost.
                found.append(f"timed out with {report[scope]['lost']} {scope} unfinished")
            else:
                found.append(f"{report[scope]['lost']} lost {scope}")
    if report["chains"]["broken"]:
        found.append(f"{len(report['chains']['broken'])} broken chain(s)")
    if report["projections"]["differ_from_replay"]:
        found.append(f"{len(report['projections']['differ_from_replay'])} task row(s) differ from their log")
    return found


def summary_lines(report: dict[str, Any]) -> list[str]:
    t, r, c, e = report["tasks"], report["recoveries"], report["crashes"], report["side_effects"]
    return [
        f"tasks: {t['total']} in {report['elapsed_seconds']} s ({report['tasks_per_second']}/s): "
        f"{t['completed']} completed, {t['compensated']} compensated, {t['failed']} failed, "
        f"{t['dead_lettered']} dead-lettered, {t['awaiting_review']} awaiting review, {t['lost']} lost",
        f"sub-agent tasks: {report['subtasks']['total']}, {report['subtasks']['lost']} lost",
        f"crashes: {c['total']} ({', '.join(f'{z} {n}' for z, n in c['by_zone'].items())}); "
        f"agent processes restarted {c['agent_restarts']} times",
        f"recoveries: {r['total']}, time from crash to resumed work p50 {r['p50_seconds']} s, "
        f"p99 {r['p99_seconds']} s, max {r['max_seconds']} s",
        f"side effects: {e['tool_calls_succeeded']} succeeded tool calls, "
        + ("each with exactly one effect in the ledger" if e["effects_per_succeeded_call"] == {
            "1": e["tool_calls_succeeded"]} else f"effects per call {e['effects_per_succeeded_call']}")
        + f"; duplicate effects {e['duplicate_effects']}",
        f"duplicates prevented: {report['duplicates_prevented']['by_proxy']} by the proxy, "
        f"{report['duplicates_prevented']['by_tool_idempotency_key']} by the tools' idempotency keys",
        f"chains: {report['chains']['valid']}/{report['chains']['verified']} valid; projections differing from "
        f"replay: {len(report['projections']['differ_from_replay'])}",
        "verdict: " + ("OK" if not report["problems"] else "FAILED: " + "; ".join(report["problems"])),
    ]


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def write_html(report: dict[str, Any], path: Path) -> None:
    """Recoveries over time, the time-to-recover histogram and crashes per zone, in one page."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    samples = [s for s in report["recovery_samples"] if s["seconds"] is not None]
    figure = make_subplots(rows=3, cols=1, vertical_spacing=0.09, subplot_titles=(
        "Recoveries over the run: seconds from crash to resumed work", "Time to recover",
        "Crashes injected per failure zone"))
    for zone in (1, 2, 3, 4):
        points = [s for s in samples if s["zone"] == zone]
        figure.add_trace(go.Scatter(x=[s["crashed_at"] for s in points], y=[s["seconds"] for s in points],
                                    mode="markers", name=f"zone {zone}"), row=1, col=1)
    figure.add_trace(go.Histogram(x=[s["seconds"] for s in samples], nbinsx=40, name="recoveries",
                                  showlegend=False), row=2, col=1)
    zones = report["crashes"]["by_zone"]
    figure.add_trace(go.Bar(x=list(zones), y=list(zones.values()), name="crashes", showlegend=False), row=3, col=1)
    figure.update_yaxes(title_text="seconds", row=1, col=1)
    figure.update_xaxes(title_text="seconds", row=2, col=1)
    figure.update_yaxes(title_text="recoveries", row=2, col=1)
    figure.update_layout(height=1100)
    body = figure.to_html(full_html=False, include_plotlyjs=True)
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary_lines(report))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>Agent Backplane crash report</title>"
                    f"</head><body style='font-family:sans-serif'><h1>Crash report</h1><ul>{lines}</ul>"
                    f"{body}</body></html>")

