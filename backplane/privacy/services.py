"""What is done with personal data once sealed (sealing.py): opened for those allowed (each read
by a person recorded), looked up by a value marked ``lookup``, erased, and its keys re-wrapped
when the key-encryption key rotates. docs/privacy.md is the model and the operator's procedure."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, transaction
from django.db.models import Count
from django.utils import timezone

from backplane.delivery.outbox import outbox_enqueue
from backplane.eventlog.canonical import CanonicalizationError
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import InvalidInput, NotFound, SubjectErased
from backplane.privacy.keys import KeyUnavailable, key_encryption_keys
from backplane.privacy.models import SUBJECT_MAX_LENGTH, DataSubject, LookupKey, PersonalDataRead, PersonalLookup
from backplane.privacy.sealing import (
    MARK,
    Found,
    Path,
    data_key_unwrap,
    erased_marker,
    lookup_digest,
    open_value,
    personal_in,
    replaced,
    where,
)

logger = logging.getLogger(__name__)

TOPIC = "backplane.privacy"
REASON_MAX_LENGTH = 2000


# --- reading: the erased shown as erased, the rest opened for those allowed ---------------------------


@dataclass(frozen=True)
class Opened:
    value: Any
    subjects: list[dict[str, Any]]  # {"subject", "erased_at"} for each subject met, in subject order


def _subjects_of(namespace: str, found: Iterable[Found]) -> dict[str, DataSubject]:
    names = sorted({item.subject for item in found})
    return {row.subject: row for row in DataSubject.objects.filter(namespace=namespace, subject__in=names)}


def _refuse_clear(found: list[Found]) -> None:
    for item in found:
        if item.sealed is None:
            raise InvalidInput("only sealed values are opened", {where(item.path): "not an envelope"})


def personal_shown(namespace: str, value: Any) -> Any:
    """``value`` as every reader sees it: envelopes of erased subjects shown as erased, the others
    as they are (sealed). One query when ``value`` holds envelopes; none otherwise."""
    found = personal_in(value, bounded=False)
    if not found:
        return value
    rows = _subjects_of(namespace, found)

    def shown(marker: dict[str, Any], _path: Path) -> Any:
        row = rows.get(marker[MARK].get("subject"))
        if row is not None and row.erased_at is not None:
            return erased_marker(row.subject, row.erased_at)
        return marker

    return replaced(value, shown)


def personal_open(namespace: str, value: Any, *, reader: str | None, where_read: str,
                  task_id: uuid.UUID | None = None, bounded: bool = True) -> Opened:
    """``value`` with each envelope of ``namespace`` opened, or shown as erased. ``reader``: the
    person reading (recorded, with ``where_read``); None for an agent of the namespace. An envelope
    that is not one of the namespace's (another namespace's, or altered) is 400. ``bounded``: a
    request's ``value`` (``personal_in``); False for what the log holds."""
    found = personal_in(value, bounded=bounded)
    _refuse_clear(found)
    rows = _subjects_of(namespace, found)
    keys: dict[str, bytes] = {}
    for row in rows.values():
        if row.wrapped_key is not None and row.kek_id is not None:
            keys[row.subject] = data_key_unwrap(row.kek_id, row.wrapped_key)
    opened_at: dict[Path, Any] = {}
    for item in found:
        subject_row = rows.get(item.subject)
        if subject_row is None:
            raise InvalidInput("an envelope of no data subject of this namespace",
                               {where(item.path): "not a sealed value of this namespace"})
        if subject_row.erased_at is not None:
            opened_at[item.path] = erased_marker(subject_row.subject, subject_row.erased_at)
            continue
        assert item.sealed is not None
        try:
            opened_at[item.path] = open_value(keys[item.subject], namespace=namespace, subject=item.subject,
                                              sealed=item.sealed)
        except ValueError:
            raise InvalidInput("an envelope that is not a sealed value of this namespace's subject",
                               {where(item.path): "not a sealed value of this subject"}) from None
    live = sorted(name for name, row in rows.items() if row.erased_at is None)
    if reader is not None and live:
        _read_recorded(reader=reader, namespace=namespace, subjects=live, where_read=where_read, task_id=task_id)
    return Opened(value=replaced(value, lambda _marker, path: opened_at[path]),
                  subjects=[_subject_state(rows[name]) for name in sorted(rows)])


