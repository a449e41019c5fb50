"""ASGI entry point: WebSockets through Channels; HTTP through the HTTP front, a Starlette router
that serves its own routes on the event loop and hands every other path to Django's WSGI handler.

The front's routes need nothing of Django's request stack: ``/healthz``, and an agent's requests
to the agent routes (api/agent_front.py: reads on psycopg's async pool, writes through the
services on the threads below). Everything else, the rest of the API, the dashboard and the
admin, is Django's.

Why the rest is not Django's ASGI handler: every view here is synchronous (DRF, the admin),
and under Django's ASGI handler each of the nine middlewares runs its request and
response hooks through its own hop to a worker thread, which costs far more than a trivial
view. So an HTTP request makes one hop to a thread of a2wsgi's pool and runs the whole
synchronous stack there (docs/benchmarks.md has the figures).
"""

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi_typing import WSGIApp
from django.core.wsgi import get_wsgi_application
from starlette.routing import Route, Router
from starlette.types import ASGIApp

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")
# Django must be set up before anything imports models (the WebSocket routes do).
django_wsgi_app = get_wsgi_application()

from api import agent_front  # noqa: E402
from api.middleware import AnswerEveryRequest  # noqa: E402
from backplane import health  # noqa: E402
from backplane.integrity.sealing import require_signing_key  # noqa: E402

# In production, no signing key means no seals and no audit export: refuse to serve at all.
require_signing_key()

from django.db import connection as django_db_connection  # noqa: E402

from backplane.privacy.services import require_key_encryption_keys  # noqa: E402


def _check_key_encryption_keys() -> None:
    try:
        require_key_encryption_keys()
    finally:
        django_db_connection.close()  # this thread serves no request


# Nor with key-encryption keys that do not open the data subjects' keys (lost, or wrong). On a
# thread of its own: uvicorn imports this module on its event loop, where Django refuses queries.
with ThreadPoolExecutor(max_workers=1) as _start_up:
    _start_up.submit(_check_key_encryption_keys).result()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard import live  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

# Threads that run HTTP requests; each holds at most one pooled database connection.
ASGI_THREADS = int(os.environ.get("BACKPLANE_HTTP_THREADS", "16"))


# A WSGI application all the same: a2wsgi types PEP 3333 with its own environ TypedDict and
# start_response protocol, which Django's stubs (wsgiref.types) do not match; and an ASGI
# application all the same, which a2wsgi types with its own scope and message TypedDicts.
django_wsgi = WSGIMiddleware(cast(WSGIApp, django_wsgi_app), workers=ASGI_THREADS)
django_http = cast(ASGIApp, django_wsgi)

# The front's own routes: /healthz, and an agent's requests (a bearer token) to the agent routes
# (api/agent_front.py), whose writes run on the same threads as Django's requests: one pool of
# threads, each holding at most one pooled database connection. redirect_slashes off: every
# other request goes to Django as it came, for Django's own APPEND_SLASH and 404s.
http_front = Router(routes=[Route("/healthz", health.healthz, methods=["GET"]),
                            *agent_front.agent_routes(django_wsgi.executor)],
                    default=django_http, redirect_slashes=False)

router = ProtocolTypeRouter(
    {
        "http": AnswerEveryRequest(http_front),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # Live notices are sent from the server's own loop, the one the consumers' channel layer
    # connections belong to (dashboard/live.py); binding is a no-op after the first request.
    live.bind_event_loop(asyncio.get_running_loop())
    await router(scope, receive, send)
