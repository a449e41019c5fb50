"""Who may call a route, declared where the route is: ``permission_classes`` on a DRF view,
``permission=`` on an agent route (api/routes.py). No view, helper or getter authorizes.

Agents are held to their namespace and kinds by every query and never hold a person's role.
Staff sessions (and agent tokens bound to a staff user, for reviewing) hold roles, Django groups
made by recovery's migration 0013 (docs/production.md, "Roles"):

- viewer (``recovery.view_backplane``): reads;
- operator (``recovery.operate_backplane``): acts on tasks and the fleet (cancel, fork, pauses,
  budgets, verification runs); staff never write as an agent (``AgentWritesOnly``, below);
- reviewer (``backplane.review_deadletter``): dead letters and bulk jobs, reads included.

Being staff only lets a person log in; a superuser holds every permission. A staff user scoped to
one namespace (recovery.models.StaffScope) is refused the routes that act across namespaces.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from api.authentication import Principal
from backplane.delivery.models import REVIEW_PERMISSION
from backplane.privacy.models import ERASE_SUBJECT_PERMISSION, OPEN_PERSONAL_DATA_PERMISSION
from recovery.models import OPERATE_PERMISSION, VIEW_PERMISSION
from recovery.selectors import staff_namespace


class PrincipalPermission(BasePermission):
    """A rule over the calling ``Principal`` and the request's method. ``allows`` is the rule;
    DRF answers 403 ``permission_denied`` with ``message`` when it says no (401 first for a
    caller it could not authenticate)."""

    message = "not allowed"

    def has_permission(self, request: Request, view: Any) -> bool:
        principal: object = request.user  # DRF types it as a Django user; ours is always a Principal
        return isinstance(principal, Principal) and self.allows(principal, request.method or "GET")

    def allows(self, principal: Principal, method: str) -> bool:
        raise NotImplementedError


def _staff_holds(principal: Principal, permission: str) -> bool:
    user = principal.staff_user
    return user is not None and user.is_staff and user.has_perm(permission)


class AgentOrViewerOperator(PrincipalPermission):
    """Agents (their namespace and kinds), or staff: a viewer reads, an operator writes. The task
    routes agents use, which staff may use too."""

    message = "staff read with the view_backplane permission (Viewers) and write with operate_backplane (Operators)"

    def allows(self, principal: Principal, method: str) -> bool:
        if principal.agent is not None:
            return True
        return _staff_holds(principal, VIEW_PERMISSION if method in SAFE_METHODS else OPERATE_PERMISSION)


class AgentOrViewer(PrincipalPermission):
    """Agents (their namespace and kinds), or staff viewers: ``ApiView``'s default and every agent
    route's (api/routes.py). A view that writes adds its own rule for the write."""

    message = "staff need the view_backplane permission (the Viewers group) to use the API"

    def allows(self, principal: Principal, method: str) -> bool:
        return principal.agent is not None or _staff_holds(principal, VIEW_PERMISSION)


class StaffViewerOperator(PrincipalPermission):
    """Staff only, across namespaces (agents and staff scoped to a namespace get 403): a viewer
    reads, an operator writes. Pauses and budgets."""

    message = ("staff only, not scoped to a namespace: reading needs the view_backplane permission (Viewers), "
               "writing operate_backplane (Operators)")

    def allows(self, principal: Principal, method: str) -> bool:
        if principal.agent is not None or principal.namespace is not None:
            return False
        return _staff_holds(principal, VIEW_PERMISSION if method in SAFE_METHODS else OPERATE_PERMISSION)


class Reviewer(PrincipalPermission):
    """A reviewer, by session or a token bound to that staff user, not scoped to a namespace:
    dead letters and bulk jobs, which span namespaces, reads included (docs/api.md)."""

    message = ("reviewing dead letters and bulk jobs needs a staff user with the review_deadletter permission "
               "(the Reviewers group), not scoped to a namespace")

    def allows(self, principal: Principal, method: str) -> bool:
        user = principal.user
        if user is None or not user.is_staff or not user.has_perm(REVIEW_PERMISSION):
            return False
        # A session's namespace is its user's scope; a token bound to a user has its agent's.
        return (principal.namespace if principal.agent is None else staff_namespace(user_id=user.pk)) is None


class PersonalDataReader(PrincipalPermission):
    """Agents (their namespace's personal data), or a person with ``open_personal_data`` (Privacy
    officers), by session or a token bound to that user: every read by a person is recorded."""

    message = "reading personal data in clear needs the open_personal_data permission (the Privacy officers group)"

    def allows(self, principal: Principal, method: str) -> bool:
        user = principal.user
        if user is None:
            return principal.agent is not None
        return user.is_staff and user.has_perm(OPEN_PERSONAL_DATA_PERMISSION)


class SubjectEraser(PrincipalPermission):
    """A person with ``erase_subject`` (Privacy officers), by session or a token bound to that user
    (a privacy tool). Agents of their own never erase."""

    message = "erasing a data subject needs the erase_subject permission (the Privacy officers group)"

    def allows(self, principal: Principal, method: str) -> bool:
        user = principal.user
        return user is not None and user.is_staff and user.has_perm(ERASE_SUBJECT_PERMISSION)


AGENTS_ONLY_MESSAGE = ("this route writes as an agent, under its lease and within its kinds: use an agent token "
                       "(staff act through the staff actions: cancel, pause, fork, budgets)")


class AgentWritesOnly(PrincipalPermission):
    """Reads for every caller; writes only for agents, which write under their own leases and
    within their kinds (``check_lease``). Staff sessions act through the staff actions, each
    with its own permission."""

    message = AGENTS_ONLY_MESSAGE

    def allows(self, principal: Principal, method: str) -> bool:
        return method in SAFE_METHODS or principal.agent is not None


class ApprovalDecider(PrincipalPermission):
    """Approval requests (api/approvals.py): staff viewers read them; a person decides, signed in
    as a staff user, never an agent's token. Whether that person may decide a given request (a
    member of the group it asks, not the person its agent acts for) is the service's check."""

    message = ("approval requests are read by staff with the view_backplane permission and decided by people "
               "signed in, not by agents' tokens")

    def allows(self, principal: Principal, method: str) -> bool:
        if principal.agent is not None:
            return False
        if method in SAFE_METHODS:
            return _staff_holds(principal, VIEW_PERMISSION)
        return principal.user is not None and principal.user.is_staff
