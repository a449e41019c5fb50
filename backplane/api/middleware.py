"""Guards that run before DRF sees a request to the API."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from backplane.api.errors import json_error

API_PREFIX = "/api/"


class ApiErrorMiddleware:
    """Oversize bodies get 413 and unknown API paths a JSON 404, in the contract's error shape.

    DRF reads the body as a stream, which skips Django's DATA_UPLOAD_MAX_MEMORY_SIZE check,
    so the limit is enforced here, before any parsing or writing.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        limit = settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return json_error("validation_error", "invalid Content-Length", 400)
        if declared > limit:
            return json_error("payload_too_large", f"request body is over the limit of {limit} bytes", 413)
        if request.method in ("POST", "PUT", "PATCH") and not declared and len(request.body) > limit:
            return json_error("payload_too_large", f"request body is over the limit of {limit} bytes", 413)
        response = self.get_response(request)
        if response.status_code == 404 and not response.get("Content-Type", "").startswith("application/json"):
            return json_error("not_found", "no such route", 404)
        return response
