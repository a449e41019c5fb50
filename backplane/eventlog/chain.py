"""The hash chain: how an event is represented, hashed and linked to the one before.

docs/api.md fixes the rule so anyone can check a chain without our code: take the Event
object exactly as the API returns it, drop ``hash`` and ``position``, canonicalise
the rest with RFC 8785 and hash it with SHA-256. ``event_as_api_dict`` is therefore
the one place that decides what the API shows of an event; the serializer uses it too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from backplane.eventlog.canonical import canonical_sha256

GENESIS_HASH = "0" * 64


class StoredEvent(Protocol):
    """What this module reads of a stored event: a model instance (``models.Event``) or a row
    of the events page (``selectors.EventRow``). A protocol, so the chain, which the models and
    the selectors build on, needs neither."""

    @property
    def task_id(self) -> Any: ...
    @property
    def seq(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def payload(self) -> Any: ...
    @property
    def agent(self) -> str | None: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def lamport(self) -> int: ...
    @property
    def causation_id(self) -> str | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def trace_id(self) -> str | None: ...
    @property
    def recorded_at(self) -> datetime | str: ...
    @property
    def prev_hash(self) -> str: ...
    @property
    def hash(self) -> str: ...

# Fields of the API's Event object that the hash does not cover.
UNHASHED_FIELDS = ("hash", "position")


def format_timestamp(moment: datetime | str) -> str:
    """RFC 3339 UTC with exactly six fractional digits, as the API prints every time. A string
    is a time PostgreSQL already printed in that form (``api_time_sql``) and is returned as is."""
    if isinstance(moment, str):
        return moment
    if moment.tzinfo is None:
        raise ValueError("naive datetimes are not allowed; times are timezone-aware UTC")
    return _format_utc(moment)


# The events of one write share their time, and each is printed twice (hashed, then answered),
# so a batch prints one instant hundreds of times. Equal aware datetimes are the same instant,
# so they print alike whatever their zone.
@functools.lru_cache(maxsize=64)
def _format_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def api_time_sql(column: str) -> str:
    """SQL rendering a ``timestamptz`` column as ``format_timestamp`` does (NULL stays NULL): read
    paths that answer with many times let PostgreSQL print them, instead of loading each into a
    ``datetime`` and formatting it again, which was a quarter of an events page's CPU. A test
    compares the two side by side."""
    return f"""to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def hashed_fields(
    *,
    task_id: str,
    seq: int,
    type: str,
    payload: dict[str, Any],
    agent: str | None,
    idempotency_key: str | None,
    lamport: int,
    causation_id: str | None,
    correlation_id: str | None,
    trace_id: str | None,
    recorded_at: datetime | str,
    prev_hash: str,
) -> dict[str, Any]:
    """The hashed fields of docs/api.md's Event object (``recorded_at``: see ``format_timestamp``)."""
    return {
        "task_id": task_id,
        "seq": seq,
        "type": type,
        "payload": payload,
        "agent": agent,
        "idempotency_key": idempotency_key,
        "lamport": lamport,
        "causation_id": causation_id,
        "correlation_id": correlation_id,
        "trace_id": trace_id,
        "recorded_at": format_timestamp(recorded_at),
        "prev_hash": prev_hash,
    }


def event_hashed_fields(event: StoredEvent) -> dict[str, Any]:
    return hashed_fields(
        task_id=str(event.task_id),
        seq=event.seq,
        type=event.type,
        payload=event.payload,
        agent=event.agent,
        idempotency_key=event.idempotency_key,
        lamport=event.lamport,
        causation_id=event.causation_id,
        correlation_id=event.correlation_id,
        trace_id=event.trace_id,
        recorded_at=event.recorded_at,
        prev_hash=event.prev_hash,
    )


def event_as_api_dict(event: StoredEvent) -> dict[str, Any]:
    """The Event object of docs/api.md, field order as documented."""
    body = event_hashed_fields(event)
    return {
        "task_id": body["task_id"],
        "seq": body["seq"],
        "position": event.position,
        "type": body["type"],
        "payload": body["payload"],
        "agent": body["agent"],
        "idempotency_key": body["idempotency_key"],
        "lamport": body["lamport"],
        "causation_id": body["causation_id"],
        "correlation_id": body["correlation_id"],
        "trace_id": body["trace_id"],
        "recorded_at": body["recorded_at"],
        "prev_hash": body["prev_hash"],
        "hash": event.hash,
    }


def compute_hash(fields: dict[str, Any]) -> str:
    return canonical_sha256(fields)


# The stored columns the hash covers, in ``hashed_fields``' order.
HASHED_COLUMNS = (
    "task_id", "seq", "type", "payload", "agent", "idempotency_key", "lamport", "causation_id", "correlation_id",
    "trace_id", "recorded_at", "prev_hash",
)


def stored_row_hash(row: Sequence[Any]) -> str:
    """An event's hash recomputed from its stored columns (``HASHED_COLUMNS``, in order), the
    payload as the JSON text PostgreSQL returns: what the verifiers read in bulk, without
    building model instances."""
    fields = dict(zip(HASHED_COLUMNS, row, strict=True))
    fields["task_id"] = str(fields["task_id"])
    fields["payload"] = json.loads(fields["payload"])
    return compute_hash(hashed_fields(**fields))


def api_event_hash(api_event: dict[str, Any]) -> str:
    """Recompute an event's hash from its API JSON, exactly as an outside verifier would."""
    return canonical_sha256({k: v for k, v in api_event.items() if k not in UNHASHED_FIELDS})
