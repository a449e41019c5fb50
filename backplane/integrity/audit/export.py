"""Audit export: each new sealed range becomes a signed segment in the audit destination
(docs/design.md, "Integrity and audit"; the format is in ``backplane/integrity/audit/manifest.py``).

One segment per call of ``audit_export_next_segment``, in one transaction that holds the
exporter's advisory lock (one exporter at a time across the cluster):

1. The next segment starts at the last recorded segment's tree size (0 for the first) and ends
   at a signed tree head: the largest one within ``BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS`` leaves,
   or the nearest one beyond if a single seal run was larger. No head beyond: nothing to do.
2. The events of those leaves, in leaf order, are rendered as the API shows them, and the
   manifest is built and signed with the sealer's key.
3. The segment file is written, then the manifest, each write-once (read-only file, or S3
   Object Lock in compliance mode).
4. Only then is the segment recorded (``AuditSegment``), in the same transaction.

A crash (or a failed commit) between 3 and 4 leaves objects the database does not know about.
The next run finds them under the same segment number: an orphan segment file fixes the range
(its line count), both files are rebuilt from the database, and what already exists must be
byte for byte what would be written (rendering and Ed25519 are deterministic), so it is kept
and only the missing object is written. Anything else is refused, never overwritten, and
surfaces as a failure; so a segment number never ends up with two different contents.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterSource
from backplane.delivery.services import dead_letter_record_repeating
from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.models import Event
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.audit.storage import DirectoryStore, S3Store, Store
from backplane.integrity.models import AuditSegment, SignedTreeHead
from backplane.integrity.sealing import public_key_hex, signing_key

logger = logging.getLogger(__name__)

# pg_try_advisory_xact_lock key: "one exporter at a time" (the sealer's is 0x5EA1_0001).
EXPORTER_LOCK_KEY = 0x5EA1_0002


class AuditExportFailed(Exception):
    """An export step failed; says which segment, so the dead letter can name it."""

    def __init__(self, message: str, *, segment: int, first_leaf: int, last_leaf: int | None, destination: str):
        super().__init__(message)
        self.segment = segment
        self.first_leaf = first_leaf
        self.last_leaf = last_leaf
        self.destination = destination

    @property
    def reference(self) -> str:
        leaves = f"leaves {self.first_leaf}-{self.last_leaf}" if self.last_leaf is not None else (
            f"from leaf {self.first_leaf}"
        )
        return f"segment {self.segment} ({leaves})"


def audit_store() -> Store:
    """The configured destination: S3 when a bucket is named, else the directory."""
    if settings.BACKPLANE_AUDIT_S3_BUCKET:
        return S3Store(
            settings.BACKPLANE_AUDIT_S3_BUCKET,
            settings.BACKPLANE_AUDIT_S3_PREFIX,
            endpoint_url=settings.BACKPLANE_AUDIT_S3_ENDPOINT_URL or None,
            region=settings.BACKPLANE_AUDIT_S3_REGION or None,
            retention_days=settings.BACKPLANE_AUDIT_S3_RETENTION_DAYS,
        )
    return DirectoryStore(settings.BACKPLANE_AUDIT_DIR)


@dataclass(frozen=True)
class ExportStep:
    ran: bool  # False when another exporter held the lock
    segment: AuditSegment | None = None  # None: nothing new to export


def _segment_end(*, start: int, orphan: bytes | None) -> SignedTreeHead | None:
    """The signed head the segment starting at ``start`` ends at (step 1)."""
    heads = SignedTreeHead.objects.filter(tree_size__gt=start)
    if orphan is not None:
        # A crashed run's file fixes the range, whatever heads were signed since.
        return heads.filter(tree_size=start + orphan.count(b"\n")).first()
    limit = start + settings.BACKPLANE_AUDIT_SEGMENT_MAX_EVENTS
    return (
        heads.filter(tree_size__lte=limit).order_by("-tree_size").first()
        or heads.order_by("tree_size").first()
    )


def _segment_bytes(*, start: int, end: int) -> bytes:
    events = (
        Event.objects.filter(leaf__leaf_index__gte=start, leaf__leaf_index__lt=end)
        .order_by("leaf__leaf_index")
        .iterator(chunk_size=5000)
    )
    lines = [fmt.event_line(event_as_api_dict(event)) for event in events]
    if len(lines) != end - start:
        raise ValueError(f"only {len(lines)} of the {end - start} sealed leaves [{start}, {end}) have events")
    return b"".join(lines)


def _manifest(*, number: int, start: int, head: SignedTreeHead, segment: bytes, previous_sha256: str) -> bytes:
    key = signing_key()
    manifest = {
        "format": fmt.FORMAT,
        "segment": number,
        "first_leaf": start,
        "last_leaf": head.tree_size - 1,
        "tree_size": head.tree_size,
        "events": head.tree_size - start,
        "root_hash": head.root_hash,
        "signed_tree_head": {
            "tree_size": head.tree_size,
            "root_hash": head.root_hash,
            "signed_at": head.signed_at,
            "signature": head.signature,
            "public_key": head.public_key,
        },
        "segment_file": fmt.segment_name(number),
        "segment_sha256": hashlib.sha256(segment).hexdigest(),
        "previous_manifest_sha256": previous_sha256,
        "public_key": public_key_hex(key),
    }
    manifest["signature"] = key.sign(fmt.manifest_message(manifest)).hex()
    return fmt.encode_manifest(manifest)


def _write_missing(store: Store, name: str, data: bytes, existing: bytes | None) -> None:
    if existing is None:
        store.write_once(name, data)
    elif existing != data:
        raise ValueError(
            f"{store.url}{'' if store.url.endswith('/') else '/'}{name} already exists with other content than "
            "this export would write; it is left alone (see who wrote it before recording anything)"
        )


def audit_export_next_segment(*, store: Store | None = None, now: datetime | None = None) -> ExportStep:
    """Write and record the next segment, if a signed head lies beyond the last one. One transaction."""
    store = store or audit_store()
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [EXPORTER_LOCK_KEY])
            (locked,) = cursor.fetchone()
        if not locked:
            return ExportStep(ran=False)
        last = AuditSegment.objects.order_by("-number").first()
        number = last.number + 1 if last else 1
        start = last.tree_size if last else 0
        previous_sha256 = last.manifest_sha256 if last else fmt.FIRST_PREVIOUS_MANIFEST_SHA256
        segment_name, manifest_name = fmt.segment_name(number), fmt.manifest_name(number)
        head: SignedTreeHead | None = None
        try:
            orphan = store.read(segment_name)
            head = _segment_end(start=start, orphan=orphan)
            if head is None:
                if orphan is None:
                    return ExportStep(ran=True)
                lines = orphan.count(b"\n")
                raise ValueError(
                    f"{segment_name} already exists with {lines} event(s) from leaf {start}, which do not end "
                    "at a signed tree head; it is left alone"
                )
            segment = _segment_bytes(start=start, end=head.tree_size)
            manifest = _manifest(number=number, start=start, head=head, segment=segment,
                                 previous_sha256=previous_sha256)
            _write_missing(store, segment_name, segment, orphan)
            _write_missing(store, manifest_name, manifest, store.read(manifest_name))
        except (OSError, ValueError) as exc:
            # If the destination failed before the range was known, name the range it would have had.
            head = head or _segment_end(start=start, orphan=None)
            raise AuditExportFailed(
                f"exporting segment {number} to {store.url} failed: {exc}",
                segment=number, first_leaf=start, last_leaf=head.tree_size - 1 if head else None,
                destination=store.url,
            ) from exc
        record = AuditSegment.objects.create(
            number=number,
            first_leaf=start,
            tree_size=head.tree_size,
            root_hash=head.root_hash,
            segment_sha256=hashlib.sha256(segment).hexdigest(),
            manifest_sha256=hashlib.sha256(manifest).hexdigest(),
            destination=store.url,
            exported_at=now or timezone.now(),
        )
    return ExportStep(ran=True, segment=record)


@dataclass(frozen=True)
class ExportRun:
    segments: list[AuditSegment] = field(default_factory=list)
    locked_out: bool = False  # another exporter was running


def audit_export_until_idle(*, store: Store | None = None) -> ExportRun:
    """Export segments until the last signed head is exported (what the beat task and the command run).
    Each segment commits on its own: a failure keeps the ones before it."""
    store = store or audit_store()
    segments: list[AuditSegment] = []
    while True:
        step = audit_export_next_segment(store=store)
        if step.segment is None:
            return ExportRun(segments=segments, locked_out=not step.ran)
        segments.append(step.segment)


def audit_export_record_failure(*, error: BaseException, attempts: int) -> DeadLetter:
    """After the last retry, make the failure a dead letter people see. A failure that persists
    across runs stays one pending dead letter per segment (its attempts grow), not one an hour."""
    if isinstance(error, AuditExportFailed):
        reference = error.reference
        payload = {"segment": error.segment, "first_leaf": error.first_leaf, "last_leaf": error.last_leaf,
                   "destination": error.destination}
    else:
        reference, payload = "audit export", {}
    text = f"{type(error).__name__}: {error}"[:2000]
    dead_letter, _ = dead_letter_record_repeating(
        source=DeadLetterSource.AUDIT_EXPORT, reference=reference, payload=payload, error=text, attempts=attempts
    )
    logger.error("audit export gave up after %d attempt(s), dead letter %d: %s", attempts, dead_letter.pk, text)
    return dead_letter
