"""Bulk actions as durable jobs: one action over a frozen list of tasks or dead letters.

1. Planning (the dry run, ``bulk_job_plan``) freezes the selection (a task-list filter, a
   dead-letter filter, or explicit ids) into ``BulkJobItem`` rows with one INSERT … SELECT,
   each saying what will happen to it, and hashes the ordered list. Nothing else is touched.
2. Starting names that hash (``bulk_job_start``): the job executes exactly the list that was
   shown, or the start is refused. Every decision (create, start, pause, resume, abort,
   finish) is a ``BulkJobDecision`` with who and why.
3. The executor (``bulk_job_step``) settles one chunk per transaction: the pending items it
   locks (SKIP LOCKED, index order), the action's writes, each item's result and the job's
   counters commit together. A worker killed at any moment leaves each item either settled
   with its effect or pending without it, so nothing is done twice and nothing is lost.
4. Running (``bulk_job_run``, called by the Celery task ``run_bulk_job``) claims the job with
   a lease on ``runner_until`` (a conditional UPDATE), steps for a bounded time at the job's
   rate and lets go; a killed runner's lease expires and the beat's ``resume-bulk-jobs``
   enqueues the job again.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.delivery.selectors import DeadLetterFilters, dead_letters_filtered
from backplane.eventlog import event_types as et
from backplane.eventlog.errors import AlreadyDecided, BackplaneError, InvalidInput, NotFound
from backplane.eventlog.forks import FAILURE_TYPES, failure_points, task_fork_in_transaction
from backplane.eventlog.models import CLOSED_STATUSES, Task, TaskStatus
from backplane.eventlog.selectors import filter_values_from_json, task_filters_from_json, tasks_filtered
from backplane.eventlog.writer import EventDraft, lock_tasks, write_events
from recovery.dead_letters import dead_letter_discard_in_transaction, dead_letter_requeue_in_transaction
from recovery.errors import JobConflict
from recovery.fleet import tasks_cancel_locked
from recovery.models import BulkAction, BulkItemStatus, BulkJob, BulkJobDecision, BulkJobItem, BulkJobStatus

logger = logging.getLogger(__name__)

TASK_ACTIONS = frozenset({BulkAction.CANCEL, BulkAction.RETRY, BulkAction.FORK_FROM_FAILURE})
DEAD_LETTER_ACTIONS = frozenset({BulkAction.DEAD_LETTER_REQUEUE, BulkAction.DEAD_LETTER_DISCARD})
# The options each action takes, with their types.
ACTION_OPTIONS: dict[str, dict[str, type]] = {
    BulkAction.CANCEL: {"compensate": bool},
    BulkAction.RETRY: {},
    BulkAction.FORK_FROM_FAILURE: {},
    BulkAction.DEAD_LETTER_REQUEUE: {},
    BulkAction.DEAD_LETTER_DISCARD: {"compensate": bool},
}
SAMPLE_SIZE = 20
MAX_CHUNK_SIZE = 1000
MAX_RATE_PER_SECOND = 100_000
# Forks made by a job get ids derived from the job and the source task: a fork is findable
# from its job, and the same item can never fork twice under two ids.
_FORK_NAMESPACE = uuid.UUID("0b5e1d2c-3a4f-4e6b-8c7d-9e0f1a2b3c4d")
_DEAD_LETTER_FILTER_KEYS = ("source", "topic", "kind", "error", "created_after", "created_before")


# --- planning: the dry run ------------------------------------------------------------------


def _require_reason(reason: str) -> str:
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("a reason is required", {"reason": "required"})
    return reason


def _checked_options(action: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    allowed = ACTION_OPTIONS[action]
    options = dict(options or {})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidInput(f"{action} takes no option {', '.join(unknown)}",
                           {"options": f"known: {', '.join(allowed) or 'none'}"})
    for name, kind in allowed.items():
        if name in options and not isinstance(options[name], kind):
            raise InvalidInput(f"options.{name} must be a {kind.__name__}", {f"options.{name}": kind.__name__})
    return options


def _dead_letter_filters_from_json(data: Any) -> DeadLetterFilters:
    values = filter_values_from_json(data, known=_DEAD_LETTER_FILTER_KEYS, times=("created_after", "created_before"))
    if values.get("source") and values["source"] not in DeadLetterSource.values:
        raise InvalidInput("filter.source is not a dead-letter source",
                           {"filter.source": ", ".join(DeadLetterSource.values)})
    return DeadLetterFilters(**values)


def _task_ids(raw: Any) -> list[uuid.UUID]:
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("ids must be a non-empty list", {"ids": "a list of task ids"})
    ids = []
    for value in raw:
        try:
            ids.append(uuid.UUID(str(value)))
        except ValueError:
            raise InvalidInput("ids must be task ids (UUIDs)", {"ids": f"not a UUID: {str(value)[:64]}"}) from None
    return list(dict.fromkeys(ids))


def _dead_letter_ids(raw: Any) -> list[int]:
    if not isinstance(raw, list) or not raw:
        raise InvalidInput("ids must be a non-empty list", {"ids": "a list of dead-letter ids"})
    if not all(isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63 for value in raw):
        raise InvalidInput("ids must be dead-letter ids (positive integers)", {"ids": "positive integers"})
    return list(dict.fromkeys(raw))


# What the dry run says will happen to each row, in SQL over the selected rows (``s``): the same
# rules the executor applies, so the plan and the results read alike.
_CLOSED_SQL = ", ".join(f"'{status}'" for status in sorted(CLOSED_STATUSES))
_PLANNED_SQL: dict[str, str] = {
    BulkAction.CANCEL: f"""CASE WHEN s.id IS NULL THEN 'skip: no such task'
        WHEN s.status IN ({_CLOSED_SQL}) THEN 'skip: already ' || s.status ELSE 'cancel' END""",
    BulkAction.RETRY: """CASE WHEN s.id IS NULL THEN 'skip: no such task'
        WHEN s.status = 'dead_lettered' THEN 'requeue its dead letter'
        WHEN s.status = 'failed' THEN 'retry'
        ELSE 'skip: ' || s.status || ', not failed' END""",
    BulkAction.FORK_FROM_FAILURE: f"""CASE WHEN s.id IS NULL THEN 'skip: no such task'
        WHEN s.sandbox THEN 'skip: a sandbox is replayed, not forked into production'
        WHEN NOT EXISTS (SELECT 1 FROM backplane_event e WHERE e.task_id = s.id
                          AND e.type IN ({", ".join(f"'{t}'" for t in FAILURE_TYPES)})) THEN 'skip: it never failed'
        ELSE 'fork from just before its last failure' END""",
    BulkAction.DEAD_LETTER_REQUEUE: """CASE WHEN s.id IS NULL THEN 'skip: no such dead letter'
        WHEN s.status <> 'pending' THEN 'skip: already ' || s.status ELSE 'requeue' END""",
    BulkAction.DEAD_LETTER_DISCARD: """CASE WHEN s.id IS NULL THEN 'skip: no such dead letter'
        WHEN s.status <> 'pending' THEN 'skip: already ' || s.status ELSE 'discard' END""",
}

_INSERT_ITEMS_SQL = """
INSERT INTO recovery_bulkjobitem (job_id, index, target, planned, status, detail)
SELECT %s, s.n - 1, s.target, {planned}, 'pending', ''
  FROM ({selected}) AS s
