"""The Approvals page's reads: the requests waiting (with what led to each: the task's last
events before it), the ones decided lately, and the tasks waiting for a signal. Three queries
for the requests whatever the number of rows, one for the signals."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from backplane.eventlog.canonical import canonical_json
from recovery.models import ApprovalRequest, ApprovalStatus, SignalStatus, TaskSignal

# Events shown before each request: what the agent thought and did just before it asked.
LEADING_EVENTS = 5
RECENTLY_DECIDED = 20
WAITING_SHOWN = 200

_LEADING_EVENTS_SQL = """
SELECT r.id, e.seq, e.type, e.payload, e.recorded_at
FROM recovery_approvalrequest r
CROSS JOIN LATERAL (
    SELECT seq, type, payload, recorded_at FROM backplane_event e
    WHERE e.task_id = r.task_id AND e.recorded_at <= r.requested_at AND e.type <> 'ApprovalRequested'
    ORDER BY e.seq DESC LIMIT %(limit)s
) e
WHERE r.id = ANY(%(ids)s)
ORDER BY r.id, e.seq
"""


@dataclass
class LeadingEvent:
    seq: int
    type: str
    summary: str
    recorded_at: datetime


@dataclass
class WaitingRequest:
    request: ApprovalRequest
    arguments: str  # the canonical JSON (RFC 8785) the hash is of
    approved: list[Any] = field(default_factory=list)
    leading: list[LeadingEvent] = field(default_factory=list)


def _summary(payload: Any, limit: int = 240) -> str:
    text = json.dumps(payload, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def approvals_waiting(*, limit: int = WAITING_SHOWN) -> list[WaitingRequest]:
    """The pending requests, the longest waiting first, each with its canonical arguments, the
    approvals so far and the task's last events before it."""
    requests = list(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
                    .select_related("policy", "group", "task").prefetch_related("decisions")
                    .order_by("requested_at", "pk")[:limit])
    leading: dict[uuid.UUID, list[LeadingEvent]] = defaultdict(list)
    if requests:
        with connection.cursor() as cursor:
            cursor.execute(_LEADING_EVENTS_SQL, {"ids": [r.pk for r in requests], "limit": LEADING_EVENTS})
            for approval_id, seq, event_type, payload, recorded_at in cursor.fetchall():
                if isinstance(payload, str):
                    payload = json.loads(payload)
                leading[approval_id].append(LeadingEvent(seq, event_type, _summary(payload), recorded_at))
    return [WaitingRequest(request=r, arguments=canonical_json(r.input).decode(),
                           approved=sorted(r.decisions.all(), key=lambda d: (d.at, d.pk)), leading=leading[r.pk])
            for r in requests]


def approvals_recently_decided(*, limit: int = RECENTLY_DECIDED) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.exclude(status=ApprovalStatus.PENDING).filter(decided_at__isnull=False)
                .select_related("policy", "group", "task").prefetch_related("decisions")
                .order_by("-decided_at", "-pk")[:limit])


def signals_waiting(*, limit: int = WAITING_SHOWN) -> list[TaskSignal]:
    """The signals tasks wait for, the first to run out first."""
    return list(TaskSignal.objects.filter(status=SignalStatus.WAITING)
                .select_related("task").order_by("expires_at", "pk")[:limit])
