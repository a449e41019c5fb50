"""What every dashboard view shares: who may look, and reading query parameters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.access import may_review, may_view_dashboard

View = Callable[..., HttpResponse]


def staff_only(view: View) -> View:
    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not may_view_dashboard(request.user):
            return render(request, "dashboard/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return wrapped


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "") or request.content_type == "application/json"


def json_error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    """The API's error shape, for the pages' scripts."""
    return JsonResponse({"error": {"code": code, "message": message, "details": details or {}}}, status=status)


def reviewers_only(what: str) -> Callable[[View], View]:
    """Staff first (``staff_only``), then the review permission, checked by the server on every
    decision whatever the page showed: 403 (JSON for scripts) and nothing changed."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not may_review(request.user):
                message = f"{what} needs the review_deadletter permission (the Reviewers group)."
                if wants_json(request):
                    return json_error(403, "permission_denied", message)
                return render(request, "dashboard/forbidden.html", {"message": message}, status=403)
            return view(request, *args, **kwargs)

        return staff_only(wrapped)

    return decorate


def int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
