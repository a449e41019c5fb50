"""The integrity page: verification runs and their progress, broken chains, seals, audit
exports, and inclusion-proof bundles anyone can check offline."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.integrity import sealing
from backplane.integrity import selectors as integrity
from backplane.integrity.models import VerificationMode, VerificationRun
from backplane.integrity.verification import integrity_alert_acknowledge, verification_run_request_full
from backplane.runtime.replica import replica_reads
from dashboard.views.common import (
    across_namespaces,
    json_error,
    operators_only,
    staff_permission_required,
    viewers_only,
)

ACKNOWLEDGE_PERMISSION = "backplane.acknowledge_integrityalert"


def run_as_json(run: VerificationRun) -> dict[str, Any]:
    total = run.tasks_total
    return {
        "id": run.pk,
        "mode": run.mode,
        "started_at": format_timestamp(run.started_at),
        "finished_at": format_timestamp(run.finished_at) if run.finished_at else None,
        "tasks_checked": run.tasks_checked,
        "tasks_total": total,
        "events_checked": run.events_checked,
        "failures": run.failures,
        "percent": 100 if run.finished_at else (min(99, round(100 * run.tasks_checked / total)) if total else 0),
    }


@require_GET
@viewers_only
@replica_reads
@across_namespaces
def integrity_page(request: HttpRequest) -> HttpResponse:
    heads = integrity.tree_heads_recent()
    runs = integrity.verification_runs_recent()
    try:
        public_key = sealing.public_key_hex()
    except Exception:  # noqa: BLE001 - a missing signing key shows as such on the page, not as a 500
        public_key = ""
    latest = heads[-1] if heads else None
    return render(
        request,
        "dashboard/integrity/page.html",
        {
            "nav": "integrity",
            "runs": runs,
            "running": [run_as_json(run) for run in runs if run.finished_at is None],
            "last_incremental": next((r for r in runs if r.mode == VerificationMode.INCREMENTAL and r.finished_at),
                                     None),
            "last_full": next((r for r in runs if r.mode == VerificationMode.FULL and r.finished_at), None),
            "alerts": integrity.integrity_alerts_open(),
            "may_acknowledge": request.user.has_perm(ACKNOWLEDGE_PERMISSION),
            "latest_head": latest,
            "seal_chart": {"sizes": [h.tree_size for h in heads], "times": [h.signed_at for h in heads]},
            "segments": integrity.audit_segments_recent(),
            "public_key": public_key,
        },
    )


@require_POST
@operators_only("Starting a verification run")
@across_namespaces
def verify_all(request: HttpRequest) -> HttpResponse:
    run = verification_run_request_full(requested_by=request.user.get_username())
    if request.headers.get("Accept", "").startswith("application/json"):
        return JsonResponse(run_as_json(run), status=202)
    messages.info(request, f"Verification run {run.pk} is queued for the worker.")
    return redirect("dashboard:integrity")


@require_GET
@viewers_only
@across_namespaces
def run_progress(request: HttpRequest, run_id: int) -> JsonResponse:
    try:
        run = integrity.verification_run_progress(run_id=run_id)
    except NotFound as exc:
        return json_error(404, "not_found", exc.message, exc.details)
    return JsonResponse(run_as_json(run))


@require_POST
@staff_permission_required(ACKNOWLEDGE_PERMISSION, what="Acknowledging an integrity alert")
@across_namespaces
def acknowledge_alert(request: HttpRequest, alert_id: int) -> HttpResponse:
    note = (request.POST.get("note") or "").strip()
    try:
        integrity_alert_acknowledge(alert_id=alert_id, by=request.user.get_username(), note=note)
    except (InvalidInput, NotFound, AlreadyDecided) as exc:
        messages.error(request, f"Not acknowledged: {exc.message}")
    else:
        messages.success(request, f"Alert {alert_id} acknowledged.")
    return redirect("dashboard:integrity")


@require_GET
@viewers_only
@across_namespaces
def proof_download(request: HttpRequest) -> HttpResponse:
    """One event's inclusion-proof bundle as a file (``check-proof`` verifies it offline)."""
    try:
        task_id = str(uuid.UUID(request.GET.get("task_id", "").strip()))
        seq = int(request.GET.get("seq", ""))
    except ValueError:
        messages.error(request, "Give a task id (a UUID) and a seq (a number) to download a proof.")
        return redirect("dashboard:integrity")
    try:
        bundle = integrity.event_proof_bundle(task_id=task_id, seq=seq)
    except (NotFound, InvalidInput) as exc:
        messages.error(request, f"No proof for {task_id}#{seq}: {exc.message}")
        return redirect("dashboard:integrity")
    response = HttpResponse(json.dumps(bundle, indent=2), content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="proof-{task_id}-{seq}.json"'
    return response

