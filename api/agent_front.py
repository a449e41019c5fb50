"""The agent routes on the HTTP front: every request of an agent (a bearer token) to a route
declared as an ``AgentRoute`` (api/routes.py: a task, its events, appends and batches, claims,
heartbeats, tool calls and their results), served without Django's request stack.

The HTTP front (backplane/asgi.py) hands such a request to the routes here; every other request
on the same paths (a staff session, or nobody) goes to Django, where the route's DRF view
(``AgentRoute.cls``) answers it. An answer is the same whichever stack gives it
(tests/api/test_agent_front.py compares them): the routes are read from Django's URLconf, each
operation is the same ``Operation`` (its body checked against its declaration in api/bodies.py,
then its handler), the reads run the selectors' SQL, and the errors go through
``errors.error_parts``.

Each request, in the order Django's middleware and DRF's view take the same steps:

1. HTTPS where it is required (403), no U+0000 in the path or the query (400), the body within
   ``BACKPLANE_PAYLOAD_LIMIT_BYTES`` whether its length is declared or it arrives chunked (413),
   the database gate (503 at once while the database is known to be down), the host against
   ``ALLOWED_HOSTS`` (400);
2. DRF's content negotiation: 406 for an ``Accept`` that JSON does not satisfy, 404 for a
   ``?format=`` other than json;
3. the token's agent and the request's count in one statement (401, 429), then
   ``last_seen_at`` when it is stale, on psycopg's async pool (backplane/runtime/async_pool.py);
4. the method (405; OPTIONS is 204), then the operation: a read of a task, a page of its
   events, a page of the task list (but with a replica configured) or a tool call's record on
   the same async connection; a write has its body checked here; a task's create and
   an append that is a quiet write (backplane/eventlog/async_services.py), a claim, a heartbeat
   and a release (recovery/leases.py), a new tool call and its first answer
   (recovery/tool_calls.py), a new sub-task (recovery/subtasks.py) and a fork
   (backplane/eventlog/forks.py) are written on the same connection too, and any other write
   (or one of those handed off: ``HandOff``) has its handler (the services, and the one writer
   behind them) run on a thread of the web process's pool, with a Django
   connection managed as Django manages one around a request. A read that may wait for a
   change (an approval request's decision, a signal) waits on the loop first, holding no connection
   between its looks. A database that went away is 503 and closes the gate; any other
   database error is the contract's 500;
5. the headers Django's stack adds (``Allow``, the security headers), the server span, and the
   request counted on /metrics under its route's name.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, cast

import psycopg
import psycopg_pool
from django.conf import settings
from django.db import DatabaseError, OperationalError, close_old_connections
from django.http import QueryDict
from django.http.request import split_domain_port, validate_host
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.encoding import iri_to_uri
from django.utils.http import parse_header_parameters
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import JSONRenderer
from starlette.concurrency import run_in_threadpool
from starlette.convertors import StringConvertor, UUIDConvertor, register_url_convertor
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from api import bodies
from api.approvals import approval_read, awaiting_answer, read_wait_seconds
from api.authentication import (
    AGENT_COUNTED_SQL,
    NOTE_SEEN_SQL,
    WWW_AUTHENTICATE,
    Principal,
    agent_lookup,
    bearer_token_of,
    note_seen_params,
)
from api.base import Answer, json_bytes, query_int, written_or_replayed_answer
from api.errors import error_parts
from api.forks import task_fork
from api.middleware import (
    bad_request_error,
    https_only_error,
    invalid_length_error,
    nul_in_query_error,
    too_large_error,
)
from api.parsers import InvalidJSON, charset_refused, loads_strict
from api.recovery import (
    claim_answer,
    dispatch_answer,
    heartbeat_answer,
    lease_claim,
    lease_heartbeat,
    lease_release,
    result_answer,
    subtask_answer,
    subtask_dispatch,
    tool_call_as_api_dict,
    tool_call_dispatch,
    tool_call_read,
    tool_call_result,
)
from api.routes import AgentRoute, Operation
from api.serializers import task_as_api_dict
from api.signals import signal_read
from api.views import (
    draft_from,
    event_append,
    event_append_batch,
    events_page,
    task_create,
    task_list,
    task_list_answer,
    task_list_filters,
    task_read,
)
from backplane.eventlog import forks, selectors
from backplane.eventlog.async_services import HandOff, event_append_batch_async, task_create_async
from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.services import AppendOutcome
from backplane.eventlog.writer import EventDraft
from backplane.privacy.sealing import seal_personal_async
from backplane.runtime.async_pool import async_pool_renew, pooled_connection
from backplane.runtime.database_gate import RETRY_AFTER_SECONDS, gate, is_connection_failure, unavailable_body
from backplane.runtime.replica import replica_configured
from backplane.telemetry.http import count_response
from backplane.telemetry.tracing import server_span
from recovery import leases, subtasks, tool_calls
from recovery.errors import ApprovalPending
from recovery.selectors import APPROVAL_STATUS_SQL, SIGNAL_STATUS_SQL, TOOL_CALL_VISIBLE_SQL, tool_call_from

JSON = "application/json"


class DjangoUUIDConvertor(UUIDConvertor):
    """A UUID as Django's ``<uuid:...>`` takes it: lowercase, with its dashes (Starlette's own
    also takes uppercase and no dashes, which Django answers 404), so a path is matched by one
    stack exactly when the other would match it."""

    regex = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


class DjangoSlugConvertor(StringConvertor):
    """Django's ``<slug:...>``, which Starlette has no convertor for."""

    regex = "[-a-zA-Z0-9_]+"


