"""Candidate ASGI stacks for the agent routes, side by side: one module-level app per candidate.

Measured by bench/ingress_stack.py, which serves each alone under the same uvicorn flags:

    .venv/bin/python -m uvicorn --app-dir bench ingress_apps:starlette_msgspec_db \\
        --no-access-log --lifespan on --loop uvloop --http httptools --port 8700

Every candidate serves the same two routes with the same answers:

- ``GET /healthz`` -> 200 ``{"status":"ok"}``
- ``POST /tasks/{task_id}/events/`` with ``{"type": "Noted", "payload": {...}}`` (optional
  ``idempotency_key`` string of at most 200, optional ``lease_epoch`` integer >= 0, nothing else):
  ``Authorization: Bearer $BENCH_TOKEN`` or 401, ``application/json`` or 415, a body that fails
  validation 400; then 201 with the recorded event. The event's hash is sha256 of the body's
  canonical JSON (``json.dumps`` sorted, compact) followed by the previous hash.

Candidates: ``bare`` (a hand-written ASGI callable, stdlib json: the floor), ``starlette_json``,
``starlette_msgspec``, ``starlette_pydantic`` (no database: seq 1 on an empty chain), and the database
variants ``starlette_msgspec_db`` (async psycopg pool), ``starlette_msgspec_db_pipeline`` (the same in two
round trips, psycopg's pipeline mode), ``starlette_msgspec_db_sync`` (a sync handler in Starlette's
threadpool on a sync pool) and ``bare_msgspec_db`` (the floor of the database path).
The database variants run bench/baselines/pgbench_append.sql's transaction (UPDATE tasks' head,
INSERT events, INSERT outbox, COMMIT) on bench/baselines/pgbench_schema.sql's tables, on a pool of
8 connections to ``$BENCH_DSN`` opened in the lifespan.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import psycopg_pool
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKEN = os.environ.get("BENCH_TOKEN", "")
AGENT = os.environ.get("BENCH_AGENT", "bench-agent")
POOL_SIZE = 8
TYPE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]*$"
TYPE_RE = re.compile(TYPE_PATTERN)
FIELDS = frozenset({"type", "payload", "idempotency_key", "lease_epoch"})
HEALTHZ = b'{"status":"ok"}'
JSON_TYPE = "application/json"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

# The transaction of pgbench_append.sql, four statements as there (psycopg sends BEGIN before the
# first). The head's RETURNING gives the hash before this event (head_hash is not changed there);
# the new head hash, computed in Python, rides on the outbox insert.
UPDATE_HEAD = "UPDATE tasks SET head_seq = head_seq + 1 WHERE id = %s RETURNING head_seq, head_hash"
INSERT_EVENT = "INSERT INTO events(task_id, seq, payload, prev_hash, hash) VALUES (%s, %s, %s, %s, %s)"
INSERT_OUTBOX = ("WITH head AS (UPDATE tasks SET head_hash = %s WHERE id = %s) "
                 "INSERT INTO outbox(task_id, seq, payload) VALUES (%s, %s, %s)")


class Rejected(Exception):
    """A request answered with an error: its status and JSON body."""

    def __init__(self, status: int, error: str, detail: str = "") -> None:
        super().__init__(error)
        self.status = status
        self.body = {"error": error, "detail": detail} if detail else {"error": error}


# --- what every candidate shares: the checks before the body, the hash, the answer -------------------


def check_headers(authorization: str | None, content_type: str | None) -> None:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not TOKEN or not hmac.compare_digest(token.strip(), TOKEN):
        raise Rejected(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
    if (content_type or "").split(";", 1)[0].strip().lower() != JSON_TYPE:
        raise Rejected(415, "unsupported media type", "the body must be application/json")


def canonical(event: dict[str, Any]) -> bytes:
    """The bytes the hash covers: the validated body, its unset optional fields left out."""
    present = {key: value for key, value in event.items() if value is not None}
    return json.dumps(present, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def chain_hash(body: bytes, prev_hash: str) -> str:
    return hashlib.sha256(body + prev_hash.encode()).hexdigest()


def answer(task_id: int, seq: int, event: dict[str, Any], body: bytes, prev_hash: str, digest: str) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "seq": seq,
        "type": event["type"],
        "payload": event["payload"],
        "hash": digest,
        "prev_hash": prev_hash,
        "recorded_at": datetime.now(UTC).isoformat(),
        "agent": AGENT,
        "idempotency_key": event.get("idempotency_key"),
        "lease_epoch": event.get("lease_epoch"),
    }


def record_without_db(task_id: int, event: dict[str, Any]) -> dict[str, Any]:
    """The no-database candidates: the first event of an empty chain."""
    body = canonical(event)
    return answer(task_id, 1, event, body, "", chain_hash(body, ""))


def task_id_of(value: str) -> int:
    if not value.isdigit() or len(value) > 18:
        raise Rejected(404, "not found", "no such task")
    return int(value)


# --- validation: stdlib json with hand checks ---------------------------------------------------------


def validate_plain(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Rejected(400, "invalid body", f"not JSON: {exc}")
    if not isinstance(data, dict):
        raise Rejected(400, "invalid body", "the body must be a JSON object")
    unknown = data.keys() - FIELDS
    if unknown:
        raise Rejected(400, "invalid body", f"unknown fields: {', '.join(sorted(unknown))}")
    kind = data.get("type")
    if not isinstance(kind, str) or not 1 <= len(kind) <= 100 or not TYPE_RE.match(kind):
        raise Rejected(400, "invalid body", f"type: a string of 1 to 100 characters matching {TYPE_PATTERN}")
    payload = data.get("payload")
    if not isinstance(payload, dict):
        raise Rejected(400, "invalid body", "payload: a JSON object is required")
    key = data.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or len(key) > 200):
        raise Rejected(400, "invalid body", "idempotency_key: a string of at most 200 characters")
    epoch = data.get("lease_epoch")
    if epoch is not None and (type(epoch) is not int or epoch < 0):
        raise Rejected(400, "invalid body", "lease_epoch: an integer >= 0")
    return {"type": kind, "payload": payload, "idempotency_key": key, "lease_epoch": epoch}


# --- validation: msgspec -------------------------------------------------------------------------------


class EventIn(msgspec.Struct, forbid_unknown_fields=True):
    type: Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=TYPE_PATTERN)]
    payload: dict[str, Any]
    idempotency_key: Annotated[str, msgspec.Meta(max_length=200)] | None = None
    lease_epoch: Annotated[int, msgspec.Meta(ge=0)] | None = None


EVENT_DECODER = msgspec.json.Decoder(EventIn)
ENCODE = msgspec.json.encode


def validate_msgspec(raw: bytes) -> dict[str, Any]:
    try:
        event = EVENT_DECODER.decode(raw)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise Rejected(400, "invalid body", str(exc))
    return {"type": event.type, "payload": event.payload, "idempotency_key": event.idempotency_key,
            "lease_epoch": event.lease_epoch}


# --- validation: pydantic v2 ---------------------------------------------------------------------------


class EventModel(BaseModel):
    # strict: no "1" for an integer, no true for 1, as msgspec and the hand checks.
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=TYPE_PATTERN)]
    payload: dict[str, Any]
    idempotency_key: Annotated[str, StringConstraints(max_length=200)] | None = None
    lease_epoch: Annotated[int, Field(ge=0)] | None = None


class EventOut(BaseModel):
    task_id: int
    seq: int
    type: str
    payload: dict[str, Any]
    hash: str
    prev_hash: str
    recorded_at: str
    agent: str
    idempotency_key: str | None
    lease_epoch: int | None


def validate_pydantic(raw: bytes) -> dict[str, Any]:
    try:
        event = EventModel.model_validate_json(raw)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise Rejected(400, "invalid body", detail)
    return {"type": event.type, "payload": event.payload, "idempotency_key": event.idempotency_key,
            "lease_epoch": event.lease_epoch}


# --- the append transaction ----------------------------------------------------------------------------


def outbox_payload(task_id: int, seq: int) -> str:
    return f'{{"task_id":{task_id},"seq":{seq}}}'


async def record_async(pool: psycopg_pool.AsyncConnectionPool, task_id: int, event: dict[str, Any]) -> dict[str, Any]:
    body = canonical(event)
    async with pool.connection() as conn:
        head = await (await conn.execute(UPDATE_HEAD, (task_id,))).fetchone()
        if head is None:
            await conn.rollback()
            raise Rejected(404, "not found", "no such task")
        seq, prev_hash = head
        digest = chain_hash(body, prev_hash)
        await conn.execute(INSERT_EVENT, (task_id, seq, body.decode(), prev_hash, digest))
        await conn.execute(INSERT_OUTBOX, (digest, task_id, task_id, seq, outbox_payload(task_id, seq)))
        await conn.commit()
    return answer(task_id, seq, event, body, prev_hash, digest)


async def record_pipelined(pool: psycopg_pool.AsyncConnectionPool, task_id: int,
                           event: dict[str, Any]) -> dict[str, Any]:
    """The same transaction in two round trips (psycopg's pipeline mode, on an autocommit
    connection that says BEGIN and COMMIT itself): BEGIN with the head's update, whose answer the
    hash needs; then both inserts and COMMIT."""
    body = canonical(event)
    async with pool.connection() as conn:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            cursor = await conn.execute(UPDATE_HEAD, (task_id,))
        head = await cursor.fetchone()
        if head is None:
            await conn.execute("ROLLBACK")
            raise Rejected(404, "not found", "no such task")
        seq, prev_hash = head
        digest = chain_hash(body, prev_hash)
        async with conn.pipeline():
            await conn.execute(INSERT_EVENT, (task_id, seq, body.decode(), prev_hash, digest))
            await conn.execute(INSERT_OUTBOX, (digest, task_id, task_id, seq, outbox_payload(task_id, seq)))
            await conn.execute("COMMIT")
    return answer(task_id, seq, event, body, prev_hash, digest)


def record_sync(pool: psycopg_pool.ConnectionPool, task_id: int, event: dict[str, Any]) -> dict[str, Any]:
    body = canonical(event)
    with pool.connection() as conn:
        head = conn.execute(UPDATE_HEAD, (task_id,)).fetchone()
        if head is None:
            conn.rollback()
            raise Rejected(404, "not found", "no such task")
        seq, prev_hash = head
        digest = chain_hash(body, prev_hash)
        conn.execute(INSERT_EVENT, (task_id, seq, body.decode(), prev_hash, digest))
        conn.execute(INSERT_OUTBOX, (digest, task_id, task_id, seq, outbox_payload(task_id, seq)))
        conn.commit()
    return answer(task_id, seq, event, body, prev_hash, digest)


def async_pool(*, autocommit: bool = False) -> psycopg_pool.AsyncConnectionPool:
    return psycopg_pool.AsyncConnectionPool(os.environ["BENCH_DSN"], min_size=POOL_SIZE, max_size=POOL_SIZE,
                                            kwargs={"autocommit": autocommit}, open=False)


def sync_pool() -> psycopg_pool.ConnectionPool:
    return psycopg_pool.ConnectionPool(os.environ["BENCH_DSN"], min_size=POOL_SIZE, max_size=POOL_SIZE,
                                       kwargs={"autocommit": False}, open=False)


# --- the bare ASGI callables ---------------------------------------------------------------------------


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Rejected(400, "invalid body", "the client went away")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def bare_app(validate: Callable[[bytes], dict[str, Any]], encode: Callable[[Any], bytes], *,
             with_db: bool) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A raw ASGI callable: routing by ``scope["path"]`` only; a pool opened in the lifespan if ``with_db``."""
    state: dict[str, psycopg_pool.AsyncConnectionPool] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if with_db:
                    state["pool"] = async_pool()
                    await state["pool"].open(wait=True)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if "pool" in state:
                    await state.pop("pool").close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        try:
            if path == "/healthz":
                if method != "GET":
                    raise Rejected(405, "method not allowed")
                await send_json(send, 200, HEALTHZ)
                return
            if not (path.startswith("/tasks/") and path.endswith("/events/")):
                raise Rejected(404, "not found")
            if method != "POST":
                raise Rejected(405, "method not allowed")
            task_id = task_id_of(path[len("/tasks/"):-len("/events/")])
            check_headers(header(scope, b"authorization"), header(scope, b"content-type"))
            event = validate(await read_body(receive))
            recorded = await record_async(state["pool"], task_id, event) if with_db else record_without_db(
                task_id, event)
            await send_json(send, 201, encode(recorded))
        except Rejected as rejected:
            await send_json(send, rejected.status, encode(rejected.body))

    return app


