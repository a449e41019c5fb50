"""Who wants to know that dead letters were made: parts above delivery register a listener
(the dashboard does, so open review queues update live), and /metrics counts them. Every place
that makes dead letters calls ``announce_dead_letters`` in its transaction; the count and the
listeners run once it commits, and never for a write that rolled back."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import transaction

from backplane.telemetry import counters

logger = logging.getLogger("backplane.delivery")

DeadLetterListener = Callable[[int], None]
_listeners: list[DeadLetterListener] = []


def register_dead_letter_listener(listener: DeadLetterListener) -> None:
    """Call ``listener(count)`` after every commit that made ``count`` dead letters."""
    if listener not in _listeners:
        _listeners.append(listener)


def announce_dead_letters(*, source: str, count: int = 1) -> None:
    """``count`` dead letters of ``source`` were made in the current transaction."""
    if count <= 0:
        return

    def tell() -> None:
        counters.dead_letters_created_count(source=source, count=count)
        for listener in _listeners:
            try:
                listener(count)
            except Exception:  # noqa: BLE001 - the dead letters are committed; a listener's failure is only logged
                logger.exception("a dead-letter listener failed")

    transaction.on_commit(tell)