register_url_convertor("django_uuid", DjangoUUIDConvertor())
register_url_convertor("django_slug", DjangoSlugConvertor())
# Django's path converters as Starlette writes them (``str`` is ``[^/]+`` in both), and a
# parameter of a Django route as django.urls.resolvers reads one.
_CONVERTORS = {"uuid": ":django_uuid", "slug": ":django_slug", "str": ""}
_DJANGO_PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<parameter>[^>]+)>")


def _has_bearer(scope: Scope) -> bool:
    return any(name == b"authorization" and value[:7].lower() == b"bearer " for name, value in scope["headers"])


class AgentTokenRoute(Route):
    """A route that takes only an agent's request: one with a bearer token, whatever its method
    (an unknown one is this route's 405). Anything else on its path is no match here, so the front
    hands it to Django."""

    def __init__(self, path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        super().__init__(path, endpoint)
        self.methods = None  # every method is the route's to answer (Starlette's default: GET)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or not _has_bearer(scope):
            return Match.NONE, {}
        return super().matches(scope)


# --- the reads, on the event loop ---------------------------------------------------------------

Read = Callable[[psycopg.AsyncConnection[Any], Principal, Request], Awaitable[Answer]]


async def _task_read(conn: psycopg.AsyncConnection[Any], principal: Principal, request: Request) -> Answer:
    task_id: uuid.UUID = request.path_params["task_id"]
    row = await (await conn.execute(selectors.TASK_ROW_SQL, [task_id])).fetchone()
    return Answer(task_as_api_dict(selectors.task_row_from(row, namespace=principal.namespace, task_id=task_id)))


async def _events_page(conn: psycopg.AsyncConnection[Any], principal: Principal, request: Request) -> Answer:
    task_id: uuid.UUID = request.path_params["task_id"]
    query = request.query_params
    after_seq = query_int(query, "after_seq", default=0, minimum=0)
    limit = query_int(query, "limit", default=100, minimum=1, maximum=1000)
    params = selectors.event_page_params(task_id=task_id, after_seq=after_seq, limit=limit)
    rows = await (await conn.execute(selectors.EVENT_PAGE_SQL, params)).fetchall()
    page = selectors.event_page_from(rows, namespace=principal.namespace, task_id=task_id, limit=limit)
    return Answer({"results": [event_as_api_dict(e) for e in page.events], "next_after_seq": page.next_after_seq})


async def _task_list(conn: psycopg.AsyncConnection[Any], principal: Principal, request: Request) -> Answer:
    if replica_configured():
        raise HandOff  # a list may come from the replica (api/views.py), which this pool does not reach
    query = QueryDict(request.scope["query_string"].decode("latin-1"))
    filters = task_list_filters(principal, query)
    rows = await (await conn.execute(*selectors.task_page_query(**filters))).fetchall()
    return task_list_answer(selectors.task_page_from(rows, limit=filters["limit"]), query, url=_absolute_url(request))


async def _tool_call_read(conn: psycopg.AsyncConnection[Any], principal: Principal, request: Request) -> Answer:
    key: str = request.path_params["key"]
    found = await conn.execute(TOOL_CALL_VISIBLE_SQL, {"key": key, "namespace": principal.namespace})
    return Answer(tool_call_as_api_dict(tool_call_from(await found.fetchone(), key=key)))


# The operations that read on the event loop, by the handler Django's stack runs for them: the
# same SQL, the same rows made into the same bodies.
_ON_THE_LOOP: dict[Callable[..., Answer], Read] = {task_read: _task_read, events_page: _events_page,
                                                   task_list: _task_list, tool_call_read: _tool_call_read}


# --- waits, on the event loop -------------------------------------------------------------------

# How often a waiting read looks again: each look takes a pool connection for one short query and
# gives it back, so a thousand agents waiting hold no thread and no connection between looks.
WAIT_POLL_SECONDS = 0.25


async def _wait_while(request: Request, sql: str, params: dict[str, Any], waiting: str) -> None:
    """Return once the status ``sql`` reads is no longer ``waiting`` (or there is no row: the
    handler answers 404), after the request's ``wait`` seconds, or when the client has gone."""
    wait = read_wait_seconds(QueryDict(request.scope["query_string"].decode("latin-1")))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        async with pooled_connection() as conn:
            row = await (await conn.execute(sql, params)).fetchone()
        remaining = deadline - loop.time()
        if row is None or row[0] != waiting or remaining <= 0 or await request.is_disconnected():
            return
        await asyncio.sleep(min(WAIT_POLL_SECONDS, remaining))


async def _wait_for_decision(principal: Principal, request: Request) -> None:
    """An agent's ``approvals_read?wait=N``: until its request is no longer pending."""
    await _wait_while(request, APPROVAL_STATUS_SQL, {"approval_id": request.path_params["approval_id"],
                                                     "namespace": principal.namespace}, "pending")


async def _wait_for_signal(principal: Principal, request: Request) -> None:
    """An agent's ``tasks_signals_read?wait=N``: until the signal is no longer awaited."""
    await _wait_while(request, SIGNAL_STATUS_SQL, {"task_id": request.path_params["task_id"],
                                                   "name": request.path_params["name"],
                                                   "namespace": principal.namespace}, "waiting")


# The reads that may wait for a change first, by their handler: the wait runs on the loop with no
# connection held between its looks, then the handler answers as it does on Django's stack.
_WAITS: dict[Callable[..., Answer], Callable[[Principal, Request], Awaitable[None]]] = {
    approval_read: _wait_for_decision, signal_read: _wait_for_signal}


# --- the appends, on the event loop -------------------------------------------------------------

Write = Callable[[psycopg.AsyncConnection[Any], Principal, dict[str, Any], Request], Awaitable[Answer]]


async def _append(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any], request: Request,
                  drafts: list[EventDraft]) -> AppendOutcome:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    return await event_append_batch_async(
        conn, namespace=principal.namespace, task_id=request.path_params["task_id"], drafts=drafts,
        agent=principal.name, expected_seq=data.get("expected_seq"), lease_epoch=data.get("lease_epoch"),
        kinds=principal.kinds)


