"""Retention: finished tasks leave the database after a while, whole, and only once exported.

A ``RetentionRule`` says how long a namespace (or one kind in it) keeps its finished tasks.
``retention_prune_batch`` finds tasks past their rule's time and has the database delete each
one with ``backplane_prune_task`` (recovery migration 0006), which runs as the owner of the
tables because the application's role may not delete events. That function decides, under the
task's row lock, whether the task may go (every event sealed and exported to the audit
destination, no sub-task left, nothing awaiting a person or the relay; the migration lists it
all) and deletes the task with every row that refers to it. The log is never edited: it only
loses whole tasks, and only what the audit export keeps verifiable offline. Merkle leaves stay,
so proofs and signed tree heads are unchanged, and the seal checks take a leaf whose event was
pruned as covered by the export (backplane/integrity/verification.py).

The candidates are read without a transaction (an index range scan of finished tasks in the
namespace, longest quiet first: ``task_retention_idx``); each task is then deleted in a short
transaction of its own, together with its rule's running totals.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import CLOSED_STATUSES, NAME_VALIDATOR
from backplane.integrity.models import AuditSegment
from recovery.models import RetentionRule, default_retained_statuses

logger = logging.getLogger(__name__)

_CLOSED = sorted(status.value for status in CLOSED_STATUSES)

# One page of a rule's tasks: finished tasks of one namespace (of one kind, for a rule that
# names one) past the cutoff, longest quiet first, after the last one of the page before, each
# with whether the database would let it go now. The inner query reads them in order from a
# retention index up to the page's LIMIT (the partial index's predicate is written out so that
# the planner sees the index serves it); the costly check runs above it, on that page only.
_PAGE_SQL = """
SELECT c.id, c.finished_last_event_at, backplane_task_prunable(c.id) FROM (
    SELECT t.id, t.finished_last_event_at FROM backplane_task t
    WHERE {scope}
      AND t.finished_last_event_at IS NOT NULL AND t.status = ANY(%(statuses)s)
      AND t.finished_last_event_at < %(cutoff)s
      AND t.finished_last_event_at >= %(after_at)s
      AND (t.finished_last_event_at, t.id) > (%(after_at)s, %(after_id)s)
    ORDER BY t.finished_last_event_at, t.id
    LIMIT %(page)s
) c
ORDER BY c.finished_last_event_at, c.id
"""
PAGE_SIZE = 500
# Whose tasks a page reads: a rule's (never a sandbox: rules are for the fleet's work), a rule's
# of one kind, or every namespace's finished sandboxes (kept for their own time).
RULE_SCOPE = "t.namespace = %(namespace)s AND NOT t.sandbox"
RULE_KIND_SCOPE = RULE_SCOPE + " AND t.kind = %(kind)s"
SANDBOX_SCOPE = "t.sandbox"


def retention_prune_batch(*, now: datetime | None = None, limit: int = 200) -> int:
    """Prune up to ``limit`` tasks that the active rules have made due; returns how many went.

    0 means there was nothing (left) to do: no rule, nothing exported yet, nothing due, or every
    candidate was held by someone else or changed meanwhile (the next run tries again).
    """
    now = now or timezone.now()
    exported = AuditSegment.objects.order_by("-tree_size").only("tree_size", "exported_at").first()
    if exported is None:
        logger.info("retention: nothing is exported yet, so nothing is pruned")
        return 0
    tasks = events = skipped = 0
    for rule in RetentionRule.objects.filter(is_active=True).order_by("pk"):
        if tasks >= limit:
            break
        # A task whose events are all exported ended before the export that took its last event
        # (recorded, then sealed, then exported): no later one can be due, so the scan stops at
        # the export's time. Clocks of different machines only delay a task to the next export.
        cutoff = min(now - timedelta(seconds=rule.keep_seconds), exported.exported_at)
        for task_id in _candidates(rule, cutoff=cutoff, limit=limit - tasks):
            pruned = _prune_one(rule, task_id, now=now)
            if pruned is None:
                skipped += 1
                continue
            tasks += 1
            events += pruned
    if tasks < limit:
        sandbox_cutoff = min(now - timedelta(seconds=settings.BACKPLANE_SANDBOX_KEEP_SECONDS), exported.exported_at)
        for task_id in _sandbox_candidates(cutoff=sandbox_cutoff, limit=limit - tasks):
            pruned = _prune_one(None, task_id, now=now)
            if pruned is None:
                skipped += 1
                continue
            tasks += 1
            events += pruned
    logger.info("retention: pruned %d task(s) and %d event(s) exported up to tree size %d; %d candidate(s) skipped",
                tasks, events, exported.tree_size, skipped)
    return tasks


def _candidates(rule: RetentionRule, *, cutoff: datetime, limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` of the rule's due tasks that may go now, oldest first. Page by page, so a
    long run of tasks that must stay (awaiting a decision, say) costs reading, never a check of
    every task the rule covers before a sort."""
    statuses = [status for status in rule.statuses if status in _CLOSED]
    params: dict[str, Any] = {"namespace": rule.namespace, "statuses": statuses, "cutoff": cutoff,
                              "after_at": datetime.min.replace(tzinfo=UTC), "after_id": uuid.UUID(int=0),
                              "page": PAGE_SIZE}
    scope = RULE_SCOPE
    if rule.kind:
        scope, params["kind"] = RULE_KIND_SCOPE, rule.kind
    return _due_pages(_PAGE_SQL.format(scope=scope), params, limit=limit) if statuses else []