def _subject_state(row: DataSubject) -> dict[str, Any]:
    return {"subject": row.subject, "erased_at": format_timestamp(row.erased_at) if row.erased_at else None}


def subjects_by_value(namespace: str, value: Any, *, reader: str | None) -> list[str]:
    """The live subjects of ``namespace`` that a value marked ``lookup`` was sealed for (the blind
    index: the value's keyed hash, never the value). A person's lookup that finds any is recorded
    as a read of those subjects."""
    row = LookupKey.objects.filter(namespace=namespace).first()
    if row is None:
        return []
    try:
        digest = lookup_digest(data_key_unwrap(row.kek_id, row.wrapped_key), value)
    except CanonicalizationError as exc:
        raise InvalidInput("the value cannot be represented as canonical JSON", {"value": str(exc)}) from None
    subjects = sorted(PersonalLookup.objects.filter(digest=digest, subject__namespace=namespace,
                                                    subject__erased_at__isnull=True)
                      .values_list("subject__subject", flat=True))
    if reader is not None and subjects:
        _read_recorded(reader=reader, namespace=namespace, subjects=subjects, where_read="lookup")
    return subjects


def _read_recorded(*, reader: str, namespace: str, subjects: list[str], where_read: str,
                   task_id: uuid.UUID | None = None) -> None:
    """A person read ``subjects``' personal data in clear (or found them by a value)."""
    PersonalDataRead.objects.create(read_at=timezone.now(), reader=reader[:200], namespace=namespace,
                                    subjects=subjects, where=where_read[:200], task_id=task_id)


# --- erasure -----------------------------------------------------------------------------------------


def subject_erase(*, namespace: str, subject: str, reason: str, erased_by: str) -> DataSubject:
    """Erase a data subject: its key destroyed (every value sealed with it is unreadable from now
    on, wherever it lies), its lookups deleted, who, why and when kept on its row, and a
    ``SubjectErased`` message on ``backplane.privacy`` for the consumers that kept clear copies.
    An unknown subject is 404, an erased one 409; either changes nothing."""
    reason = reason.strip()
    if not reason:
        raise InvalidInput("an erasure says why", {"reason": "required"})
    if len(reason) > REASON_MAX_LENGTH:
        raise InvalidInput("the reason is too long", {"reason": f"at most {REASON_MAX_LENGTH} characters"})
    if not subject or len(subject) > SUBJECT_MAX_LENGTH:
        raise InvalidInput("no such data subject id", {"subject": f"1 to {SUBJECT_MAX_LENGTH} characters"})
    with transaction.atomic(durable=True):
        row = DataSubject.objects.select_for_update().filter(namespace=namespace, subject=subject).first()
        if row is None:
            raise NotFound("no such data subject in this namespace", {"subject": subject})
        if row.erased_at is not None:
            raise SubjectErased(f"data subject {subject!r} was already erased",
                                {"subject": subject, "erased_at": format_timestamp(row.erased_at),
                                 "erased_by": row.erased_by})
        now = timezone.now()
        row.erased_at, row.erased_by, row.erase_reason = now, erased_by[:200], reason
        row.kek_id = row.wrapped_key = None
        row.save(update_fields=["erased_at", "erased_by", "erase_reason", "kek_id", "wrapped_key"])
        PersonalLookup.objects.filter(subject=row).delete()
        outbox_enqueue(topic=TOPIC, key=f"{namespace}:{subject}", namespace=namespace, now=now,
                       headers={"type": "SubjectErased"},
                       payload={"type": "SubjectErased", "namespace": namespace, "subject": subject,
                                "erased_at": format_timestamp(now), "erased_by": row.erased_by, "reason": reason})
    logger.info("data subject erased: %s/%s by %s", namespace, subject, row.erased_by)
    return row


