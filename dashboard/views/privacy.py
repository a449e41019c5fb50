"""The Privacy page (docs/privacy.md): the data subjects of the namespaces the person sees, the
erasure of one (the API's service and refusals), and who read personal data in clear."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import user_actor
from backplane.privacy import selectors, services
from backplane.privacy.models import ERASE_SUBJECT_PERMISSION, OPEN_PERSONAL_DATA_PERMISSION
from dashboard.access import namespace_of
from dashboard.privacy_forms import SubjectEraseForm, SubjectFindForm
from dashboard.views.common import form_action, staff_permission_required

privacy_officers_only = staff_permission_required(OPEN_PERSONAL_DATA_PERMISSION, ERASE_SUBJECT_PERMISSION,
                                                  what="The Privacy page")


@require_GET
@privacy_officers_only
def privacy_page(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _page(request: HttpRequest, *, find: SubjectFindForm | None = None, found: list[str] | None = None,
          status: int = 200) -> HttpResponse:
    scope = namespace_of(request.user)
    search = request.GET.get("subject", "").strip()[:200]
    return render(request, "dashboard/privacy.html", {
        "nav": "privacy", "subjects": selectors.subjects_page(scope, search=search), "search": search,
        "reads": selectors.reads_of(scope), "scope": scope,
        "form": SubjectEraseForm(initial={"namespace": scope or ""}),
        "find": find or SubjectFindForm(initial={"namespace": scope or ""}), "found": found,
        "may_erase": request.user.has_perm(ERASE_SUBJECT_PERMISSION),
        "may_open": request.user.has_perm(OPEN_PERSONAL_DATA_PERMISSION)}, status=status)


@require_POST
@staff_permission_required(OPEN_PERSONAL_DATA_PERMISSION, what="Finding a data subject by a value")
def subject_find(request: HttpRequest) -> HttpResponse:
    """The subjects a value marked ``lookup`` belongs to (a POST: the value stays out of URLs and
    logs); a lookup that finds any is recorded as this person's read."""
    form = SubjectFindForm(request.POST)
    scope = namespace_of(request.user)
    if not form.is_valid() or (scope is not None and form.cleaned_data["namespace"] != scope):
        if form.is_valid():
            form.add_error("namespace", f"you act in namespace {scope} only")
        return _page(request, find=form, status=400)
    found = services.subjects_by_value(form.cleaned_data["namespace"], form.cleaned_data["value"],
                                       reader=user_actor(request.user))
    return _page(request, find=form, found=found)


@require_POST
@staff_permission_required(ERASE_SUBJECT_PERMISSION, what="Erasing a data subject")
def subject_erase(request: HttpRequest) -> HttpResponse:
    scope = namespace_of(request.user)

    def erase(data: dict[str, Any]) -> str:
        if scope is not None and data["namespace"] != scope:
            raise InvalidInput(f"you act in namespace {scope} only", {"namespace": data["namespace"]})
        erased = services.subject_erase(namespace=data["namespace"], subject=data["subject"], reason=data["reason"],
                                        erased_by=user_actor(request.user))
        return (f"Erased: {erased.namespace}/{erased.subject}. Its values can no longer be read anywhere; every "
                "chain and seal still verifies.")

    return form_action(request, SubjectEraseForm(request.POST), erase, refused="Not erased",
                       back=redirect("dashboard:privacy"))


urlpatterns = [
    path("", privacy_page, name="privacy"),
    path("erase/", subject_erase, name="privacy-erase"),
    path("find/", subject_find, name="privacy-find"),
]
