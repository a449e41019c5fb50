"""Liveness and readiness probes for load balancers, orchestrators and the supervisor."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from backplane.celery import app as celery_app
from backplane.runtime.database_gate import gate
from backplane.runtime.duties import duties_overdue

logger = logging.getLogger(__name__)

READYZ_RETRY_AFTER = "5"


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and answering; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


def _database_problem() -> str | None:
    # A connection of its own, bounded in time: the pool may be waiting out its timeout.
    problem = gate.probe()
    return f"database unreachable: {problem}" if problem else None


def _broker_problem() -> str | None:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=0.5)
    except Exception as exc:  # noqa: BLE001 - any transport error means "not ready"
        return f"broker unreachable: {exc.__class__.__name__}"
    return None


def _overdue_duties() -> list[str]:
    """Problems of the periodic duties that have stopped running (backplane/runtime/duties.py)."""
    if not settings.BACKPLANE_DUTY_WATCH:
        return []
    try:
        return [duty.problem for duty in duties_overdue()]
    except DatabaseError as exc:
        return [f"duties unknown: {exc.__class__.__name__}"]


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer and every periodic duty is running, else
    503 naming what is missing (an overdue duty by its schedule name)."""
    database = _database_problem()
    problems = [p for p in (database, _broker_problem()) if p]
    if database is None:
        problems += _overdue_duties()
    if problems:
        logger.warning("not ready: %s", "; ".join(problems))
        response = JsonResponse(
            {"error": {"code": "unavailable", "message": "not ready", "details": {"problems": problems}}},
            status=503,
        )
        response["Retry-After"] = READYZ_RETRY_AFTER
        return response
    return JsonResponse({"status": "ready"})
