"""Delivery's writes other than the relay's own: dead letters for work that keeps failing."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from backplane.delivery.announcements import announce_dead_letters
from backplane.delivery.models import DeadLetter, DeadLetterStatus


def dead_letter_record_repeating(
    *, source: str, reference: str, payload: dict[str, Any], error: str, attempts: int
) -> tuple[DeadLetter, bool]:
    """One pending dead letter per ``(source, reference)`` for a failure that repeats on a
    schedule (the sealer every few seconds, the audit export every hour): the first failure
    creates it and announces it, later ones add their ``attempts`` and record the latest
    error, so a lasting failure is one item to review, not one per run. Returns it and
    whether it is new. One transaction; the row lock keeps two failing runs from making two."""
    with transaction.atomic(durable=True):
        dead_letter = (
            DeadLetter.objects.select_for_update()
            .filter(source=source, status=DeadLetterStatus.PENDING, reference=reference)
            .first()
        )
        if dead_letter is not None:
            dead_letter.attempts += attempts
            dead_letter.error = error
            dead_letter.save(update_fields=["attempts", "error"])
            return dead_letter, False
        dead_letter = DeadLetter.objects.create(
            source=source, reference=reference, payload=payload, error=error, attempts=attempts,
            created_at=timezone.now(),
        )
        announce_dead_letters(source=source)
    return dead_letter, True
