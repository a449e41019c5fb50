"""ASGI entry point: WebSockets through Channels, HTTP through Django's WSGI handler.

Why HTTP is not Django's ASGI handler: every view here is synchronous (DRF, the admin),
and under Django's ASGI handler each of the nine middlewares runs its request and
response hooks through its own hop to a worker thread. Measured on this 2-core machine,
a trivial view took 3.9 ms that way against 0.4 ms through the WSGI handler. So an HTTP
request makes one hop to a thread of a2wsgi's pool and runs the whole synchronous stack
there (docs/benchmarks.md has the figures).
"""

import os

from a2wsgi import WSGIMiddleware
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")
# Django must be set up before anything imports models (the WebSocket routes do).
django_wsgi_app = get_wsgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from dashboard.routing import websocket_urlpatterns  # noqa: E402

# Threads that run HTTP requests; each holds at most one pooled database connection.
ASGI_THREADS = int(os.environ.get("BACKPLANE_HTTP_THREADS", "16"))


application = ProtocolTypeRouter(
    {
        "http": WSGIMiddleware(django_wsgi_app, workers=ASGI_THREADS),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
