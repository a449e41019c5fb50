"""Reads of integrity for the people who audit: runs, alerts, seals, exports, proof bundles."""

from __future__ import annotations

from typing import Any

from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.errors import NotFound
from backplane.eventlog.models import Event
from backplane.integrity import sealing
from backplane.integrity.audit.proof import BUNDLE_FORMAT
from backplane.integrity.models import AuditSegment, IntegrityAlert, SignedTreeHead, VerificationRun


def verification_runs_recent(*, limit: int = 12, others: int = 6) -> list[VerificationRun]:
    """The newest runs, and among them at least the newest ``others`` full and on-demand ones
    (beat's incremental runs, one a minute, would push those out of a plain "latest" list)."""
    runs = VerificationRun.objects.order_by("-started_at", "-pk")
    recent = {run.pk: run for run in runs[:limit]}
    recent.update({run.pk: run for run in runs.exclude(mode="incremental")[:others]})
    return sorted(recent.values(), key=lambda run: (run.started_at, run.pk), reverse=True)


def verification_run_progress(*, run_id: int) -> VerificationRun:
    run = VerificationRun.objects.filter(pk=run_id).first()
    if run is None:
        raise NotFound("no such verification run", {"id": run_id})
    return run


def integrity_alerts_open(*, limit: int = 100) -> list[IntegrityAlert]:
    return list(
        IntegrityAlert.objects.filter(acknowledged_at__isnull=True)
        .select_related("task")
        .order_by("-created_at", "-pk")[:limit]
    )


def tree_heads_recent(*, limit: int = 500) -> list[SignedTreeHead]:
    """The newest signed tree heads, oldest first (the seals-over-time chart)."""
    heads = list(SignedTreeHead.objects.order_by("-tree_size").only("tree_size", "root_hash", "signed_at",
                                                                     "public_key")[:limit])
    heads.reverse()
    return heads


def audit_segments_recent(*, limit: int = 50) -> list[AuditSegment]:
    return list(AuditSegment.objects.order_by("-number")[:limit])


def event_proof_bundle(*, task_id: str, seq: int) -> dict[str, Any]:
    """One event's inclusion proof against the latest signed tree head, with the head and the
    event as the API shows it: everything ``check-proof`` needs, in one JSON object."""
    event = Event.objects.filter(task_id=task_id, seq=seq).first()
    if event is None:
        raise NotFound("no such event", {"task_id": task_id, "seq": seq})
    leaf_index, tree_size, path = sealing.inclusion_proof_for_event(position=event.position, tree_size=None)
    head = sealing.head_of_size(tree_size)
    return {
        "format": BUNDLE_FORMAT,
        "event": event_as_api_dict(event),
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "audit_path": path,
        "tree_head": {"tree_size": head.tree_size, "root_hash": head.root_hash, "signed_at": head.signed_at,
                      "signature": head.signature, "public_key": head.public_key},
    }
