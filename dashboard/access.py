"""Who may use the dashboard: logged-in, active staff users (they see every namespace)."""

from __future__ import annotations

from typing import Any


def may_view_dashboard(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)
