"""The floor of the product's single append over HTTP: its own statements on its own tables, sent
by the leanest stack measured (a bare ASGI callable, msgspec, the product's async psycopg pool),
with none of the product's Python between them.

    DATABASE_URL=... .venv/bin/python -m uvicorn --app-dir bench append_floor:app --no-access-log

``make bench`` (bench/http_bench.py, its ``append_floor`` phase) serves it beside the product, on
the product's database and server, and drives it with the product's append script (append.lua:
the same token, tasks of their own, the same body) right after the product's own appends, and
with its batch script (batch.lua) right after the product's batches. It
answers ``POST /api/v1/tasks/<uuid>/events/`` with 201 and the event (and ``.../events/batch/``,
``{"events": [...]}``, with the events: batch.lua's 100), after the statements the agent front
sends for that request, in the same order on the same kind of connection:

1. ``AGENT_COUNTED_SQL``: the token's agent and the rate limit's count (autocommit);
2. ``BEGIN``, then ``LOCK_TASK_IN_NAMESPACE_SQL``: the task's row, locked, in the agent's namespace;
3. ``insert_events_sql()``: the event, the task's projection and the rollups (none here);
4. ``COMMIT``.

What it leaves out is the product's Python: the token's constant-time compare, the lease and kind
checks, the writer's plan (the hash here is sha256 over msgspec's sorted encoding, not RFC 8785's),
the reducer (a ``Noted`` event moves only the head), models, metrics, spans, the observers, and
the answer's rendering through DRF's rules. So its rate bounds what any Python code sending these
statements can serve on this machine: the product's append against it is what the product's own
work costs, and it against pgbench's append is what the statements and tables cost.
The events it writes are not on the product's chain (their hashes are not the product's), which is
why the bench gives it tasks of its own.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")

import django  # noqa: E402 - the product's statements are built from its models

django.setup()

from ingress_apps import Receive, Rejected, Scope, Send, header, read_body, send_json  # noqa: E402 - bench/, beside it

from api.authentication import AGENT_COUNTED_SQL  # noqa: E402
from api.throttling import counter_key, current_window  # noqa: E402
from backplane.eventlog.models import Agent, hash_token  # noqa: E402
from backplane.eventlog.reducer import REDUCED_FIELDS  # noqa: E402
from backplane.eventlog.writer import LOCK_TASK_IN_NAMESPACE_SQL, TASK_ROWS, insert_events_sql  # noqa: E402
from backplane.lib.sql_rows import RowLoader  # noqa: E402
from backplane.runtime.async_pool import async_pool  # noqa: E402

PREFIX = "/api/v1/tasks/"
SUFFIX = "/events/"
BATCH_SUFFIX = "/events/batch/"
# The agent's row as AGENT_COUNTED_SQL selects it (its loader's columns), then the count.
AGENT_COLUMN = {name: index for index, name in enumerate(RowLoader(Agent).attnames)}
TASK_COLUMN = {name: index for index, name in enumerate(TASK_ROWS.attnames)}
COUNTER_PREFIX = counter_key("agent:")
INSERT_EVENTS_SQL = insert_events_sql()
NO_ROLLUPS = "[]"
ENCODE = msgspec.json.encode
SORTED = msgspec.json.Encoder(order="sorted")


class EventIn(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    payload: dict[str, Any]
    idempotency_key: str | None = None
    lease_epoch: int | None = None


class BatchIn(msgspec.Struct, forbid_unknown_fields=True):
    events: list[EventIn]
    lease_epoch: int | None = None


DECODE = msgspec.json.Decoder(EventIn).decode
DECODE_BATCH = msgspec.json.Decoder(BatchIn).decode


def projection(task: tuple[Any, ...], *, seq: int, digest: str, lamport: int, now: datetime) -> dict[str, Any]:
    """The task's reduced columns after ``Noted`` events: its head moved, the rest as locked."""
    row = {name: task[TASK_COLUMN[name]] for name in REDUCED_FIELDS}
    row.update(id=task[TASK_COLUMN["id"]], last_seq=seq, head_hash=digest, lamport=lamport, last_event_at=now,
               updated_at=now)
    return row


async def append(task_id: uuid.UUID, token: str, events: list[EventIn]) -> list[dict[str, Any]]:
    """The events recorded on the task, after the agent front's statements (the module's 1-4)."""
    window = current_window()
    pool = await async_pool()
    async with pool.connection() as conn:
        found = await (await conn.execute(AGENT_COUNTED_SQL, [hash_token(token), COUNTER_PREFIX,
                                                              window.expires])).fetchone()
        if found is None:
            raise Rejected(401, "invalid or inactive token")
        name, namespace = found[AGENT_COLUMN["name"]], found[AGENT_COLUMN["namespace"]]
        async with conn.transaction():
            task = await (await conn.execute(LOCK_TASK_IN_NAMESPACE_SQL, [task_id, namespace])).fetchone()
            if task is None:
                raise Rejected(404, "task not found")
            now = datetime.now(UTC)
            seq, digest, lamport = task[TASK_COLUMN["last_seq"]], task[TASK_COLUMN["head_hash"]], task[
                TASK_COLUMN["lamport"]]
            recorded = []
            for event in events:
                seq, lamport, prev_hash = seq + 1, lamport + 1, digest
                digest = hashlib.sha256(SORTED.encode(event) + prev_hash.encode()).hexdigest()
                recorded.append({
                    "task_id": task_id, "seq": seq, "type": event.type, "payload": event.payload, "agent": name,
                    "idempotency_key": event.idempotency_key, "request_digest": None, "lamport": lamport,
                    "causation_id": None, "correlation_id": None, "trace_id": None, "span_id": None,
                    "recorded_at": now, "prev_hash": prev_hash, "hash": digest,
                })
            touched = [projection(task, seq=seq, digest=digest, lamport=lamport, now=now)]
            await (await conn.execute(INSERT_EVENTS_SQL, [ENCODE(recorded).decode(), ENCODE(touched).decode(),
                                                          NO_ROLLUPS])).fetchall()
    return recorded


def decoded(raw: bytes, batch: bool) -> list[EventIn]:
    try:
        return DECODE_BATCH(raw).events if batch else [DECODE(raw)]
    except msgspec.DecodeError as exc:
        raise Rejected(400, str(exc)) from None


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    try:
        if path == "/healthz":
            await send_json(send, 200, b'{"status":"ok"}')
            return
        batch = path.endswith(BATCH_SUFFIX)
        suffix = BATCH_SUFFIX if batch else SUFFIX
        if scope["method"] != "POST" or not (path.startswith(PREFIX) and path.endswith(suffix)):
            raise Rejected(404, "not found")
        try:
            task_id = uuid.UUID(path[len(PREFIX):-len(suffix)])
        except ValueError:
            raise Rejected(404, "not found") from None
        scheme, _, token = (header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Rejected(401, "a bearer token is required")
        recorded = await append(task_id, token.strip(), decoded(await read_body(receive), batch))
        await send_json(send, 201, ENCODE(recorded if batch else recorded[0]))
    except Rejected as rejected:
        await send_json(send, rejected.status, ENCODE(rejected.body))
