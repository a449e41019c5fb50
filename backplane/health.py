"""Liveness and readiness probes for load balancers and orchestrators."""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from backplane.celery import app as celery_app

logger = logging.getLogger(__name__)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and answering; says nothing about its dependencies."""
    return JsonResponse({"status": "ok"})


def _database_ready() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        return f"database unreachable: {exc.__class__.__name__}"
    return None


def _broker_ready() -> str | None:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # noqa: BLE001 - any transport error means "not ready"
        return f"broker unreachable: {exc.__class__.__name__}"
    return None


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer, else 503 with what is missing."""
    problems = [p for p in (_database_ready(), _broker_ready()) if p]
    if problems:
        logger.warning("not ready: %s", "; ".join(problems))
        response = JsonResponse(
            {"error": {"code": "unavailable", "message": "not ready", "details": {"problems": problems}}},
            status=503,
        )
        response["Retry-After"] = "5"
        return response
    return JsonResponse({"status": "ready"})
