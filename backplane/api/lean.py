"""The hot routes, served without DRF's per-request machinery when the request is an agent's
plain JSON call, and by their DRF view in every other case.

An agent's append or task read through DRF cost about 4 ms of Python a request, ten times the
server's floor (``GET /healthz``): DRF wraps the request, negotiates, runs authenticators,
permissions and throttles as classes, deep-copies and runs serializers, and renders through a
``Response``. A lean route does the same steps as plain calls — the same token lookup, the same
rate-limit counter, the same strict JSON parser, a validator compiled from the same serializer
(``fastcheck``), the same service, the same error shapes (``errors.error_parts``) — and answers
with one ``HttpResponse``. Paths, fields, statuses, headers and errors are the contract's, and
the DRF views stay behind every route, for the schema and for whatever a lean route does not
take on itself:

- anything but ``Authorization: Bearer`` (staff sessions with their CSRF rules, no credentials);
- a body that is not ``application/json`` in UTF-8, or is empty, and an ``Accept`` header or a
  ``format`` parameter that asks for something else (DRF's 415 and 406);
- a token that does not authenticate (DRF gives the 401 with its ``WWW-Authenticate``);
- other methods (OPTIONS, HEAD, 405s).
A body the compiled check does not accept as is goes through the serializer itself, so every
validation error is DRF's own words.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.views import APIView

from backplane.api import fastcheck, recovery, views
from backplane.api.authentication import AgentTokenAuthentication, Principal, agent_authenticate_counting
from backplane.api.base import Answer, validated
from backplane.api.errors import error_parts
from backplane.api.parsers import InvalidJSON, loads_strict
from backplane.api.serializers import EventAppendIn, EventBatchIn, StrictSerializer
from backplane.api.throttling import agent_counting, rate_limit_wait

# An operation of api/views.py or api/recovery.py: (principal, validated body or query, URL kwargs).
Operation = Callable[..., Answer]
Input = type[StrictSerializer] | None  # the body's serializer; None for a GET (the query is passed)

_authenticator = AgentTokenAuthentication()


def _render(body: Any, status: int, headers: dict[str, str] | None = None) -> HttpResponse:
    """As DRF's JSONRenderer writes it: compact, UTF-8, U+2028/U+2029 escaped for browsers; no
    body and no Content-Type for ``None`` (a 204)."""
    if body is None:
        response = HttpResponse(b"", status=status)
        del response["Content-Type"]
        for name, value in (headers or {}).items():
            response[name] = value
        return response
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    response = HttpResponse(text.encode(), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _error(exc: Exception) -> HttpResponse:
    parts = error_parts(exc)
    if parts is None:
        raise exc
    status, body, headers = parts
    return _render(body, status, headers)


def _accepts_json(request: HttpRequest) -> bool:
    accept = request.META.get("HTTP_ACCEPT", "")
    if "indent" in accept or "format" in request.GET:
        return False
    return not accept or "*/*" in accept or "application/json" in accept or "application/*" in accept


def _plain_json_body(request: HttpRequest) -> bool:
    if request.content_type != "application/json":
        return False
    charset = (request.content_params or {}).get("charset")
    if charset is not None and charset.lower().replace("-", "") != "utf8":
        return False
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return False


def _body(request: HttpRequest) -> Any:
    try:
        return loads_strict(request.body)
    except InvalidJSON as exc:
        raise exceptions.ParseError(f"JSON parse error - {exc}") from None


def _authenticate_and_count(request: HttpRequest) -> tuple[Principal, float | None] | None:
    """The agent behind the token and the rate limit's wait (None: within it), in one statement
    on the database cache, or in two (the authenticator, then the counter) on Redis."""
    counting = agent_counting()
    if counting is not None:
        return agent_authenticate_counting(request, counting)
    # The authenticator reads only the headers, which a Django request has as DRF's does.
    authenticated = _authenticator.authenticate(cast(Request, request))
    if authenticated is None:
        return None
    principal = authenticated[0]
    return principal, rate_limit_wait(f"throttle:{principal.pk}")


class LeanRoute:
    """One URL: per method an operation and its input's serializer, for agents' plain JSON calls;
    the DRF view for everything else."""

    # Agents authenticate with a token, not a cookie: no CSRF check (as on DRF's APIView, whose
    # session authentication enforces CSRF itself, on the requests handed to it).
    csrf_exempt = True

    def __init__(self, drf_view: type[APIView], **operations: tuple[Input, Operation]) -> None:
        self.drf_view = csrf_exempt(drf_view.as_view())
        self.operations = {
            method.upper(): (serializer, None if serializer is None else fastcheck.compile_check(serializer), operation)
            for method, (serializer, operation) in operations.items()
        }
        # DRF's Allow header: its view's methods, with HEAD wherever GET is (Django's View.setup).
        view = drf_view()
        if hasattr(view, "get") and not hasattr(view, "head"):
            setattr(view, "head", view.get)  # noqa: B010 - as Django's View.setup does
        self.allow = ", ".join(view.allowed_methods)
        # What DRF's as_view() leaves on its view for drf-spectacular, which documents the route
        # from the DRF view: the OpenAPI document is unchanged by the lean path.
        self.cls = drf_view
        self.initkwargs: dict[str, Any] = {}

    def __call__(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        found = self.operations.get(request.method or "")
        if found is None or not _accepts_json(request):
            return self.drf_view(request, **kwargs)
        serializer, accepted_as_is, operation = found
        if serializer is not None and not _plain_json_body(request):
            return self.drf_view(request, **kwargs)
        try:
            authenticated = _authenticate_and_count(request)
        except exceptions.AuthenticationFailed:
            authenticated = None
        if authenticated is None:
            return self.drf_view(request, **kwargs)  # DRF gives the 401, with its WWW-Authenticate
        principal, wait = authenticated
        try:
            if wait is not None:
                raise exceptions.Throttled(wait)
            if serializer is None:
                answer = operation(principal, request.GET, **kwargs)
            else:
                body = _body(request)
                data = accepted_as_is(body) if accepted_as_is is not None else None
                answer = operation(principal, data if data is not None else validated(serializer, body), **kwargs)
        except Exception as exc:  # noqa: BLE001 - error_parts re-raises what is not an API error
            return _error(exc)
        response = _render(answer.body, answer.status, answer.headers)
        response["Allow"] = self.allow
        return response


task_detail_route = LeanRoute(views.TaskDetailView, get=(None, views.task_read))
task_events_route = LeanRoute(views.TaskEventsView, get=(None, views.events_page),
                              post=(EventAppendIn, views.event_append))
task_events_batch_route = LeanRoute(views.TaskEventsBatchView, post=(EventBatchIn, views.event_append_batch))
leases_route = LeanRoute(recovery.LeasesView, post=(recovery.LeaseClaimIn, recovery.lease_claim))
heartbeat_route = LeanRoute(recovery.HeartbeatView, post=(recovery.LeaseEpochIn, recovery.lease_heartbeat))
tool_calls_route = LeanRoute(recovery.ToolCallDispatchView,
                             post=(recovery.ToolCallDispatchIn, recovery.tool_call_dispatch))
tool_call_result_route = LeanRoute(recovery.ToolCallResultView,
                                   post=(recovery.ToolCallResultIn, recovery.tool_call_result))