"""

_ITEMS_HASH_SQL = """
SELECT count(*), encode(sha256(convert_to(coalesce(string_agg(target, E'\\n' ORDER BY index), ''), 'UTF8')), 'hex')
  FROM recovery_bulkjobitem WHERE job_id = %s
"""


def _selected_sql(action: str, selection: Mapping[str, Any], *, limit: int) -> tuple[str, list[Any]]:
    """A query of (n, target, id, status, sandbox) for the selection, n counting from 1 in the
    order the job will go: the filter's oldest first, or the ids as given."""
    keys = set(selection)
    if keys not in ({"filter"}, {"ids"}):
        raise InvalidInput("selection is a filter or a list of ids", {"selection": "exactly one of filter, ids"})
    if action in TASK_ACTIONS:
        if "ids" in selection:
            ids = _task_ids(selection["ids"])
            return ("SELECT w.n, w.id::text AS target, t.id, t.status, t.sandbox"
                    "  FROM unnest(%s::uuid[]) WITH ORDINALITY AS w(id, n)"
                    "  LEFT JOIN backplane_task t ON t.id = w.id WHERE w.n <= %s", [ids, limit])
        tasks = tasks_filtered(task_filters_from_json(selection["filter"]))
        sql, params = tasks.order_by().values_list("id", "status", "sandbox", "created_at").query.sql_with_params()
        return (f"SELECT row_number() OVER (ORDER BY f.created_at, f.id) AS n, f.id::text AS target, f.id, f.status,"
                f" f.sandbox FROM ({sql}) AS f(id, status, sandbox, created_at) ORDER BY f.created_at, f.id LIMIT %s",
                [*params, limit])
    if "ids" in selection:
        dead_letter_ids = _dead_letter_ids(selection["ids"])
        return ("SELECT w.n, w.id::text AS target, d.id, d.status, false AS sandbox"
                "  FROM unnest(%s::bigint[]) WITH ORDINALITY AS w(id, n)"
                "  LEFT JOIN backplane_deadletter d ON d.id = w.id WHERE w.n <= %s", [dead_letter_ids, limit])
    # A filter selects what is still waiting for a decision: decided ones have nothing to do.
    items = dead_letters_filtered(_dead_letter_filters_from_json(selection["filter"])).filter(
        status=DeadLetterStatus.PENDING)
    sql, params = items.order_by().values_list("id", "status", "created_at").query.sql_with_params()
    return (f"SELECT row_number() OVER (ORDER BY f.created_at, f.id) AS n, f.id::text AS target, f.id, f.status,"
            f" false AS sandbox FROM ({sql}) AS f(id, status, created_at) ORDER BY f.created_at, f.id LIMIT %s",
            [*params, limit])


