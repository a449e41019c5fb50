"""Per-token rate limit (429 with Retry-After through the exception handler)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    """One bucket per agent token (or staff user), in the default cache.

    The default cache is per process; with several web processes behind a balancer the
    effective limit is per process, unless CACHES points at Redis (REDIS_URL).
    """

    scope = "principal"

    def get_rate(self) -> str:
        return settings.BACKPLANE_RATE_LIMIT

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        principal = getattr(request, "user", None)
        if principal is None or not getattr(principal, "is_authenticated", False):
            return None
        return f"throttle:{principal.pk}"