async def _event_append(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                        request: Request) -> Answer:
    outcome = await _append(conn, principal, data, request, [draft_from(data)])
    return written_or_replayed_answer(event_as_api_dict(outcome.events[0]), replayed=False)


async def _event_append_batch(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                              request: Request) -> Answer:
    outcome = await _append(conn, principal, data, request, [draft_from(item) for item in data["events"]])
    return written_or_replayed_answer({"results": [event_as_api_dict(e) for e in outcome.events]}, replayed=False)


async def _task_create(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                       request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    task = await task_create_async(
        conn, namespace=principal.namespace, kind=data["kind"], input=data["input"], agent=principal.name,
        task_id=data.get("task_id"), parent_task_id=data.get("parent_task_id"),
        max_attempts=data.get("max_attempts"), metadata=data.get("metadata"), kinds=principal.kinds)
    return written_or_replayed_answer(task_as_api_dict(task), replayed=False)


async def _claim(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                 request: Request) -> Answer:
    assert principal.agent is not None  # agents_only
    return claim_answer(await leases.lease_claim_async(
        conn, agent=principal.agent, kinds=data.get("kinds"),
        lease_seconds=data.get("lease_seconds", settings.BACKPLANE_LEASE_SECONDS), task_id=data.get("task_id")))


async def _heartbeat(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                     request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    return heartbeat_answer(await leases.lease_heartbeat_async(
        conn, namespace=principal.namespace, task_id=request.path_params["task_id"],
        lease_epoch=data["lease_epoch"], agent=principal.name))


async def _release(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                   request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    return Answer(task_as_api_dict(await leases.lease_release_async(
        conn, namespace=principal.namespace, task_id=request.path_params["task_id"],
        lease_epoch=data["lease_epoch"], agent=principal.name)))


async def _tool_call_dispatch(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                              request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    try:
        call = await tool_calls.tool_call_dispatch_async(
            conn, namespace=principal.namespace, task_id=request.path_params["task_id"], step=data["step"],
            tool=data["tool"], input=data["input"], agent=principal.name, lease_epoch=data.get("lease_epoch"),
            compensation=dict(data["compensation"]) if data.get("compensation") else None, kinds=principal.kinds,
            reason=data.get("reason", ""))
    except ApprovalPending as pending:
        return awaiting_answer(pending.request)
    return dispatch_answer(tool_calls.ToolCallOutcome(call=call, replayed=False))


async def _tool_call_result(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                            request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    call = await tool_calls.tool_call_record_result_async(
        conn, namespace=principal.namespace, key=request.path_params["key"], status=data["status"],
        result=data["result"], agent=principal.name, lease_epoch=data.get("lease_epoch"), cost=data.get("cost"),
        kinds=principal.kinds)
    return result_answer(tool_calls.ToolCallOutcome(call=call, replayed=False))


async def _subtask_dispatch(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                            request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    child = await subtasks.subtask_dispatch_async(
        conn, namespace=principal.namespace, parent_task_id=request.path_params["task_id"], step=data["step"],
        kind=data["kind"], input=data["input"], agent=principal.name, lease_epoch=data.get("lease_epoch"),
        kinds=principal.kinds)
    assert child.dispatch_key is not None
    return subtask_answer(subtasks.SubtaskOutcome(child=child, dispatch_key=child.dispatch_key, created=True))


async def _task_fork(conn: psycopg.AsyncConnection[Any], principal: Principal, data: dict[str, Any],
                     request: Request) -> Answer:
    assert principal.namespace is not None and principal.name is not None  # an agent's token
    task = await forks.task_fork_async(
        conn, namespace=principal.namespace, source_task_id=request.path_params["task_id"], at_seq=data["at_seq"],
        reason=data["reason"], forked_by=principal.name, input=data.get("input"), task_id=data.get("task_id"),
        sandbox=data.get("sandbox", False),
        tool_answers=[forks.ToolAnswer(**answer) for answer in data.get("tool_answers", [])])
    return written_or_replayed_answer(task_as_api_dict(task), replayed=False)


# The writes the event loop makes itself, by the handler Django's stack runs for them: creates and
# quiet appends (eventlog/async_services.py), claims, heartbeats and releases (recovery/leases.py),
# new tool calls and their first answers (recovery/tool_calls.py), new sub-tasks
# (recovery/subtasks.py) and forks (eventlog/forks.py); any other, and any of these that hands
# off (``HandOff``), goes to that handler.
_WRITES_ON_THE_LOOP: dict[Callable[..., Answer], Write] = {task_create: _task_create,
                                                           event_append: _event_append,
                                                           event_append_batch: _event_append_batch,
                                                           lease_claim: _claim,
                                                           lease_heartbeat: _heartbeat,
                                                           lease_release: _release,
                                                           tool_call_dispatch: _tool_call_dispatch,
                                                           tool_call_result: _tool_call_result,
                                                           subtask_dispatch: _subtask_dispatch,
                                                           task_fork: _task_fork}


# --- what every request goes through ------------------------------------------------------------


def _allowed_hosts() -> list[str]:
    # As Django's HttpRequest.get_host() reads the setting.
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def _is_secure(request: Request) -> bool:
    # As Django's HttpRequest.is_secure(): the proxy's header when one is configured, else the scheme.
    if settings.SECURE_PROXY_SSL_HEADER:
        name, expected = settings.SECURE_PROXY_SSL_HEADER
        value = request.headers.get(name.removeprefix("HTTP_").replace("_", "-"))
        if value is not None:
            return value.split(",", 1)[0].strip() == expected
    return request.url.scheme == "https"


def _host(request: Request) -> str:
    # As Django's HttpRequest.get_host() reads it (before validating it).
    if settings.USE_X_FORWARDED_HOST and "x-forwarded-host" in request.headers:
        return request.headers["x-forwarded-host"]
    return request.headers.get("host", "")


def _absolute_url(request: Request) -> str:
    # As Django's HttpRequest.build_absolute_uri(request.path): the links an answer gives.
    scheme = "https" if _is_secure(request) else "http"
    return iri_to_uri(f"{scheme}://{_host(request)}{request.url.path}")


def _host_refused(request: Request) -> bool:
    domain, _ = split_domain_port(_host(request))
    return not domain or not validate_host(domain, _allowed_hosts())


def _refusal(request: Request) -> Response | None:
    """What api/middleware.py answers before anything else: plain http where HTTPS is required,
    U+0000 in the path or the query."""
    if settings.SECURE_SSL_REDIRECT and not _is_secure(request):
        if _host_refused(request):
            return _middleware_json(bad_request_error(), 400)
        return _middleware_json(https_only_error(str(request.url).replace("http://", "https://", 1)), 403)
    if "\x00" in request.url.path or any("\x00" in key or "\x00" in value
                                         for key, value in request.query_params.multi_items()):
        return _middleware_json(nul_in_query_error(), 400)
    return None


async def _body_or_refusal(request: Request) -> tuple[bytes, Response | None]:
    """The body, read as api/middleware.py reads it: a declared length over the limit is 413
    before a byte is read, and a chunked body is read to at most one byte past the limit."""
    limit = settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
    raw_length = request.headers.get("content-length")
    try:
        declared = int(raw_length or 0)
    except ValueError:
        return b"", _middleware_json(invalid_length_error(), 400)
    if declared < 0:
        return b"", _middleware_json(invalid_length_error(), 400)
    if declared > limit:
        return b"", _middleware_json(too_large_error(limit), 413)
    if raw_length:
        return await request.body(), None
    if "chunked" not in request.headers.get("transfer-encoding", "").lower():
        return b"", None  # Django reads no body without a length
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        parts.append(part)
        size += len(part)
        if size > limit:
            return b"", _middleware_json(too_large_error(limit), 413)
    return b"".join(parts), None


async def _gate_or_host_refusal(request: Request) -> Response | None:
    """What Django's middleware answers next, in its order: the database gate, a host not allowed."""
    if gate.is_marked_down and await run_in_threadpool(gate.should_refuse):
        return _middleware_json(unavailable_body(), 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if _host_refused(request):
        return _middleware_json(bad_request_error(), 400)
    return None


def _json(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    if body is None:  # no body and no Content-Type, as api/routes.py renders None
        return Response(b"", status_code=status, headers=headers)
    return Response(json_bytes(body), status_code=status, headers=headers, media_type=JSON)


def _middleware_json(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    """An answer Django's middleware gives before any view, written as its JsonResponse writes
    one (``json.dumps``' own separators), not as the views' renderer."""
    return Response(json.dumps(body).encode(), status_code=status, headers=headers, media_type=JSON)


def _security_headers(request: Request) -> dict[str, str]:
    """The headers Django's SecurityMiddleware adds to every answer (it comes first)."""
    headers = {}
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers["X-Content-Type-Options"] = "nosniff"
    if settings.SECURE_REFERRER_POLICY:
        headers["Referrer-Policy"] = settings.SECURE_REFERRER_POLICY
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers["Cross-Origin-Opener-Policy"] = settings.SECURE_CROSS_ORIGIN_OPENER_POLICY
    if settings.SECURE_HSTS_SECONDS and _is_secure(request):
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        headers["Strict-Transport-Security"] = hsts
    return headers


async def _authenticated(conn: psycopg.AsyncConnection[Any], request: Request) -> Principal:
    token = bearer_token_of(request.headers["authorization"].encode("latin-1"))
    assert token is not None  # AgentTokenRoute takes only bearer requests
    lookup = agent_lookup(token)
    principal, credentials = lookup.principal(await (await conn.execute(AGENT_COUNTED_SQL, lookup.params)).fetchone())
    assert principal.agent is not None
    seen = note_seen_params(principal.agent)
    if seen is not None:
        await conn.execute(NOTE_SEEN_SQL, seen)
    if credentials.wait is not None:
        raise exceptions.Throttled(credentials.wait)
    return principal


def _as_django_error(exc: psycopg.Error | psycopg_pool.PoolTimeout) -> DatabaseError:
    """A psycopg error as Django's backend raises it (its cause kept), for ``error_parts``: a
    lost database is 503 and closes the gate, any other the contract's 500."""
    wrapped = (OperationalError if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolTimeout)
               else DatabaseError)(str(exc))
    wrapped.__cause__ = exc
    return wrapped


def _as_in_a_request(handler: Callable[..., Answer], *args: Any, **kwargs: Any) -> Answer:
    """A handler run on a thread as Django runs a view: the thread's connection closed before
    and after when it is obsolete or broken (``request_started`` and ``request_finished``), so a
    pooled one goes back to the pool with the request."""
    close_old_connections()
    try:
        return handler(*args, **kwargs)
    finally:
        close_old_connections()


class FrontRoute:
    """One ``AgentRoute`` of the URLconf as the front serves it to agents."""

    def __init__(self, route: AgentRoute, *, executor: Executor) -> None:
        self.route = route
        self.executor = executor

    async def answer(self, request: Request) -> Response:
        refusal = _refusal(request)
        raw = b""
        if refusal is None:
            try:
                raw, refusal = await _body_or_refusal(request)
            except ClientDisconnect:
                # The client is gone: nobody reads this answer, and nothing was done.
                refusal = _middleware_json(bad_request_error(), 400)
        refusal = refusal or await _gate_or_host_refusal(request)
        if refusal is not None:
            # Given before the view: without the route's Allow, and before XFrameOptionsMiddleware.
            return refusal
        try:
            response = await self._operation(request, raw)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            error = _as_django_error(exc)
            if is_connection_failure(error):
                await async_pool_renew()
            response = _error(error)
        except Exception as exc:  # noqa: BLE001 - _error answers API errors and re-raises anything else
            response = _error(exc)
        response.headers.update({"Allow": self.route.allow, "X-Frame-Options": settings.X_FRAME_OPTIONS})
        return response

    async def _operation(self, request: Request, raw: bytes) -> Response:
        # As DRF's view decides: whether JSON is acceptable (406), then who is calling before
        # which method, so a stranger learns nothing.
        _NEGOTIATION.select_renderer(cast(Any, request), _RENDERERS)  # reads its headers and query only
        method = "GET" if request.method == "HEAD" else request.method
        async with pooled_connection() as conn:
            principal = await _authenticated(conn, request)
            if not self.route.permission().allows(principal, method):
                raise exceptions.PermissionDenied(self.route.permission.message)
            operation = self.route.operations.get(method)
            if operation is None:
                if method == "OPTIONS":  # what the route allows: the Allow header
                    return _json(None, 204)
                raise exceptions.MethodNotAllowed(request.method)  # a HEAD is named as sent
            read = _ON_THE_LOOP.get(operation.handler)
            if read is not None:
                try:
                    answer = await read(conn, principal, request)
                except HandOff:
                    pass  # the handler reads it
                else:
                    return _json(answer.body, answer.status, answer.headers)
            data = self._data(operation, request, raw)
            if operation.body is not None:
                data = await seal_personal_async(conn, principal.namespace, data)
            write = _WRITES_ON_THE_LOOP.get(operation.handler)
            if write is not None:
                try:
                    written = await write(conn, principal, data, request)
                except HandOff:
                    pass  # rolled back before anything was written: the handler decides it anew
                else:
                    return _json(written.body, written.status, written.headers)
        waiting = _WAITS.get(operation.handler)
        if waiting is not None:
            await waiting(principal, request)
        # Any other write: the pool's connection is back before the handler takes a Django one.
        answer = await self._run(operation, principal, request, data)
        return _json(answer.body, answer.status, answer.headers)

    @staticmethod
    def _data(operation: Operation, request: Request, raw: bytes) -> Any:
        if operation.body is None:
            # The query as Django parses it into request.GET, for the same handler.
            return QueryDict(request.scope["query_string"].decode("latin-1"))
        return _validated_body(operation, raw, request.headers.get("content-type", ""))

    async def _run(self, operation: Operation, principal: Principal, request: Request, data: Any) -> Answer:
        kwargs = dict(request.path_params)
        if operation.with_url:
            kwargs["url"] = _absolute_url(request)
        call = functools.partial(_as_in_a_request, operation.handler, principal, data, **kwargs)
        # In this request's context (its trace, which the events it writes carry).
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self.executor, context.run, call)


def _validated_body(operation: Operation, raw: bytes, content_type: str) -> dict[str, Any]:
    """The request's body as the operation takes it, as DRF's StrictJSONParser and
    ``bodies.checked`` take it on Django: ``application/json`` in UTF-8 (else 415), the strict
    parser (400), then its declaration (400)."""
    if not raw:
        body: Any = {}  # as DRF reads an empty body, whatever its type: every required field is missing
    else:
        media_type, params = parse_header_parameters(content_type)
        if media_type != "application/json" or charset_refused(params.get("charset")):
            raise exceptions.UnsupportedMediaType(content_type)
        try:
            body = loads_strict(raw)
        except InvalidJSON as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
    assert operation.body is not None  # only an operation with a body is given one
    return bodies.checked(operation.body, body)


# DRF's content negotiation, as the route's DRF view runs it: an ``Accept`` that JSON does not
# satisfy is 406, a ``?format=`` other than json 404. It reads only the request's headers and query.
_NEGOTIATION = DefaultContentNegotiation()
_RENDERERS = [JSONRenderer()]


def _error(exc: Exception) -> Response:
    parts = error_parts(exc)
    if parts is None:
        raise exc
    status, body, headers = parts
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        headers = {**headers, "WWW-Authenticate": WWW_AUTHENTICATE}
    return _json(body, status, headers)


def _endpoint(served: FrontRoute, *, view: str, route: str) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one route: ``view`` names it on /metrics and ``route`` on its span, as
    Django's URL name and route name the same path when Django serves it."""

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        with server_span(f"{request.method} {route}", traceparent_header=request.headers.get("traceparent"),
                         attributes={"http.method": request.method, "http.route": route}):
            response = await served.answer(request)
        response.headers.update(_security_headers(request))
        if request.method == "HEAD":
            # As DRF's view answers a HEAD: the GET's headers, its Content-Length too, no body.
            response.body = b""
        count_response(view=view, method=request.method, status=response.status_code,
                       seconds=time.perf_counter() - started)
        return response

    return endpoint


def _agent_routes(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, str, AgentRoute]]:
    """Every URL of the URLconf whose view is an ``AgentRoute``: its route, its name, the view."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _agent_routes(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern) and isinstance(pattern.callback, AgentRoute):
            yield prefix + str(pattern.pattern), pattern.name or "", pattern.callback


def _starlette_path(django_route: str) -> str:
    """``api/v1/tasks/<uuid:task_id>/`` as Starlette writes it: ``/api/v1/tasks/{task_id:django_uuid}/``."""

    def parameter(match: re.Match[str]) -> str:
        converter = match["converter"] or "str"
        if converter not in _CONVERTORS:
            raise ValueError(f"an agent route's converter is not known to the front: {django_route}")
        return "{" + match["parameter"] + _CONVERTORS[converter] + "}"

    return "/" + _DJANGO_PARAMETER.sub(parameter, django_route)


def agent_routes(executor: Executor) -> list[Route]:
    """The front's routes: one for each ``AgentRoute`` in Django's URLconf, on its path; writes
    run their handlers on ``executor``'s threads (the web process's pool, backplane/asgi.py)."""
    return [
        AgentTokenRoute(_starlette_path(django_route),
                        _endpoint(FrontRoute(route, executor=executor), view=name, route=django_route))
        for django_route, name, route in _agent_routes(get_resolver().url_patterns)
    ]
