"""The ASGI guard under the HTTP application (backplane/asgi.py wraps the WSGI adapter in it):
whatever escapes before an answer started is answered in the contract's shape, never left as a
connection without an answer; after an answer started, the server is left to close it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from api.middleware import AnswerEveryRequest, bad_request_error
from backplane import asgi

SCOPE = {"type": "http", "method": "POST", "path": "/api/v1/tasks/"}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


def serve(app: Any) -> list[MutableMapping[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(AnswerEveryRequest(app)(dict(SCOPE), _receive, send))
    return sent


def test_it_answers_an_error_that_escapes_before_the_answer_started(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope: Any, receive: Any, send: Any) -> None:
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    start, body = serve(broken)
    assert (start["type"], start["status"]) == ("http.response.start", 500)
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    error = json.loads(body["body"])["error"]
    assert (error["code"], set(error)) == ("internal_error", {"code", "message", "details"})
    assert "unhandled error under the HTTP application" in caplog.text


def test_it_leaves_an_answer_that_started_to_the_server() -> None:
    async def half(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("after the start")

    with pytest.raises(RuntimeError):
        serve(half)


def test_the_served_application_is_wrapped() -> None:
    assert isinstance(asgi.router.application_mapping["http"], AnswerEveryRequest)


@pytest.mark.parametrize("path", ["/api/v1/tasks/", "/api/v1/tasks/00000000-0000-0000-0000-000000000001/events/",
                                  "/admin/login/"])
def test_a_content_type_in_an_unknown_rfc_2231_encoding_is_a_400_on_either_stack(path: str) -> None:
    # Django 5.2 parses Content-Type while it builds the request, before any middleware, and
    # raises ValueError on an encoding Python does not know.
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json; charset*=bogus''x"),
                         (b"authorization", b"Bearer bp_nothing")],
             "server": ("testserver", 80), "client": ("127.0.0.1", 1), "scheme": "http", "http_version": "1.1",
             "root_path": "", "asgi": {"version": "3.0"}}
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(asgi.router.application_mapping["http"](scope, _receive, send))
    start, body = sent
    assert start["status"] == 400 and dict(start["headers"])[b"content-type"] == b"application/json"
    assert json.loads(body["body"]) == bad_request_error()