def _freeze_items(job: BulkJob, selected_sql: str, params: list[Any]) -> tuple[int, str]:
    """Insert the job's items from the selection in one statement; their count and hash."""
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_ITEMS_SQL.format(planned=_PLANNED_SQL[job.action], selected=selected_sql),
                       [job.pk, *params])
        cursor.execute(_ITEMS_HASH_SQL, [job.pk])
        total, digest = cursor.fetchone()
    return int(total), str(digest)


def selection_hash_of(targets: Sequence[str]) -> str:
    """The hash a job's frozen list has: SHA-256 of its targets in order, one a line."""
    return hashlib.sha256("\n".join(targets).encode()).hexdigest()


def bulk_job_plan(
    *,
    action: str,
    selection: Mapping[str, Any],
    reason: str,
    created_by: str,
    options: Mapping[str, Any] | None = None,
    rate_per_second: int = 200,
    chunk_size: int = 200,
    retry_of: BulkJob | None = None,
) -> BulkJob:
    """The dry run: a draft job whose items are the selection, frozen, each with what will
    happen to it. Bad input (an unknown action, no reason, an empty or over-large selection, a
    filter that matches nothing) is 400 and writes nothing."""
    if action not in BulkAction.values:
        raise InvalidInput("unknown action", {"action": f"one of {', '.join(BulkAction.values)}"})
    reason = _require_reason(reason)
    checked_options = _checked_options(action, options)
    if not isinstance(selection, Mapping):
        raise InvalidInput("selection is a filter or a list of ids", {"selection": "an object"})
    if not 0 <= rate_per_second <= MAX_RATE_PER_SECOND:
        raise InvalidInput("rate_per_second is out of range",
                           {"rate_per_second": f"0 (no limit) to {MAX_RATE_PER_SECOND}"})
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise InvalidInput("chunk_size is out of range", {"chunk_size": f"1 to {MAX_CHUNK_SIZE}"})
    most = settings.BACKPLANE_BULK_MAX_ITEMS
    selected_sql, params = _selected_sql(action, selection, limit=most + 1)
    with transaction.atomic(durable=True):
        now = timezone.now()
        job = BulkJob.objects.create(
            action=action, selection=dict(selection), options=checked_options, reason=reason, created_by=created_by,
            created_at=now, retry_of=retry_of, chunk_size=chunk_size, rate_per_second=rate_per_second,
        )
        total, digest = _freeze_items(job, selected_sql, params)
        # Raising rolls the job and its items back: a refused dry run leaves nothing behind.
        if total == 0:
            raise InvalidInput("the selection matches nothing", {"selection": "no tasks or dead letters match"})
        if total > most:
            raise InvalidInput(f"the selection has more than {most} items; narrow the filter",
                               {"selection": f"at most {most} items"})
        job.total = total
        job.selection_hash = digest
        job.save(update_fields=["total", "selection_hash"])
        BulkJobDecision.objects.create(job=job, action="create", decided_by=created_by, reason=reason, at=now)
    return job


