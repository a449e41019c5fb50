"""Guards that run before DRF sees a request to the API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse

from backplane.api.errors import json_error

API_PREFIX = "/api/"


def _refuse_before_view(request: HttpRequest) -> HttpResponse | None:
    """413 for a body over the limit. DRF reads the body as a stream, which skips Django's
    DATA_UPLOAD_MAX_MEMORY_SIZE check, so the limit is enforced here, before any parsing."""
    limit = settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return json_error("validation_error", "invalid Content-Length", 400)
    if declared > limit:
        return json_error("payload_too_large", f"request body is over the limit of {limit} bytes", 413)
    if request.method in ("POST", "PUT", "PATCH") and not declared and len(request.body) > limit:
        return json_error("payload_too_large", f"request body is over the limit of {limit} bytes", 413)
    return None


def _json_not_found(response: HttpResponse) -> HttpResponse:
    if response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json"):
        return json_error("not_found", "no such route", 404)
    return response


class ApiErrorMiddleware:
    """Oversize bodies get 413 and unknown API paths a JSON 404, in the contract's error shape.

    Async-capable as well as sync: under ASGI a sync-only middleware costs every request
    an extra hop to a worker thread (measured at several milliseconds here).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self._acall(request)
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)  # type: ignore[return-value]
        refused = _refuse_before_view(request)
        if refused is not None:
            return refused
        return _json_not_found(self.get_response(request))  # type: ignore[arg-type]

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return await self.get_response(request)  # type: ignore[misc]
        refused = _refuse_before_view(request)
        if refused is not None:
            return refused
        return _json_not_found(await self.get_response(request))  # type: ignore[misc]
