"""What every dashboard view shares: who may look and act (declared on each view), a page's action
from its form (``form_action``), and reading query parameters."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render

from backplane.delivery.models import REVIEW_PERMISSION
from backplane.eventlog.errors import BackplaneError
from dashboard.access import may_hold, may_log_in, namespace_of
from dashboard.forms import RefusalForm
from recovery.models import OPERATE_PERMISSION, VIEW_PERMISSION

View = Callable[..., HttpResponse]

# Who holds each permission, for the refusal's words (docs/production.md, "Roles").
_ROLES = {VIEW_PERMISSION: "Viewers", OPERATE_PERMISSION: "Operators", REVIEW_PERMISSION: "Reviewers"}


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "") or request.content_type == "application/json"


def json_error(status: int, code: str, message: str, details: dict[str, Any] | None = None) -> JsonResponse:
    """The API's error shape, for the pages' scripts."""
    return JsonResponse({"error": {"code": code, "message": message, "details": details or {}}}, status=status)


def staff_permission_required(*permissions: str, what: str) -> Callable[[View], View]:
    """Django's ``permission_required`` for the dashboard: the login page for someone logged out,
    then an active staff user (the gate to log in at all) holding one of ``permissions``, checked
    by the server on every request whatever the page showed; anyone else gets 403 (JSON for
    scripts) and nothing changes."""
    names = " or ".join(p.partition(".")[2] for p in permissions)
    groups = " or ".join(_ROLES[p] for p in permissions if p in _ROLES)
    message = f"{what} needs the {names} permission" + (f" (the {groups} group)." if groups else ".")

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not may_log_in(request.user):  # the forbidden page says the dashboard is for staff
                return render(request, "dashboard/forbidden.html", status=403)
            if not any(may_hold(request.user, permission) for permission in permissions):
                if wants_json(request):
                    return json_error(403, "permission_denied", message)
                return render(request, "dashboard/forbidden.html", {"message": message}, status=403)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


# Reading any page: the viewer's permission, which every role holds.
viewers_only = staff_permission_required(VIEW_PERMISSION, what="The dashboard")


def operators_only(what: str) -> Callable[[View], View]:
    """Cancel, pause, fork, budgets, verification runs: the operator's permission."""
    return staff_permission_required(OPERATE_PERMISSION, what=what)


def viewers_read_operators_write(what: str) -> Callable[[View], View]:
    """A page that reads on GET and writes on POST: the viewer's permission to read it, the
    operator's to write."""

    def decorate(view: View) -> View:
        read, write = viewers_only(view), operators_only(what)(view)

        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            return (read if request.method in ("GET", "HEAD") else write)(request, *args, **kwargs)

        return wrapped

    return decorate


def reviewers_only(what: str) -> Callable[[View], View]:
    """Dead letters, bulk jobs, circuit breakers: the reviewer's permission (``review_deadletter``)."""
    return staff_permission_required(REVIEW_PERMISSION, what=what)


def across_namespaces(view: View) -> View:
    """A page over every namespace (the overview, dead letters, jobs, budgets, pauses, agents,
    the outbox, integrity, searches): a staff user scoped to one namespace (StaffScope) is
    refused it, as the API refuses them its fleet-wide routes, and sent to their tasks from the
    overview. Put under the permission decorator, so a logged-out caller still gets the login."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        namespace = namespace_of(request.user)
        if namespace is None:
            return view(request, *args, **kwargs)
        if request.resolver_match is not None and request.resolver_match.url_name == "overview":
            return redirect("dashboard:tasks")
        message = (f"This page covers every namespace, and your account sees only {namespace}: "
                   "its tasks are under Tasks.")
        if wants_json(request):
            return json_error(403, "permission_denied", message, {"namespace": namespace})
        return render(request, "dashboard/forbidden.html", {"message": message, "scoped": namespace}, status=403)

    return wrapped


def form_action(request: HttpRequest, form: RefusalForm, act: Callable[[dict[str, Any]], str], *, refused: str,
                back: HttpResponse) -> HttpResponse:
    """A page's action: the form checked, then ``act`` (the service, with the form's cleaned data)
    run; its refusal, or the form's, is said as "<refused>: <why>." on the page the browser comes
    back to (``back``), where nothing was written; else the line ``act`` returns."""
    if not form.is_valid():
        messages.error(request, f"{refused}: {form.refusal()}.")
        return back
    try:
        done = act(form.cleaned_data)
    except BackplaneError as exc:
        messages.error(request, f"{refused}: {exc.message}.")
        return back
    messages.success(request, done)
    return back


def int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None