# --- decisions on a job -------------------------------------------------------------------------


def _lock_job(job_id: int) -> BulkJob:
    job = BulkJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        raise NotFound("job not found", {"job_id": job_id})
    return job


def _require_status(job: BulkJob, wanted: set[str], doing: str) -> None:
    if job.status not in wanted:
        raise JobConflict(f"a {job.status} job cannot be {doing}",
                          {"status": job.status, "selection_hash": job.selection_hash})


# The wire name of the Celery task that runs a job (recovery/tasks.py declares it under this name);
# enqueued by name, so this module does not import the task module that imports it.
RUN_BULK_JOB = "recovery.tasks.run_bulk_job"


def _enqueue_runner(job_id: int) -> None:
    transaction.on_commit(lambda: current_app.signature(RUN_BULK_JOB, args=(job_id,)).delay())


def bulk_job_start(*, job_id: int, selection_hash: str, decided_by: str, reason: str = "") -> BulkJob:
    """Draft -> running, if ``selection_hash`` is the frozen list's (409 with the current hash
    otherwise, and for a job that is not a draft). The runner is enqueued on commit."""
    with transaction.atomic(durable=True):
        job = _lock_job(job_id)
        _require_status(job, {BulkJobStatus.DRAFT}, "started")
        if selection_hash != job.selection_hash:
            raise JobConflict("the selection hash is not this job's frozen list",
                              {"status": job.status, "selection_hash": job.selection_hash})
        now = timezone.now()
        job.status = BulkJobStatus.RUNNING
        job.started_at = now
        job.save(update_fields=["status", "started_at"])
        BulkJobDecision.objects.create(job=job, action="start", decided_by=decided_by, reason=reason.strip(), at=now)
        _enqueue_runner(job.pk)
    return job


def _decide(job_id: int, *, action: str, wanted: set[str], status: str, decided_by: str, reason: str) -> BulkJob:
    reason = _require_reason(reason)
    with transaction.atomic(durable=True):
        job = _lock_job(job_id)
        _require_status(job, wanted, {"pause": "paused", "resume": "resumed", "abort": "aborted"}[action])
        now = timezone.now()
        job.status = status
        fields = ["status"]
        if status == BulkJobStatus.ABORTED:
            job.finished_at = now
            fields.append("finished_at")
        job.save(update_fields=fields)
        BulkJobDecision.objects.create(job=job, action=action, decided_by=decided_by, reason=reason, at=now)
        if status == BulkJobStatus.RUNNING:
            _enqueue_runner(job.pk)
    return job


def bulk_job_pause(*, job_id: int, decided_by: str, reason: str) -> BulkJob:
    """Running -> paused: the chunk in flight finishes, no other starts."""
    return _decide(job_id, action="pause", wanted={BulkJobStatus.RUNNING}, status=BulkJobStatus.PAUSED,
                   decided_by=decided_by, reason=reason)


def bulk_job_resume(*, job_id: int, decided_by: str, reason: str) -> BulkJob:
    """Paused -> running, at the first pending item."""
    return _decide(job_id, action="resume", wanted={BulkJobStatus.PAUSED}, status=BulkJobStatus.RUNNING,
                   decided_by=decided_by, reason=reason)


def bulk_job_abort(*, job_id: int, decided_by: str, reason: str) -> BulkJob:
    """For good: the chunk in flight finishes, the pending items stay pending (not done)."""
    return _decide(job_id, action="abort",
                   wanted={BulkJobStatus.DRAFT, BulkJobStatus.RUNNING, BulkJobStatus.PAUSED},
                   status=BulkJobStatus.ABORTED, decided_by=decided_by, reason=reason)


def bulk_job_retry_failed(*, job_id: int, decided_by: str, reason: str) -> BulkJob:
    """A new draft job, ``retry_of`` this one, over its failed items in their order."""
    job = BulkJob.objects.filter(pk=job_id).first()
    if job is None:
        raise NotFound("job not found", {"job_id": job_id})
    targets = list(job.items.filter(status=BulkItemStatus.FAILED).order_by("index").values_list("target", flat=True))
    if not targets:
        raise InvalidInput("the job has no failed items", {"job_id": "nothing failed"})
    ids: list[Any] = [int(target) for target in targets] if job.action in DEAD_LETTER_ACTIONS else targets
    return bulk_job_plan(action=job.action, selection={"ids": ids}, reason=reason, created_by=decided_by,
                         options=job.options, rate_per_second=job.rate_per_second, chunk_size=job.chunk_size,
                         retry_of=job)


