"""Saved searches and their alert rules: save the task list's filter, open it by its URL, pin it
as an overview tile, watch it with alert rules (recovery/alerts.py).

Thin: every change is one service call; a refusal changes nothing and is said on the page (or
in the API's error shape to a script asking for JSON). Deleting asks for confirmation on a page
of its own first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from backplane.eventlog.errors import BackplaneError, InvalidInput
from backplane.eventlog.models import user_actor
from dashboard.forms import TaskFilterForm
from dashboard.views.common import (
    across_namespaces,
    json_error,
    operators_only,
    viewers_only,
    viewers_read_operators_write,
    wants_json,
)
from recovery import alerts
from recovery.models import AlertRule, SavedSearch
from recovery.selectors import (
    alert_transitions_recent,
    alerts_firing,
    saved_search_counts,
    saved_search_named,
    saved_searches,
    saved_searches_bare,
    search_filters,
)

NAV = "searches"
RECENT_TRANSITIONS = 20


def _refused(request: HttpRequest, exc: BackplaneError, *, what: str, back: str) -> HttpResponse:
    if wants_json(request):
        return json_error(exc.status, exc.code, exc.message, exc.details)
    messages.error(request, f"{what}: {exc.message}.")
    return redirect(back)


def task_list_query(search: SavedSearch) -> str:
    """The task list's query string for a search: its filter (times as RFC 3339, which the list's
    form reads as they are) and ``search``, which names it on the page."""
    filters = search_filters(search).as_json()
    return urlencode({**filters, "search": search.slug})


@require_http_methods(["GET", "POST"])
@viewers_read_operators_write("Saving a search")
@across_namespaces
def searches_page(request: HttpRequest) -> HttpResponse:
    """GET: every saved search with its live count and rules (``?partial=counts``: only the counts,
    for the page's script). POST: save the task list's filter."""
    if request.method == "POST":
        return _save(request)
    if request.GET.get("partial") == "counts":
        counted = saved_search_counts(saved_searches_bare())
        return JsonResponse({"counts": {row.search.slug: row.count for row in counted}})
    searches = saved_searches()
    return render(request, "dashboard/searches.html", {
        "nav": NAV,
        "rows": saved_search_counts(searches),
        "transitions": alert_transitions_recent(limit=RECENT_TRANSITIONS),
    })


def _save(request: HttpRequest) -> HttpResponse:
    """The task list's "Save this search": ``query`` is the list's query string, read by the
    list's own form, so the saved filter is exactly what the list showed."""
    query = request.POST.get("query", "")
    back = f"{reverse('dashboard:tasks')}?{query}" if query else reverse("dashboard:tasks")
    form = TaskFilterForm(QueryDict(query))
    if not form.is_valid():
        exc = InvalidInput("the filter is not valid", {k: "; ".join(str(e) for e in v) for k, v in form.errors.items()})
        return _refused(request, exc, what="Not saved", back=back)
    try:
        search = alerts.saved_search_save(name=request.POST.get("name", ""), filter=form.filters().as_json(),
                                          slug=request.POST.get("slug", ""), pinned=request.POST.get("pinned") == "on",
                                          created_by=user_actor(request.user))
    except BackplaneError as exc:
        return _refused(request, exc, what="Not saved", back=back)
    share = request.build_absolute_uri(alerts.search_path(search))
    messages.success(request, f"Saved as “{search.name}”: share {share}")
    return redirect(alerts.search_path(search))


@require_GET
@viewers_only
@across_namespaces
def saved_search_open(request: HttpRequest, slug: str) -> HttpResponse:
    """A saved search's shareable URL: the task list with its filter."""
    search = get_object_or_404(SavedSearch, slug=slug)
    try:
        query = task_list_query(search)
    except BackplaneError as exc:
        return _refused(request, exc, what=f"“{search.name}” cannot be opened", back=reverse("dashboard:searches"))
    return redirect(f"{reverse('dashboard:tasks')}?{query}")


@require_POST
@operators_only("Pinning a search")
@across_namespaces
def saved_search_pin_view(request: HttpRequest, search_id: int) -> HttpResponse:
    pinned = request.POST.get("pinned") == "1"
    try:
        search = alerts.saved_search_pin(search_id=search_id, pinned=pinned, by=user_actor(request.user))
    except BackplaneError as exc:
        return _refused(request, exc, what="Not changed", back=reverse("dashboard:searches"))
    messages.success(request, f"“{search.name}” {'is pinned to' if pinned else 'is no longer on'} the overview.")
    return redirect("dashboard:searches")


@require_http_methods(["GET", "POST"])
@viewers_read_operators_write("Deleting a search")
@across_namespaces
def saved_search_delete_view(request: HttpRequest, search_id: int) -> HttpResponse:
    """GET asks; POST with ``confirm=yes`` deletes the search and its rules."""
    search = get_object_or_404(SavedSearch, pk=search_id)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        rules = list(search.alert_rules.order_by("pk"))
        return render(request, "dashboard/search_delete.html", {
            "nav": NAV, "what": f"the saved search “{search.name}”", "search": search, "rules": rules,
            "firing": [rule for rule in rules if rule.state == "firing"],
            "action": reverse("dashboard:search-delete", args=[search.pk]),
        })
    try:
        alerts.saved_search_delete(search_id=search.pk, by=user_actor(request.user))
    except BackplaneError as exc:
        return _refused(request, exc, what="Not deleted", back=reverse("dashboard:searches"))
    messages.success(request, f"Deleted “{search.name}” and its alert rules.")
    return redirect("dashboard:searches")


def _whole_number(raw: str, field: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise InvalidInput(f"{field} must be a whole number", {field: "a whole number"}) from None


@require_POST
@operators_only("Adding an alert rule")
@across_namespaces
def alert_rule_create_view(request: HttpRequest, search_id: int) -> HttpResponse:
    back = reverse("dashboard:searches")
    try:
        rule = alerts.alert_rule_set(
            search_id=search_id,
            window_seconds=_whole_number(request.POST.get("window_seconds", ""), "window_seconds"),
            threshold=_whole_number(request.POST.get("threshold", ""), "threshold"),
            created_by=user_actor(request.user),
        )
    except BackplaneError as exc:
        return _refused(request, exc, what="No rule added", back=back)
    messages.success(request, f"Alert rule added: {rule}.")
    return redirect(f"{back}#search-{rule.search.slug}")


@require_http_methods(["GET", "POST"])
@viewers_read_operators_write("Deleting an alert rule")
@across_namespaces
def alert_rule_delete_view(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = get_object_or_404(AlertRule.objects.select_related("search"), pk=rule_id)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        return render(request, "dashboard/search_delete.html", {
            "nav": NAV, "what": f"the alert rule “{rule}”", "search": rule.search, "rules": [],
            "firing": [rule] if rule.state == "firing" else [],
            "action": reverse("dashboard:alert-rule-delete", args=[rule.pk]),
        })
    try:
        alerts.alert_rule_delete(rule_id=rule.pk, by=user_actor(request.user))
    except BackplaneError as exc:
        return _refused(request, exc, what="Not deleted", back=reverse("dashboard:searches"))
    messages.success(request, f"Deleted the alert rule on “{rule.search.name}”.")
    return redirect("dashboard:searches")


def named_search(slug: str | None) -> SavedSearch | None:
    """The saved search a task-list link names (``?search=<slug>``), to say so on the page."""
    return saved_search_named(slug) if slug else None


@dataclass(frozen=True)
class PinnedTile:
    search: SavedSearch
    count: int | None
    firing: list[AlertRule]


def overview_parts() -> dict[str, Any]:
    """What the overview shows of saved searches: pinned tiles with counts (marked while a rule of
    theirs fires), firing alerts and recent resolutions (``_saved_tiles.html``, ``_alerts.html``)."""
    firing = alerts_firing()
    pinned = saved_search_counts(saved_searches(pinned_only=True))
    return {
        "pinned": [PinnedTile(search=row.search, count=row.count,
                              firing=[rule for rule in firing if rule.search_id == row.search.pk]) for row in pinned],
        "alerts_firing": firing,
        "alerts_resolved": alert_transitions_recent(state="resolved", limit=5),
    }


urlpatterns = [
    path("", searches_page, name="searches"),
    path("<int:search_id>/pin/", saved_search_pin_view, name="search-pin"),
    path("<int:search_id>/delete/", saved_search_delete_view, name="search-delete"),
    path("<int:search_id>/rules/", alert_rule_create_view, name="alert-rule-create"),
    path("rules/<int:rule_id>/delete/", alert_rule_delete_view, name="alert-rule-delete"),
    path("<slug:slug>/", saved_search_open, name="saved-search"),
]
