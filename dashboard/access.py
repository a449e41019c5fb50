"""Who may use the dashboard: logged-in, active staff users see everything (every namespace);
reviewers (``review_deadletter``, the "Reviewers" group) also decide dead letters and close
circuit breakers."""

from __future__ import annotations

from typing import Any

from backplane.delivery.models import REVIEW_PERMISSION


def may_view_dashboard(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def may_review(user: Any) -> bool:
    return may_view_dashboard(user) and bool(user.has_perm(REVIEW_PERMISSION))