# --- key-encryption keys: rotation and the start-up check ------------------------------------------------


def kek_rotate(*, batch: int = 500, progress: Callable[[int], None] | None = None) -> int:
    """Re-wrap every live data key (subjects' and lookup keys) that the current KEK did not wrap;
    no sealed value changes. In batches, one transaction each, so a rotation of millions of
    subjects never holds many locks; run again after a crash, it carries on. Returns how many."""
    keks = key_encryption_keys()
    current = keks.current_id()
    done = 0
    for subjects in (True, False):
        while True:
            with transaction.atomic(durable=True):
                rows = _wrapped_with_another(current, batch=batch, subjects=subjects)
                for row in rows:
                    assert row.kek_id is not None and row.wrapped_key is not None
                    try:
                        key = keks.unwrap(row.kek_id, bytes(row.wrapped_key))
                    except KeyUnavailable as exc:
                        raise ImproperlyConfigured(f"cannot rotate: {exc}") from None
                    row.kek_id, row.wrapped_key = keks.wrap(key)
                    row.save(update_fields=["kek_id", "wrapped_key"])
            done += len(rows)
            if progress is not None and rows:
                progress(done)
            if len(rows) < batch:
                break
    return done


def _wrapped_with_another(current: str, *, batch: int, subjects: bool) -> list[DataSubject | LookupKey]:
    """Up to ``batch`` live data keys, subjects' or lookup keys, not wrapped with ``current``, locked."""
    if subjects:
        return list(DataSubject.objects.select_for_update(skip_locked=True).exclude(kek_id=current)
                    .filter(kek_id__isnull=False).order_by("pk")[:batch])
    return list(LookupKey.objects.select_for_update(skip_locked=True).exclude(kek_id=current).order_by("pk")[:batch])


def kek_problems() -> list[str]:
    """What the configured KEKs cannot open: for each KEK that wraps live keys, one of its keys is
    unwrapped (AES key wrap's integrity check tells a wrong key from the right one)."""
    wrapped_with: dict[str, int] = {}
    models: tuple[type[DataSubject] | type[LookupKey], ...] = (DataSubject, LookupKey)
    for model in models:
        for kek_id, count in model.objects.filter(kek_id__isnull=False).values_list("kek_id").annotate(n=Count("pk")):
            if kek_id is not None:
                wrapped_with[kek_id] = wrapped_with.get(kek_id, 0) + count
    if not wrapped_with:
        return []
    try:
        keks = key_encryption_keys()
    except ImproperlyConfigured as exc:
        return [f"{sum(wrapped_with.values())} data keys are wrapped, and {exc}"]
    problems = []
    for kek_id, count in sorted(wrapped_with.items()):
        sample = (DataSubject.objects.filter(kek_id=kek_id).values_list("wrapped_key", flat=True).first()
                  or LookupKey.objects.filter(kek_id=kek_id).values_list("wrapped_key", flat=True).first())
        assert sample is not None
        try:
            keks.unwrap(kek_id, bytes(sample))
        except KeyUnavailable as exc:
            problems.append(f"{count} data keys are wrapped with key-encryption key {kek_id!r}: {exc}")
    return problems


def require_key_encryption_keys() -> None:
    """Stop a web process whose key-encryption keys do not open the data keys in the database
    (a lost or a wrong key file): ImproperlyConfigured, naming the key, never silent garbage. A
    database not reachable (or not migrated) yet is left to /readyz."""
    try:
        problems = kek_problems()
    except (DatabaseError, RuntimeError) as exc:  # RuntimeError: a test run that allows no database here
        logger.warning("the key-encryption keys were not checked: %s", exc)
        return
    if problems:
        raise ImproperlyConfigured("the key-encryption keys do not open the data subjects' keys: "
                                   + "; ".join(problems) + " (docs/privacy.md, \"Keys\")")