def json_bytes(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


bare = bare_app(validate_plain, json_bytes, with_db=False)
bare_msgspec_db = bare_app(validate_msgspec, ENCODE, with_db=True)


# --- the Starlette apps ----------------------------------------------------------------------------------


class MsgspecResponse(Response):
    media_type = JSON_TYPE

    def render(self, content: Any) -> bytes:
        return ENCODE(content)


class PydanticResponse(Response):
    media_type = JSON_TYPE

    def render(self, content: Any) -> bytes:
        if isinstance(content, BaseModel):
            return content.__pydantic_serializer__.to_json(content)
        return json_bytes(content)


def starlette_app(validate: Callable[[bytes], dict[str, Any]], respond: Callable[..., Response], *,
                  db: str = "", out: Callable[[dict[str, Any]], Any] = lambda recorded: recorded) -> Starlette:
    """Starlette's routing and requests; ``db``: "" (none), "async", "pipeline" (async in two round
    trips) or "sync" (the handler in the threadpool)."""

    async def healthz(request: Request) -> Response:
        return respond({"status": "ok"})

    def handle_sync(task_id: int, authorization: str | None, content_type: str | None, raw: bytes) -> Response:
        """What a ``def`` endpoint does (FastAPI's way): the body was read on the loop, the rest runs here."""
        try:
            check_headers(authorization, content_type)
            return respond(out(record_sync(pool["sync"], task_id, validate(raw))), status_code=201)
        except Rejected as rejected:
            return respond(rejected.body, status_code=rejected.status)

    async def append(request: Request) -> Response:
        task_id = request.path_params["task_id"]
        headers = request.headers
        if db == "sync":
            raw = await request.body()
            return await run_in_threadpool(handle_sync, task_id, headers.get("authorization"),
                                           headers.get("content-type"), raw)
        try:
            check_headers(headers.get("authorization"), headers.get("content-type"))
            event = validate(await request.body())
            if db == "pipeline":
                recorded = await record_pipelined(pool["async"], task_id, event)
            elif db:
                recorded = await record_async(pool["async"], task_id, event)
            else:
                recorded = record_without_db(task_id, event)
            return respond(out(recorded), status_code=201)
        except Rejected as rejected:
            return respond(rejected.body, status_code=rejected.status)

    pool: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if db in ("async", "pipeline"):
            pool["async"] = async_pool(autocommit=db == "pipeline")
            await pool["async"].open(wait=True)
        elif db == "sync":
            pool["sync"] = sync_pool()
            await run_in_threadpool(pool["sync"].open, wait=True)
        try:
            yield
        finally:
            if "async" in pool:
                await pool.pop("async").close()
            if "sync" in pool:
                await run_in_threadpool(pool.pop("sync").close)

    routes = [Route("/healthz", healthz, methods=["GET"]),
              Route("/tasks/{task_id:int}/events/", append, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan)


starlette_json = starlette_app(validate_plain, JSONResponse)
starlette_msgspec = starlette_app(validate_msgspec, MsgspecResponse)
starlette_pydantic = starlette_app(validate_pydantic, PydanticResponse, out=lambda recorded: EventOut(**recorded))
starlette_msgspec_db = starlette_app(validate_msgspec, MsgspecResponse, db="async")
starlette_msgspec_db_sync = starlette_app(validate_msgspec, MsgspecResponse, db="sync")
starlette_msgspec_db_pipeline = starlette_app(validate_msgspec, MsgspecResponse, db="pipeline")

CANDIDATES = ("bare", "starlette_json", "starlette_msgspec", "starlette_pydantic", "starlette_msgspec_db",
              "starlette_msgspec_db_sync", "starlette_msgspec_db_pipeline", "bare_msgspec_db")
WITH_DB = frozenset({"starlette_msgspec_db", "starlette_msgspec_db_sync", "starlette_msgspec_db_pipeline",
                     "bare_msgspec_db"})
