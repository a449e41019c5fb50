"""The agents' reads on the event loop: a task, and a page of its events, for a bearer token.

The HTTP front (backplane/asgi.py) hands a GET or HEAD that carries ``Authorization: Bearer`` on
these two paths to the routes here; every other request on them (a staff session, an append,
another method) goes to Django's agent routes (api/routes.py), which answer it as before. An
answer is the same whichever stack gives it (tests/api/test_agent_reads.py compares them): the
same statements (the selectors' SQL, the token's lookup and count), the same rows made into the
same bodies by the same functions, and the contract's errors through ``errors.error_parts``.

Each request, in the order Django's middleware and api/routes.py take the same steps:

1. HTTPS where it is required (403), no U+0000 in the query (400), the database gate (503 at
   once while the database is known to be down), the host against ``ALLOWED_HOSTS`` (400);
2. the token's agent and the request's count in one statement (401, 429), then
   ``last_seen_at`` when it is stale;
3. the read, on psycopg's async pool (backplane/runtime/async_pool.py): a database that went away
   is 503, closes the gate and renews the pool's idle connections; any other database error is
   the contract's 500;
4. the headers Django's stack adds (``Allow``, the security headers), the server span, and the
   request counted on /metrics under its route's name.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import psycopg_pool
from django.conf import settings
from django.db import DatabaseError, OperationalError
from django.http.request import split_domain_port, validate_host
from rest_framework import exceptions
from starlette.concurrency import run_in_threadpool
from starlette.convertors import UUIDConvertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from api.authentication import (
    AGENT_COUNTED_SQL,
    NOTE_SEEN_SQL,
    WWW_AUTHENTICATE,
    Principal,
    agent_lookup,
    bearer_token_of,
    note_seen_params,
)
from api.base import Answer, json_bytes, query_int
from api.errors import error_parts
from api.middleware import bad_request_error, https_only_error, nul_in_query_error
from api.serializers import event_as_api_dict, task_as_api_dict
from api.views import task_detail_route, task_events_route
from backplane.eventlog import selectors
from backplane.runtime.async_pool import async_pool, async_pool_renew
from backplane.runtime.database_gate import RETRY_AFTER_SECONDS, gate, is_connection_failure, unavailable_body
from backplane.telemetry.http import count_response
from backplane.telemetry.tracing import server_span

JSON = "application/json"
_READS = frozenset({"GET", "HEAD"})


class TaskIdConvertor(UUIDConvertor):
    """A UUID as Django's ``<uuid:...>`` takes it: lowercase, with its dashes (Starlette's own
    also takes uppercase and no dashes, which Django answers 404), so a path is matched by one
    stack exactly when the other would match it."""

    regex = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


register_url_convertor("task_id", TaskIdConvertor())


def _has_bearer(scope: Scope) -> bool:
    return any(name == b"authorization" and value[:7].lower() == b"bearer " for name, value in scope["headers"])


class AgentTokenRoute(Route):
    """A route that takes only an agent's read: a GET or HEAD with a bearer token. Anything else
    on its path is no match here, so the front hands it to Django."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope["method"] not in _READS or not _has_bearer(scope):
            return Match.NONE, {}
        return super().matches(scope)


# --- the two reads ------------------------------------------------------------------------------

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


# --- what every read goes through ---------------------------------------------------------------


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


def _host_refused(request: Request) -> bool:
    host = request.headers.get("x-forwarded-host" if settings.USE_X_FORWARDED_HOST else "host", "")
    domain, _ = split_domain_port(host)
    return not domain or not validate_host(domain, _allowed_hosts())


def _refusal(request: Request) -> Response | None:
    """What Django's middleware answers before any view: plain http where HTTPS is required and
    U+0000 in the query (api/middleware.py)."""
    if settings.SECURE_SSL_REDIRECT and not _is_secure(request):
        if _host_refused(request):
            return _middleware_json(bad_request_error(), 400)
        return _middleware_json(https_only_error(str(request.url).replace("http://", "https://", 1)), 403)
    if any("\x00" in key or "\x00" in value for key, value in request.query_params.multi_items()):
        return _middleware_json(nul_in_query_error(), 400)
    return None


async def _gate_or_host_refusal(request: Request) -> Response | None:
    """What Django's middleware answers next, in its order: the database gate, a host not allowed."""
    if gate.is_marked_down and await run_in_threadpool(gate.should_refuse):
        return _middleware_json(unavailable_body(), 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})
    if _host_refused(request):
        return _middleware_json(bad_request_error(), 400)
    return None


def _json(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
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


async def _answer(request: Request, read: Read, *, allow: str) -> Response:
    refusal = _refusal(request) or await _gate_or_host_refusal(request)
    if refusal is not None:
        # Given before the view: without the route's Allow, and before XFrameOptionsMiddleware.
        return refusal
    try:
        pool = await async_pool()
        async with pool.connection() as conn:
            principal = await _authenticated(conn, request)
            answer = await read(conn, principal, request)
        response = _json(answer.body, answer.status, answer.headers)
    except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
        error = _as_django_error(exc)
        if is_connection_failure(error):
            await async_pool_renew()
        response = _error(error)
    except Exception as exc:  # noqa: BLE001 - _error answers API errors and re-raises anything else
        response = _error(exc)
    response.headers.update({"Allow": allow, "X-Frame-Options": settings.X_FRAME_OPTIONS})
    return response


def _error(exc: Exception) -> Response:
    parts = error_parts(exc)
    if parts is None:
        raise exc
    status, body, headers = parts
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        headers = {**headers, "WWW-Authenticate": WWW_AUTHENTICATE}
    return _json(body, status, headers)


def _endpoint(read: Read, *, view: str, route: str, allow: str) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one read: ``view`` names it on /metrics and ``route`` on its span, as
    Django's URL name and route name the same path when Django serves it."""

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        with server_span(f"{request.method} {route}", traceparent_header=request.headers.get("traceparent"),
                         attributes={"http.method": request.method, "http.route": route}):
            response = await _answer(request, read, allow=allow)
        response.headers.update(_security_headers(request))
        if request.method == "HEAD":
            # As Django answers a HEAD: the GET's headers, an empty body of length 0.
            response.body = b""
            response.headers["Content-Length"] = "0"
        count_response(view=view, method=request.method, status=response.status_code,
                       seconds=time.perf_counter() - started)
        return response

    return endpoint


ROUTES = [
    AgentTokenRoute("/api/v1/tasks/{task_id:task_id}/",
                    _endpoint(_task_read, view="task-detail", route="api/v1/tasks/<uuid:task_id>/",
                              allow=task_detail_route.allow)),
    AgentTokenRoute("/api/v1/tasks/{task_id:task_id}/events/",
                    _endpoint(_events_page, view="task-events", route="api/v1/tasks/<uuid:task_id>/events/",
                              allow=task_events_route.allow)),
]
