"""Probes for orchestrators, load balancers and monitors.

``/readyz`` is the whole product's readiness: the database, the broker and every periodic duty,
so a beat that stopped turns it red instead of leaving the product quietly half-stopped. When the
outbox goes to Kafka, the Kafka cluster too: while it is down the outbox's messages wait; and with
the CDC relay, its replication slot (missing, invalidated, or holding back too much WAL).
``/readyz/traffic`` is what a load balancer gates on: only what the web process needs to serve
the API (the database and the broker). The API does not depend on beat, and a load balancer
that read the duties would take every web process out of rotation when beat died.

With a read replica (``DATABASE_REPLICA_URL``), ``/readyz`` names it in its body (``"replica": "in
use (lag 0.2 s)"`` or ``"fallback: lag 42 s"``) and never fails because of it: while it lags or is
unreachable the primary serves its reads (backplane/runtime/replica.py). ``/readyz/traffic``
leaves it out, for the same reason.

What ``/readyz`` tells is for the operators: an anonymous caller learns only ready (200) or not
(503); which duty is overdue, the database's error (its host and user) and the replica's state
are in the body only for a request with the metrics token (``Authorization: Bearer
<BACKPLANE_METRICS_TOKEN>``) or from a logged-in staff user's session. ``/readyz/traffic``, which
load balancers read from inside, answers as before.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from starlette.requests import Request
from starlette.responses import Response

from backplane.celery import app as celery_app
from backplane.delivery.cdc import cdc_problem
from backplane.delivery.kafka_sink import kafka_problem
from backplane.delivery.outbox import broker_is_kafka
from backplane.metrics import metrics_token_sent
from backplane.runtime.database_gate import gate
from backplane.runtime.duties import duties_overdue
from backplane.runtime.replica import replica_configured, replica_state

logger = logging.getLogger(__name__)

READYZ_RETRY_AFTER = "5"


_HEALTHY = b'{"status":"ok"}'


async def healthz(request: Request) -> Response:
    """The process is up and answering; says nothing about its dependencies. Served on the
    server's event loop by the HTTP front (backplane/asgi.py), not by Django: it needs none of
    Django's request machinery, nor a thread of the WSGI pool."""
    return Response(_HEALTHY, media_type="application/json")


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


def _outbox_broker_problem() -> str | None:
    """The outbox's own broker, when it is not Celery's (checked above): Kafka. The API serves
    without it, its messages waiting in the outbox, so only ``/readyz`` reads it."""
    return kafka_problem() if broker_is_kafka() else None


def _overdue_duties() -> list[str]:
    """Problems of the periodic duties that have stopped running (backplane/runtime/duties.py)."""
    if not settings.BACKPLANE_DUTY_WATCH:
        return []
    try:
        return [duty.problem for duty in duties_overdue()]
    except DatabaseError as exc:
        return [f"duties unknown: {exc.__class__.__name__}"]


def _cdc_slot_problem() -> str | None:
    try:
        return cdc_problem()
    except DatabaseError as exc:
        return f"cdc slot unknown: {exc.__class__.__name__}"


def _replica_summary() -> dict[str, str]:
    """``{"replica": "..."}`` when a replica is configured, else nothing: it never fails a probe."""
    return {"replica": replica_state().summary} if replica_configured() else {}


def _problems_response(problems: list[str], *, message: str, detailed: bool = True) -> JsonResponse:
    logger.warning("%s: %s", message, "; ".join(problems))
    details = {"problems": problems} if detailed else {}
    response = JsonResponse({"error": {"code": "unavailable", "message": message, "details": details}}, status=503)
    response["Retry-After"] = READYZ_RETRY_AFTER
    return response


def _may_see_details(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    staff = user is not None and user.is_authenticated and user.is_active and user.is_staff
    return staff or metrics_token_sent(request)


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when the database and the broker answer and every periodic duty is running, else 503
    naming what is missing (an overdue duty by its schedule name) to those who may see it: the
    product is not quietly half-stopped."""
    detailed = _may_see_details(request)
    database = _database_problem()
    problems = [p for p in (database, _broker_problem(), _outbox_broker_problem()) if p]
    if database is None:
        problems += _overdue_duties()
        if cdc_slot := _cdc_slot_problem():
            problems.append(cdc_slot)
    if problems:
        return _problems_response(problems, message="not ready", detailed=detailed)
    return JsonResponse({"status": "ready", **(_replica_summary() if detailed else {})})


@require_GET
def readyz_traffic(request: HttpRequest) -> JsonResponse:
    """The load balancer's probe: 200 when this process can serve the API, that is when the
    database and the broker answer, whatever the periodic duties are doing."""
    problems = [p for p in (_database_problem(), _broker_problem()) if p]
    if problems:
        return _problems_response(problems, message="cannot serve traffic")
    return JsonResponse({"status": "ready"})