# --- the executor ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingItem:
    id: int
    index: int
    target: str


@dataclass(frozen=True)
class ItemResult:
    item_id: int
    status: str  # BulkItemStatus: done, skipped or failed
    detail: str


Apply = Callable[[BulkJob, Sequence[PendingItem], datetime], list[ItemResult]]


def _apply_cancel(job: BulkJob, items: Sequence[PendingItem], now: datetime) -> list[ItemResult]:
    by_id = {uuid.UUID(item.target): item for item in items}
    tasks = lock_tasks(list(by_id))
    found = {task.pk for task in tasks}
    results = [ItemResult(item.id, BulkItemStatus.SKIPPED, "no such task")
               for task_id, item in by_id.items() if task_id not in found]
    open_tasks = [task for task in tasks if not task.is_closed]
    results += [ItemResult(by_id[task.pk].id, BulkItemStatus.SKIPPED, f"already {task.status}")
                for task in tasks if task.is_closed]
    if open_tasks:
        tasks_cancel_locked(open_tasks, cancelled_by=job_actor(job), reason=job.reason,
                            compensate=bool(job.options.get("compensate")), now=now)
        results += [ItemResult(by_id[task.pk].id, BulkItemStatus.DONE, "cancelled") for task in open_tasks]
    return results


def _apply_retry(job: BulkJob, items: Sequence[PendingItem], now: datetime) -> list[ItemResult]:
    by_id = {uuid.UUID(item.target): item for item in items}
    statuses = dict(Task.objects.filter(pk__in=list(by_id)).values_list("pk", "status"))
    results: list[ItemResult] = []
    # A dead-lettered task goes back through its dead letter, as a reviewer's requeue does: the
    # decision locks the dead letter, then the task (the order the single decision keeps).
    dead_letters = dict(DeadLetter.objects.filter(task_id__in=[t for t, s in statuses.items()
                                                                if s == TaskStatus.DEAD_LETTERED],
                                                  source=DeadLetterSource.TASK, status=DeadLetterStatus.PENDING)
                        .values_list("task_id", "pk"))
    failed_ids: list[uuid.UUID] = []
    # Dead letters are requeued (and locked) in their id order, as the dead-letter jobs decide
    # them: two jobs over overlapping dead letters never deadlock.
    for task_id, item in sorted(by_id.items(), key=lambda pair: dead_letters.get(pair[0], 0)):
        status = statuses.get(task_id)
        if status is None:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, "no such task"))
        elif status == TaskStatus.DEAD_LETTERED and task_id in dead_letters:
            try:
                dead_letter_requeue_in_transaction(dead_letter_id=dead_letters[task_id], decided_by=job_actor(job),
                                                   reason=job.reason)
            except AlreadyDecided as exc:  # raised before it wrote anything
                results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, exc.message))
            else:
                results.append(ItemResult(item.id, BulkItemStatus.DONE, "dead letter requeued"))
        elif status == TaskStatus.FAILED:
            failed_ids.append(task_id)
        elif status == TaskStatus.DEAD_LETTERED:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, "dead-lettered, but its dead letter is decided"))
        else:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, f"{status}, not failed"))
    for task in lock_tasks(failed_ids):
        item = by_id[task.pk]
        if task.status != TaskStatus.FAILED:  # changed since it was read, before the lock
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, f"{task.status}, not failed"))
            continue
        # A failed task is closed: the backplane's own decision is written past that.
        write_events(task, [EventDraft(type=et.TASK_RETRIED, payload={
            "retried_by": job_actor(job), "reason": job.reason, "bulk_job_id": job.pk})],
            agent=job_actor(job), now=now, allow_closed=True)
        results.append(ItemResult(item.id, BulkItemStatus.DONE, "sent back to pending"))
    return results


