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
import uuid
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions
from rest_framework.views import APIView

from backplane.api import fastcheck, views
from backplane.api.authentication import AgentTokenAuthentication, Principal
from backplane.api.base import REPLAY_HEADER, query_int, validated
from backplane.api.errors import error_parts
from backplane.api.parsers import InvalidJSON, loads_strict
from backplane.api.serializers import EventAppendIn, EventBatchIn, event_as_api_dict, task_as_api_dict
from backplane.api.throttling import rate_limit_wait
from backplane.eventlog import selectors, services

Handler = Callable[..., HttpResponse]

_authenticator = AgentTokenAuthentication()
_append_accepted = fastcheck.compile_check(EventAppendIn)
_batch_accepted = fastcheck.compile_check(EventBatchIn)


def _render(body: Any, status: int, headers: dict[str, str] | None = None) -> HttpResponse:
    """As DRF's JSONRenderer writes it: compact, UTF-8, U+2028/U+2029 escaped for browsers."""
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


class LeanRoute:
    """One URL: the lean handler per method for agents' plain JSON calls, the DRF view otherwise."""

    # Agents authenticate with a token, not a cookie: no CSRF check (as on DRF's APIView, whose
    # session authentication enforces CSRF itself, on the requests handed to it).
    csrf_exempt = True

    def __init__(self, drf_view: type[APIView], **handlers: Handler) -> None:
        self.drf_view = csrf_exempt(drf_view.as_view())
        self.handlers = {method.upper(): handler for method, handler in handlers.items()}
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
        handler = self.handlers.get(request.method or "")
        if handler is None or not _accepts_json(request):
            return self.drf_view(request, **kwargs)
        if request.method == "POST" and not _plain_json_body(request):
            return self.drf_view(request, **kwargs)
        try:
            authenticated = _authenticator.authenticate(request)  # type: ignore[arg-type]
        except exceptions.AuthenticationFailed:
            authenticated = None
        if authenticated is None:
            return self.drf_view(request, **kwargs)
        principal = authenticated[0]
        try:
            wait = rate_limit_wait(f"throttle:{principal.pk}")
            if wait is not None:
                raise exceptions.Throttled(wait)
            response = handler(request, principal, **kwargs)
        except Exception as exc:  # noqa: BLE001 - error_parts re-raises what is not an API error
            return _error(exc)
        response["Allow"] = self.allow
        return response


# --- handlers: validate, call one service or selector, shape the answer ----------------------


def task_read(request: HttpRequest, principal: Principal, task_id: uuid.UUID) -> HttpResponse:
    return _render(task_as_api_dict(selectors.task_row_visible(namespace=principal.namespace, task_id=task_id)), 200)


def event_append(request: HttpRequest, principal: Principal, task_id: uuid.UUID) -> HttpResponse:
    body = _body(request)
    data = _append_accepted(body)
    if data is None:
        data = validated(EventAppendIn, body)
    outcome = services.event_append(
        namespace=principal.namespace,
        task_id=task_id,
        draft=views.draft_from(data),
        agent=principal.name,
        expected_seq=data.get("expected_seq"),
        lease_epoch=data.get("lease_epoch"),
    )
    return _written_or_replayed(event_as_api_dict(outcome.events[0]), replayed=outcome.replayed)


def event_append_batch(request: HttpRequest, principal: Principal, task_id: uuid.UUID) -> HttpResponse:
    body = _body(request)
    data = _batch_accepted(body)
    if data is None:
        data = validated(EventBatchIn, body)
    outcome = services.event_append_batch(
        namespace=principal.namespace,
        task_id=task_id,
        drafts=[views.draft_from(item) for item in data["events"]],
        agent=principal.name,
        expected_seq=data.get("expected_seq"),
        lease_epoch=data.get("lease_epoch"),
    )
    return _written_or_replayed({"results": [event_as_api_dict(e) for e in outcome.events]},
                                replayed=outcome.replayed)


def _written_or_replayed(body: Any, *, replayed: bool) -> HttpResponse:
    if replayed:
        return _render(body, 200, {REPLAY_HEADER: "true"})
    return _render(body, 201)


def task_events(request: HttpRequest, principal: Principal, task_id: uuid.UUID) -> HttpResponse:
    """GET a page of events: the DRF view's selector, without DRF."""
    task = selectors.task_visible(namespace=principal.namespace, task_id=task_id)
    page = selectors.event_list(
        task=task,
        after_seq=query_int(request, "after_seq", default=0, minimum=0),
        limit=query_int(request, "limit", default=100, minimum=1, maximum=1000),
    )
    return _render({"results": [event_as_api_dict(e) for e in page.events], "next_after_seq": page.next_after_seq},
                   200)


task_detail_route = LeanRoute(views.TaskDetailView, get=task_read)
task_events_route = LeanRoute(views.TaskEventsView, get=task_events, post=event_append)
task_events_batch_route = LeanRoute(views.TaskEventsBatchView, post=event_append_batch)
