"""The agent routes: every route an agent calls (tasks, their events, appends and batches, claims,
heartbeats, release, recovery context, tool calls and their results, sub-tasks, forks, the tool
gateway), each declared once as an ``AgentRoute``: its operations by method, each a handler
``handler(principal, body or query, **url_kwargs)`` and the documentation of its body and answers.

An agent's request (a bearer token) is served by the HTTP front (api/agent_front.py), outside
Django's request stack; any other (a staff session's) by Django, with the route's DRF view
(``AgentRoute.cls``), which drf-spectacular documents the route from. Either way the same steps
run, in DRF's order, with DRF's answers:

1. who is calling and the rate limit's count (authentication.py: 401 with ``WWW-Authenticate``,
   403 for a write without CSRF on a session, 429 with ``Retry-After``);
2. the route's permission, then the method (405; every answer carries ``Allow``; HEAD is GET
   without its body; OPTIONS is 204);
3. the body: ``application/json`` in UTF-8 (else 415), the strict parser (parsers.py: 400),
   then the operation's body as declared in bodies.py (400 naming each field at fault), then
   its personal values sealed (backplane/privacy/sealing.py: 400 for a malformed mark, 409
   ``subject_erased``);
4. the operation's handler (views.py, recovery.py, forks.py), the same function whatever the caller;
5. the answer rendered as DRF's JSONRenderer renders it, errors through ``errors.error_parts``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import bodies
from api.base import Answer, ApiView, principal_of, respond
from api.permissions import AGENTS_ONLY_MESSAGE, AgentOrViewer, PrincipalPermission
from backplane.privacy.sealing import seal_personal


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


def _served_by_drf(operation: Operation) -> Callable[..., Response]:
    """The DRF view method of one operation: DRF has authenticated and counted the caller,
    checked the route's permission and the method, and parsed the body (StrictJSONParser)."""

    def method(view: APIView, request: Request, **kwargs: Any) -> Response:
        principal = principal_of(request)
        if operation.agents_only and principal.agent is None:
            raise exceptions.PermissionDenied(AGENTS_ONLY_MESSAGE)
        if operation.with_url:
            kwargs["url"] = request.build_absolute_uri(request.path)
        if operation.body is None:
            answer = operation.handler(principal, request.query_params, **kwargs)
        else:
            # Personal values sealed before anything hashes or stores them (backplane/privacy/sealing.py).
            data = seal_personal(principal.namespace, bodies.checked(operation.body, request.data))
            answer = operation.handler(principal, data, **kwargs)
        return respond(answer)

    return method


class AgentRouteView(ApiView):
    """The DRF view of an agent route, for a staff session (and every request that is not an
    agent's, which the HTTP front hands over)."""

    def options(self, request: Any, *args: Any, **kwargs: Any) -> Response:  # Django types it as its own request
        # What the route allows is its Allow header, as the HTTP front answers (no description).
        return Response(status=204)


class AgentRoute:
    """One URL: its operations by method. Django serves it with a DRF view (``cls``), which
    drf-spectacular also documents it from; the HTTP front serves an agent's request from the
    same operations (api/agent_front.py)."""

    def __init__(self, name: str, *, permission: type[PrincipalPermission] = AgentOrViewer,
                 **operations: Operation) -> None:
        # Who may call the route, checked as DRF checks a view's permission_classes (before the
        # method): by default agents, and staff viewers; an ``agents_only`` operation refuses staff.
        self.permission = permission
        self.operations = {method.upper(): operation for method, operation in operations.items()}
        # In the order DRF lists a view's methods, as both stacks answer it.
        methods: list[str] = [method for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
                              if method in self.operations]
        if "GET" in methods:
            methods.append("HEAD")
        self.allow = ", ".join([*methods, "OPTIONS"])
        self.cls: type[AgentRouteView] = type(name, (AgentRouteView,), {
            "permission_classes": [IsAuthenticated, permission],
            **{method.lower(): extend_schema(**operation.schema)(_served_by_drf(operation))
               for method, operation in self.operations.items()},
        })
        self.view = self.cls.as_view()
        # What DRF's as_view() leaves on a view, which Django's CSRF middleware and
        # drf-spectacular read from the URLconf's callback: DRF's view checks a session's CSRF
        # itself (staff_authenticate).
        self.csrf_exempt = True
        self.initkwargs: dict[str, Any] = {}

    def __call__(self, request: HttpRequest, **kwargs: Any) -> HttpResponse:
        response: HttpResponse = self.view(request, **kwargs)
        return response
