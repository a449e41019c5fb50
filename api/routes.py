"""The agent routes: every route an agent calls (tasks, their events, appends and batches, claims,
heartbeats, release, recovery context, tool calls and their results, sub-tasks, forks, the tool
gateway), each declared once as an ``AgentRoute``: its operations by method, each a handler
``handler(principal, body or query, **url_kwargs)`` and the documentation of its body and answers.

An agent's request (a bearer token) is served by the HTTP front (api/agent_front.py), outside
Django's request stack; a staff session's is served by Django, with the ``AgentRoute`` itself as
the view. Either way the same steps run, in DRF's order, with DRF's answers:

1. who is calling and the rate limit's count (authentication.py: 401 with ``WWW-Authenticate``,
   403 for a write without CSRF on a session, 429 with ``Retry-After``);
2. the method (405; every answer carries ``Allow``; HEAD is GET without its body);
3. the body (``Operation.validated_body``): ``application/json`` (else 415), the strict parser
   (parsers.py: 400), then the operation's body as declared in bodies.py (400 naming each field
   at fault);
4. the operation's handler (views.py, recovery.py, forks.py), the same function whatever the caller;
5. the answer rendered as DRF's JSONRenderer would, errors through ``errors.error_parts``.

The ``schema`` given with each operation (its body from bodies.py, its answers' serializers)
documents the route in the OpenAPI document: ``AgentRoute`` builds the DRF view class
drf-spectacular reads (``cls``), which no request ever reaches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.http import parse_header_parameters
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions

from api import bodies
from api.authentication import WWW_AUTHENTICATE, Principal, agent_authenticate, staff_authenticate
from api.base import Answer, ApiView, json_bytes
from api.errors import error_parts
from api.parsers import InvalidJSON, charset_refused, loads_strict
from api.permissions import AGENTS_ONLY_MESSAGE, AgentOrViewer, PrincipalPermission
from api.throttling import count_request


class Operation:
    """One method of a route: ``handler(principal, body or query, **url_kwargs)`` and the
    arguments of drf-spectacular's ``extend_schema`` that document it. Its ``request``, when
    given, is the body's declaration (bodies.py) it is checked with; without one (a GET) the
    handler gets the query. ``agents_only``: the operation writes as the calling agent (under its lease, in
    its kinds), so a staff session is 403; staff act through the staff actions."""

    def __init__(self, handler: Callable[..., Answer], schema: dict[str, Any], *, agents_only: bool = False,
                 with_url: bool = False) -> None:
        self.handler = handler
        self.body: type[bodies.Body] | None = schema.get("request")
        if self.body is not None:
            schema = {**schema, "request": {"application/json": bodies.request_ref(self.body)}}
        self.schema = schema
        self.agents_only = agents_only
        # The handler is also given ``url``, the request's absolute URL without its query (for
        # the links it answers with), built from the scheme and host as Django's
        # HttpRequest.build_absolute_uri builds it on either stack.
        self.with_url = with_url

    def validated_body(self, raw: bytes, content_type: str) -> dict[str, Any]:
        """The request's body as the operation takes it, on either stack (here and
        api/agent_front.py): ``application/json`` in UTF-8 (else 415), the strict parser (400),
        then its declaration (400)."""
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
        assert self.body is not None  # only an operation with a body is given one
        return bodies.checked(self.body, body)


def _documented_only() -> Callable[..., Any]:
    """A DRF view method for drf-spectacular to read ``extend_schema``'s annotation from (one
    function per method: the annotation is set on the function)."""

    def method(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an agent route's DRF view only documents it; AgentRoute serves it")

    return method


class AgentRoute:
    """One URL: its operations by method, served for every request."""

    # The session check enforces CSRF itself (staff_authenticate), as DRF's APIView does.
    csrf_exempt = True

    def __init__(self, name: str, *, permission: type[PrincipalPermission] = AgentOrViewer,
                 **operations: Operation) -> None:
        # Who may call the route, checked as DRF checks a view's permission_classes (before the
        # method): by default agents, and staff viewers; an ``agents_only`` operation refuses staff.
        self.permission = permission
        self.operations = {method.upper(): operation for method, operation in operations.items()}
        methods = list(self.operations)
        if "GET" in methods:
            methods.append("HEAD")
        self.allow = ", ".join([*methods, "OPTIONS"])
        # What DRF's as_view() leaves on its view for drf-spectacular, which documents the route.
        self.cls = type(name, (ApiView,), {
            method.lower(): extend_schema(**operation.schema)(_documented_only())
            for method, operation in self.operations.items()
        })
        self.initkwargs: dict[str, Any] = {}

    def __call__(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        method = request.method or ""
        try:
            response = self._answer(request, "GET" if method == "HEAD" else method, kwargs)
        except Exception as exc:  # noqa: BLE001 - error_parts re-raises what is not an API error
            parts = error_parts(exc)
            if parts is None:
                raise
            status, body, headers = parts
            if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
                headers = {**headers, "WWW-Authenticate": WWW_AUTHENTICATE}
            response = _render(body, status, headers)
        response["Allow"] = self.allow
        if method == "HEAD":
            response.content = b""
        return response

    def _answer(self, request: HttpRequest, method: str, kwargs: Mapping[str, Any]) -> HttpResponse:
        # Who is calling before which method, as DRF decides: a stranger learns nothing of a route.
        principal = _authenticate_and_count(request)
        if not self.permission().allows(principal, method):
            raise exceptions.PermissionDenied(self.permission.message)
        operation = self.operations.get(method)
        if operation is None:
            if method == "OPTIONS":  # what the route allows: the Allow header
                return _render(None, 204)
            raise exceptions.MethodNotAllowed(method)
        if operation.agents_only and principal.agent is None:
            raise exceptions.PermissionDenied(AGENTS_ONLY_MESSAGE)
        if operation.with_url:
            kwargs = {**kwargs, "url": request.build_absolute_uri(request.path)}
        if operation.body is None:
            answer = operation.handler(principal, request.GET, **kwargs)
        else:
            answer = operation.handler(principal, _validated_body(request, operation), **kwargs)
        return _render(answer.body, answer.status, answer.headers)


def _authenticate_and_count(request: HttpRequest) -> Principal:
    agent = agent_authenticate(request)
    if agent is not None:
        principal, credentials = agent
        wait = credentials.wait
    else:
        staff = staff_authenticate(request)
        if staff is None:
            raise exceptions.NotAuthenticated()
        principal, wait = staff, count_request(staff.pk)
    if wait is not None:
        raise exceptions.Throttled(wait)
    return principal


def _validated_body(request: HttpRequest, operation: Operation) -> dict[str, Any]:
    return operation.validated_body(request.body, request.META.get("CONTENT_TYPE", ""))


def _render(body: Any, status: int, headers: Mapping[str, str] | None = None) -> HttpResponse:
    """As DRF's JSONRenderer writes it: compact, UTF-8, U+2028/U+2029 escaped for browsers; no
    body and no Content-Type for ``None``."""
    if body is None:
        response = HttpResponse(b"", status=status)
        del response["Content-Type"]
    else:
        response = HttpResponse(json_bytes(body), status=status, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response
