"""backplane/lib/messages.py: Django's messages, their storage built only when a request uses them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib import messages
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from django.utils.functional import empty

from backplane.lib.messages import LazyMessageMiddleware

pytestmark = pytest.mark.django_db


def serve(view: Callable[[HttpRequest], HttpResponse], cookies: dict[str, str]) -> tuple[HttpRequest, HttpResponse]:
    """One request through the session and message middlewares, as the product stacks them."""
    request = RequestFactory().get("/")
    request.COOKIES.update(cookies)
    response = SessionMiddleware(LazyMessageMiddleware(view))(request)
    assert isinstance(response, HttpResponse)
    return request, response


def test_a_message_added_by_one_request_is_shown_by_a_later_one() -> None:
    def add(request: HttpRequest) -> HttpResponse:
        messages.success(request, "Requeued #7")
        return HttpResponse()

    shown: list[str] = []

    def show(request: HttpRequest) -> HttpResponse:
        shown.extend(str(message) for message in messages.get_messages(request))
        return HttpResponse()

    _, added = serve(add, {})
    stored = added.cookies["messages"].value
    assert stored

    # A request that never looks at messages (an API call, /healthz) builds no storage and
    # leaves the stored message where it is.
    untouched_request, untouched = serve(lambda request: HttpResponse(), {"messages": stored})
    assert vars(untouched_request)["_messages"]._wrapped is empty
    assert "messages" not in untouched.cookies

    _, read = serve(show, {"messages": stored})
    assert shown == ["Requeued #7"]
    # Shown once: the cookie is cleared.
    assert read.cookies["messages"].value == "" and read.cookies["messages"]["max-age"] == 0
