"""Who may use the dashboard. Logging in takes an active staff user; what they then see and do
is their permissions' (the roles, docs/production.md): viewers read every page, operators also
cancel, pause, fork, set budgets and start verification runs, reviewers decide dead letters and
bulk jobs and close circuit breakers. A superuser holds every permission.

These answer what a page shows; the views' decorators (views/common.py) are what refuse.
"""

from __future__ import annotations

from typing import Any

from backplane.delivery.models import REVIEW_PERMISSION
from recovery.models import OPERATE_PERMISSION, VIEW_PERMISSION
from recovery.selectors import staff_namespace


def may_log_in(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def may_hold(user: Any, permission: str) -> bool:
    return may_log_in(user) and bool(user.has_perm(permission))


def may_view_dashboard(user: Any) -> bool:
    return may_hold(user, VIEW_PERMISSION)


def may_operate(user: Any) -> bool:
    return may_hold(user, OPERATE_PERMISSION)


def may_review(user: Any) -> bool:
    return may_hold(user, REVIEW_PERMISSION)


def namespace_of(user: Any) -> str | None:
    """The namespace a staff user's task pages are limited to (recovery.models.StaffScope), or
    None: every namespace."""
    return staff_namespace(user_id=user.pk)
