"""Guards that run before DRF sees a request to the API, and the net under every answer it gives.

docs/api.md's transport rules: a path without its trailing ``/`` is the same route; a body over the
limit is 413, whether its length is declared or it arrives chunked; and every answer is the
contract's JSON, even when Django itself answers (an unknown path, a CSRF failure, a crash).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import is_valid_path
from django.utils.http import parse_header_parameters

from api.errors import error_body, json_error

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
READ_CHUNK = 64 * 1024

# Django's own answers (not DRF's) that reach an API client: what each status means in the contract.
_CONTRACT_CODES = {
    400: ("validation_error", "bad request"),
    403: ("permission_denied", "permission denied"),
    404: ("not_found", "no such route"),
    405: ("method_not_allowed", "method not allowed"),
    413: ("payload_too_large", "request body is over the limit"),
}


def https_only_error(secure_url: str) -> dict[str, Any]:
    """The 403 for plain http where HTTPS is required (here, and on the HTTP front's agent routes)."""
    return error_body("permission_denied", "this API is served over HTTPS only", {"url": secure_url})


def nul_in_query_error() -> dict[str, Any]:
    """The 400 for U+0000 in the path or the query (here, and on the HTTP front's agent routes)."""
    return error_body("validation_error", "the path and query may not contain U+0000",
                      {"query": "U+0000 (%00) is not allowed"})


def bad_request_error() -> dict[str, Any]:
    """Django's own 400 (a host not allowed, say) in the contract's shape."""
    return error_body(*_CONTRACT_CODES[400])


def too_large_error(limit: int) -> dict[str, Any]:
    """The 413 for a body over the limit, declared or chunked (here, and on the agent routes)."""
    return error_body("payload_too_large", f"request body is over the limit of {limit} bytes")


def invalid_length_error() -> dict[str, Any]:
    """The 400 for a Content-Length that is not a length (here, and on the agent routes)."""
    return error_body("validation_error", "invalid Content-Length")


def _too_large(limit: int) -> HttpResponse:
    return JsonResponse(too_large_error(limit), status=413)


def _add_trailing_slash(request: HttpRequest) -> None:
    """``/api/v1/tasks`` is ``/api/v1/tasks/``: routed in place, before CommonMiddleware would
    answer with a redirect (an HTML 301, or a 500 for a POST with DEBUG on) that no client
    should have to follow with its body."""
    path_info = request.path_info
    if path_info.endswith("/"):
        return
    candidate = path_info + "/"
    if not is_valid_path(path_info, getattr(request, "urlconf", None)) and is_valid_path(
        candidate, getattr(request, "urlconf", None)
    ):
        request.path_info = candidate
        request.path = request.path + "/"
        request.META["PATH_INFO"] = candidate


def _read_chunked_body(request: HttpRequest, limit: int) -> HttpResponse | None:
    """A body sent with ``Transfer-Encoding: chunked`` has no Content-Length, and Django's
    WSGIRequest (which a2wsgi feeds under uvicorn) then reads it as empty. Read it here, at
    most one byte past the limit, and hand it on as if its length had been declared."""
    # Django's private request attributes go through vars(): WSGIRequest's stream is capped at
    # the declared length (0), so read its input directly; ASGIRequest's stream is the whole body.
    source: Any = request.environ["wsgi.input"] if isinstance(request, WSGIRequest) else vars(request)["_stream"]
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        part = source.read(min(READ_CHUNK, limit + 1 - size))
        if not part:
            break
        parts.append(part)
        size += len(part)
    if size > limit:
        return _too_large(limit)
    body = b"".join(parts)
    vars(request).update(_body=body, _stream=io.BytesIO(body), _read_started=False)
    request.META["CONTENT_LENGTH"] = str(len(body))
    return None


def _refuse_before_view(request: HttpRequest) -> HttpResponse | None:
    """403 for plain http where HTTPS is required; 413 for a body over the limit. DRF reads the
    body as a stream, which skips Django's DATA_UPLOAD_MAX_MEMORY_SIZE check, so the limit is
    enforced here, before any parsing."""
    if settings.SECURE_SSL_REDIRECT and not request.is_secure():
        # Not a redirect: a client would follow a 301 with a GET, and its token has already
        # crossed the network in the clear. It must be told to change its base URL.
        secure_url = request.build_absolute_uri().replace("http://", "https://", 1)
        return JsonResponse(https_only_error(secure_url), status=403)
    if "\x00" in request.path_info or any("\x00" in key or any("\x00" in value for value in values)
                                          for key, values in request.GET.lists()):
        # PostgreSQL refuses NUL in text: a path or query value holding one would reach SQL as a 500.
        return JsonResponse(nul_in_query_error(), status=400)
    limit = settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
    raw_length = request.META.get("CONTENT_LENGTH")
    try:
        declared = int(raw_length or 0)
    except ValueError:
        return JsonResponse(invalid_length_error(), status=400)
    if declared < 0:
        return JsonResponse(invalid_length_error(), status=400)
    if declared > limit:
        return _too_large(limit)
    if not raw_length and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        return _read_chunked_body(request, limit)
    return None


def _in_contract_shape(response: HttpResponse) -> HttpResponse:
    """Django's HTML answers (404 and 405 pages, CSRF's 403, a 500 page) become the contract's JSON."""
    if response.status_code < 400 or response.get("Content-Type", "").startswith("application/json"):
        return response
    if response.status_code >= 500:
        converted = json_error("internal_error", "internal error", response.status_code)
    else:
        code, message = _CONTRACT_CODES.get(response.status_code, ("error", response.reason_phrase.lower()))
        converted = json_error(code, message, response.status_code)
    for header in ("Allow", "Retry-After"):
        if header in response:
            converted[header] = response[header]
    return converted


class ApiErrorMiddleware:
    """The API's transport rules (module docstring), in the contract's error shape. Sync only:
    HTTP is served through Django's WSGI handler (backplane/asgi.py)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        _add_trailing_slash(request)
        refused = _refuse_before_view(request)
        if refused is not None:
            return refused
        return _in_contract_shape(self.get_response(request))


# --- under Django: the ASGI server's side -------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
# Loose on purpose: each ASGI library types its scope and messages with TypedDicts of its own.
AsgiApp = Callable[..., Awaitable[None]]


class AnswerEveryRequest:
    """Plain ASGI around the HTTP application, so that no request is left without the contract's answer.

    Whatever escapes the application before it started its answer (an error in the WSGI
    adapter, a response header it cannot encode as latin-1, a bug) is logged and answered with a
    JSON ``500 internal_error``, never left to the server's plain-text page; once an answer has
    started, the server closes the connection. (A request line uvicorn cannot parse, such as raw
    bytes past ASCII in the query, never reaches an application: uvicorn answers it with 400.)
    A Content-Type Django cannot parse is answered 400 here, before either stack sees it.
    """

    def __init__(self, app: AsgiApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _content_type_unparsable(scope):
            # Django 5.2 builds its request by parsing Content-Type and raises ValueError on an
            # RFC 2231 parameter in an encoding Python does not know (charset*=bogus''x), before
            # any middleware: a 500 for any route. Django 6.1 answers 400 (ticket #36991); so do we.
            await _send_json(send, 400, bad_request_error())
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            if started:
                raise
            logger.exception("unhandled error under the HTTP application: %s %s",
                             scope.get("method"), scope.get("path"))
            await _send_json(send, 500, error_body("internal_error", "internal error"))


def _content_type_unparsable(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            try:
                parse_header_parameters(value.decode("latin-1"))
            except ValueError:
                return True
    return False


async def _send_json(send: Callable[[Message], Awaitable[None]], status: int, error: dict[str, Any]) -> None:
    body = json.dumps(error).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