def _sandbox_candidates(*, cutoff: datetime, limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` finished sandbox forks past their keep time that may go now, oldest first
    (``task_sandbox_retention_idx``): replays are kept for BACKPLANE_SANDBOX_KEEP_SECONDS, in every
    namespace, whatever its rules say."""
    params: dict[str, Any] = {"statuses": _CLOSED, "cutoff": cutoff,
                              "after_at": datetime.min.replace(tzinfo=UTC), "after_id": uuid.UUID(int=0),
                              "page": PAGE_SIZE}
    return _due_pages(_PAGE_SQL.format(scope=SANDBOX_SCOPE), params, limit=limit)


def _due_pages(sql: str, params: dict[str, Any], *, limit: int) -> list[uuid.UUID]:
    found: list[uuid.UUID] = []
    while len(found) < limit:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        found += [task_id for task_id, _, prunable in rows if prunable]
        if len(rows) < PAGE_SIZE:
            break
        params["after_at"], params["after_id"] = rows[-1][1], rows[-1][0]
    return found[:limit]


def _prune_one(rule: RetentionRule | None, task_id: uuid.UUID, *, now: datetime) -> int | None:
    """One task in one transaction: the database's check and deletion, and the rule's totals
    (``rule`` None: a sandbox, pruned by its keep time, not by a rule).
    Returns the events deleted, or None when the database kept the task (held, or no longer due)."""
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT backplane_prune_task(%s)", [task_id])
            (events,) = cursor.fetchone()
        if events is None:
            return None
        if rule is None:
            return int(events)
        RetentionRule.objects.filter(pk=rule.pk).update(
            tasks_pruned=F("tasks_pruned") + 1, events_pruned=F("events_pruned") + events, last_pruned_at=now
        )
    return int(events)


def retention_rule_ensure(
    *, namespace: str, keep_seconds: int, kind: str = "", statuses: Sequence[str] | None = None
) -> RetentionRule:
    """The active rule for ``namespace`` and ``kind`` (blank: every kind), created or updated to
    keep tasks ``keep_seconds`` (for programs that set their own retention, like the demo fleet;
    people use the admin). Running totals are kept when it exists."""
    try:
        NAME_VALIDATOR(namespace)
    except ValidationError as exc:
        raise InvalidInput("not a namespace name", {"namespace": exc.messages[0]}) from None
    chosen = list(statuses) if statuses is not None else default_retained_statuses()
    allowed = default_retained_statuses()
    if not chosen or any(status not in allowed for status in chosen):
        raise InvalidInput("a retention rule prunes finished tasks only", {"statuses": f"some of {allowed}"})
    if keep_seconds < 0:
        raise InvalidInput("keep_seconds must be 0 or more", {"keep_seconds": keep_seconds})
    with transaction.atomic(durable=True):
        rule = (RetentionRule.objects.select_for_update().filter(namespace=namespace, kind=kind)
                .order_by("pk").first())
        if rule is None:
            rule = RetentionRule.objects.create(namespace=namespace, kind=kind, keep_seconds=keep_seconds,
                                                statuses=chosen)
        else:
            rule.keep_seconds, rule.statuses, rule.is_active = keep_seconds, chosen, True
            rule.save(update_fields=["keep_seconds", "statuses", "is_active"])
    return rule