def _apply_fork(job: BulkJob, items: Sequence[PendingItem], now: datetime) -> list[ItemResult]:
    by_id = {uuid.UUID(item.target): item for item in items}
    tasks = Task.objects.in_bulk(list(by_id))
    points = failure_points([task_id for task_id, task in tasks.items() if not task.sandbox])
    results: list[ItemResult] = []
    for task_id, item in by_id.items():
        task = tasks.get(task_id)
        if task is None:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, "no such task"))
        elif task.sandbox:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, "a sandbox is replayed, not forked"))
        elif task_id not in points:
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, "it never failed"))
        else:
            outcome = task_fork_in_transaction(
                namespace=None, source_task_id=task_id, at_seq=points[task_id], reason=job.reason,
                forked_by=job_actor(job), by_staff=True, task_id=uuid.uuid5(_FORK_NAMESPACE, f"{job.pk}:{task_id}"))
            results.append(ItemResult(item.id, BulkItemStatus.DONE,
                                      f"forked after seq {points[task_id]} as {outcome.task.pk}"))
    return results


def _apply_dead_letter_decision(job: BulkJob, items: Sequence[PendingItem], now: datetime) -> list[ItemResult]:
    results: list[ItemResult] = []
    # In dead-letter id order, as the retry's requeues: two jobs over overlapping dead letters
    # lock them in the same order and never deadlock.
    for item in sorted(items, key=lambda item: int(item.target)):
        try:
            if job.action == BulkAction.DEAD_LETTER_REQUEUE:
                decided = dead_letter_requeue_in_transaction(dead_letter_id=int(item.target),
                                                             decided_by=job_actor(job), reason=job.reason)
            else:
                decided = dead_letter_discard_in_transaction(
                    dead_letter_id=int(item.target), decided_by=job_actor(job), reason=job.reason,
                    compensate=bool(job.options.get("compensate")))
        except (AlreadyDecided, NotFound) as exc:  # raised before the decision wrote anything
            results.append(ItemResult(item.id, BulkItemStatus.SKIPPED, exc.message))
        else:
            results.append(ItemResult(item.id, BulkItemStatus.DONE, str(decided.status)))
    return results


_APPLY: dict[str, Apply] = {
    BulkAction.CANCEL: _apply_cancel,
    BulkAction.RETRY: _apply_retry,
    BulkAction.FORK_FROM_FAILURE: _apply_fork,
    BulkAction.DEAD_LETTER_REQUEUE: _apply_dead_letter_decision,
    BulkAction.DEAD_LETTER_DISCARD: _apply_dead_letter_decision,
}


def job_actor(job: BulkJob) -> str:
    """Who the job's writes name: the person who created it (their name is on every event)."""
    return job.created_by


def _settle(job: BulkJob, items: Sequence[PendingItem], now: datetime) -> list[ItemResult]:
    """Apply the action to ``items`` as one batch in a savepoint; if the batch raises, its
    writes roll back and the halves are tried, down to single items. A single item that
    raises is recorded failed with the error; the rest of the chunk goes on."""
    try:
        with transaction.atomic():
            return _APPLY[job.action](job, items, now)
    except Exception as exc:  # noqa: BLE001 - any error is recorded on its item, never lost
        if len(items) == 1:
            message = exc.message if isinstance(exc, BackplaneError) else f"{type(exc).__name__}: {exc}"
            logger.warning("bulk job %s: item %s (%s) failed: %s", job.pk, items[0].index, items[0].target, message)
            return [ItemResult(items[0].id, BulkItemStatus.FAILED, message[:2000])]
        half = len(items) // 2
        return _settle(job, items[:half], now) + _settle(job, items[half:], now)


_LOCK_PENDING_SQL = """
SELECT id, index, target FROM recovery_bulkjobitem
 WHERE job_id = %s AND status = 'pending'
 ORDER BY index LIMIT %s
   FOR UPDATE SKIP LOCKED
"""

_RECORD_RESULTS_SQL = """
UPDATE recovery_bulkjobitem AS i SET status = r.status, detail = r.detail, finished_at = %s
  FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS r(id, status, detail)
 WHERE i.id = r.id
"""


def chunk_size_of(job: BulkJob) -> int:
    """A chunk is never more than a second's worth of the job's rate (0: no limit)."""
    return min(job.chunk_size, job.rate_per_second) if job.rate_per_second else job.chunk_size


