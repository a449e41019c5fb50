"""One exception handler: every error leaves the API as {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from backplane.eventlog.errors import BackplaneError
from backplane.runtime.database_gate import gate, is_connection_failure, thread_connection_broken

logger = logging.getLogger(__name__)

UNAVAILABLE_RETRY_AFTER = "5"


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def flatten_details(detail: Any, prefix: str = "") -> dict[str, str]:
    """DRF's nested ``{"events": [{"payload": ["..."]}]}`` as ``{"events[0].payload": "..."}``."""
    if isinstance(detail, dict):
        flat: dict[str, str] = {}
        for key, value in detail.items():
            if isinstance(key, int):  # a list serializer's errors, by index
                flat.update(flatten_details(value, f"{prefix}[{key}]"))
                continue
            name = "" if key in ("non_field_errors",) and not prefix else key
            flat.update(flatten_details(value, f"{prefix}.{name}" if prefix and name else prefix or name))
        return flat
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix or "body": " ".join(str(item) for item in detail)}
        flat = {}
        for index, item in enumerate(detail):
            if item:
                flat.update(flatten_details(item, f"{prefix}[{index}]"))
        return flat
    return {prefix or "body": str(detail)}


_DRF_CODES: list[tuple[type[exceptions.APIException], str]] = [
    (exceptions.NotAuthenticated, "not_authenticated"),
    (exceptions.AuthenticationFailed, "not_authenticated"),
    (exceptions.PermissionDenied, "permission_denied"),
    (exceptions.NotFound, "not_found"),
    (exceptions.MethodNotAllowed, "method_not_allowed"),
    (exceptions.NotAcceptable, "not_acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported_media_type"),
    (exceptions.Throttled, "rate_limited"),
    (exceptions.ParseError, "validation_error"),
    (exceptions.ValidationError, "validation_error"),
]


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's exception handler: the contract's error for ``exc``, or None (DRF re-raises)."""
    parts = error_parts(exc)
    if parts is None:
        return None
    status_code, body, headers = parts
    return Response(body, status=status_code, headers=headers or None)


ErrorParts = tuple[int, dict[str, Any], dict[str, str]]


def error_parts(exc: Exception) -> ErrorParts | None:
    """(status, body, headers) of the contract's answer to ``exc``; None for an exception that is
    not an API error (a bug: it propagates). Shared by DRF's handler and the agent routes."""
    if isinstance(exc, BackplaneError):
        retry = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else {}
        return exc.status, error_body(exc.code, exc.message, exc.details), retry
    if isinstance(exc, Http404):
        return 404, error_body("not_found", "not found"), {}
    if isinstance(exc, DjangoPermissionDenied):
        return 403, error_body("permission_denied", "permission denied"), {}
    if isinstance(exc, RequestDataTooBig):
        return 413, error_body("payload_too_large", "request body is over the limit"), {}
    lost = isinstance(exc, DatabaseError) and thread_connection_broken()
    if isinstance(exc, OperationalError | InterfaceError) or lost:
        logger.warning("database unavailable: %s", exc)
        if lost or is_connection_failure(exc):
            # The requests after this one answer at once instead of waiting for the pool.
            gate.mark_down(exc)
        return 503, error_body("unavailable", "the database is unavailable; retry later"), {
            "Retry-After": UNAVAILABLE_RETRY_AFTER}
    if isinstance(exc, DatabaseError):
        # Anything else from the database is our bug, but the client still gets the contract's shape.
        logger.exception("database error")
        return 500, error_body("internal_error", "internal error"), {}
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), "error")
        headers: dict[str, str] = {}
        if isinstance(exc, exceptions.Throttled):
            # Whole seconds, rounded up: a client that waits this long finds the window over.
            wait: float | None = getattr(exc, "wait", None)  # set by Throttled, not in its stubs
            headers["Retry-After"] = str(max(1, math.ceil(wait or 1)))
            message = "rate limit exceeded"
            details: dict[str, Any] = {"retry_after": int(headers["Retry-After"])}
        elif isinstance(exc, exceptions.ParseError):
            message = "the body is not acceptable JSON"
            details = {"body": str(exc.detail)}
        elif isinstance(exc, exceptions.ValidationError):
            message = "invalid request"
            details = flatten_details(exc.detail)
        else:
            message = str(exc.detail)
            details = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        status_code = exc.status_code
        if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
            status_code = status.HTTP_401_UNAUTHORIZED
        return status_code, error_body(code, message, details), headers
    return None


def json_error(code: str, message: str, status_code: int, **headers: str) -> JsonResponse:
    response = JsonResponse(error_body(code, message), status=status_code)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response
