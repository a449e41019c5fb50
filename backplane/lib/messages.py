"""Django's message framework, with its storage built only for a request that uses it.

``MessageMiddleware`` builds a ``FallbackStorage`` for every request: a cookie storage with its
signer and a session storage. Agents' API calls, health checks and metrics scrapes never use
messages; only the admin and the dashboard's forms do. Here the storage is built when something
first touches ``request._messages`` (adding a message, or a template listing them), and a
request that never did has nothing to store: Django's own ``update`` would return at once for
such a storage (it neither read nor added a message), so skipping it changes nothing in the
response.
"""

from __future__ import annotations

from typing import Any

from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.messages.storage import default_storage
from django.http import HttpRequest, HttpResponse
from django.utils.functional import SimpleLazyObject, empty


class LazyMessageMiddleware(MessageMiddleware):
    def process_request(self, request: HttpRequest) -> None:
        # Where Django's middleware puts it, and where ``messages.add_message`` looks for it.
        setattr(request, "_messages", SimpleLazyObject(lambda: default_storage(request)))  # noqa: B010

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        messages: Any = getattr(request, "_messages", None)
        if isinstance(messages, SimpleLazyObject) and messages._wrapped is empty:
            return response
        return super().process_response(request, response)