def bulk_job_step(job_id: int) -> int:
    """Settle one chunk of a running job in one transaction; how many items it settled (0:
    the job is not running, or has nothing left, in which case it is finished here).

    A pause or abort committed before this transaction's read is seen here, so a job stops
    within the chunk in flight."""
    with transaction.atomic(durable=True):
        job = BulkJob.objects.filter(pk=job_id).first()
        if job is None or job.status != BulkJobStatus.RUNNING:
            return 0
        with connection.cursor() as cursor:
            # SKIP LOCKED: two runners of one job (a lease that ran out under a slow chunk) take
            # different items; the status in the WHERE makes a settled item never taken again.
            cursor.execute(_LOCK_PENDING_SQL, [job.pk, chunk_size_of(job)])
            items = [PendingItem(*row) for row in cursor.fetchall()]
        now = timezone.now()
        if not items:
            _finish_if_done(job, now)
            return 0
        results = _settle(job, items, now)
        with connection.cursor() as cursor:
            cursor.execute(_RECORD_RESULTS_SQL, [now, [r.item_id for r in results], [r.status for r in results],
                                                 [r.detail for r in results]])
        tally = {status: sum(1 for r in results if r.status == status) for status in BulkItemStatus.values}
        BulkJob.objects.filter(pk=job.pk).update(done=F("done") + tally[BulkItemStatus.DONE],
                                                 skipped=F("skipped") + tally[BulkItemStatus.SKIPPED],
                                                 failed=F("failed") + tally[BulkItemStatus.FAILED])
    return len(items)


def _finish_if_done(job: BulkJob, now: datetime) -> None:
    # Another runner may hold the last items (locked, still pending): only when none is pending
    # at all is the job finished, and the conditional UPDATE finishes it once.
    if BulkJobItem.objects.filter(job=job, status=BulkItemStatus.PENDING).exists():
        return
    if BulkJob.objects.filter(pk=job.pk, status=BulkJobStatus.RUNNING).update(status=BulkJobStatus.FINISHED,
                                                                               finished_at=now):
        BulkJobDecision.objects.create(job=job, action="finish", decided_by="backplane", at=now,
                                       reason="every item settled")


# --- running: a lease, chunks at the job's rate ------------------------------------------------


def bulk_job_claim_runner(job_id: int, *, now: datetime | None = None) -> datetime | None:
    """Take the job's runner lease if it is running and nobody holds it (or the holder's lease
    ran out: a killed worker). Returns the lease's end, which is also the holder's token."""
    now = now or timezone.now()
    until = now + timedelta(seconds=settings.BACKPLANE_BULK_LEASE_SECONDS)
    # A conditional UPDATE, its row count checked: of two workers that race here, one wins.
    claimed = BulkJob.objects.filter(pk=job_id, status=BulkJobStatus.RUNNING).filter(
        runner_until__isnull=True).update(runner_until=until) or BulkJob.objects.filter(
        pk=job_id, status=BulkJobStatus.RUNNING, runner_until__lt=now).update(runner_until=until)
    return until if claimed else None


def bulk_job_release_runner(job_id: int, *, until: datetime) -> None:
    # Only our own lease: a runner whose lease ran out and was taken over lets the new one be.
    BulkJob.objects.filter(pk=job_id, runner_until=until).update(runner_until=None)


def bulk_job_run(job_id: int, *, seconds: float | None = None) -> bool:
    """Run a job's chunks for at most ``seconds`` (the setting by default) at its rate, under
    its runner lease; whether it has work left (the caller enqueues it again)."""
    until = bulk_job_claim_runner(job_id)
    if until is None:
        return False
    budget = settings.BACKPLANE_BULK_RUN_SECONDS if seconds is None else seconds
    started = time.monotonic()
    deadline = started + budget
    settled = 0
    more = True
    try:
        while time.monotonic() < deadline:
            rate = BulkJob.objects.filter(pk=job_id).values_list("rate_per_second", flat=True).first() or 0
            count = bulk_job_step(job_id)
            if not count:
                more = False
                break
            settled += count
            if rate:
                # The rate limit: the next chunk starts no sooner than the items so far allow.
                wait = started + settled / rate - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
    finally:
        bulk_job_release_runner(job_id, until=until)
    return more


def bulk_jobs_unattended(*, now: datetime | None = None) -> list[int]:
    """Running jobs that no runner holds (never taken, or their runner's lease ran out)."""
    now = now or timezone.now()
    return list(BulkJob.objects.filter(status=BulkJobStatus.RUNNING).exclude(runner_until__gte=now)
                .order_by("pk").values_list("pk", flat=True)[:100])
