"""HTTP requests on /metrics: by route (Django's view name), method and status, and their latency.

The two figures are django-prometheus' (``django_http_responses_total_by_status_view_method`` and
``django_http_requests_latency_seconds_by_view_method``, with its ``PROMETHEUS_LATENCY_BUCKETS``
and ``PROMETHEUS_METRIC_NAMESPACE`` settings), so its usual dashboards and queries apply, but
they are recorded by this one middleware instead of its two. Those record sixteen values a
request (requests by method, by transport, body sizes, charsets, ...), each a write to the
process's metrics file, looking most label children up again; this one records two, from label
children it keeps (``bench/metrics_cost.py`` compares them).

First in ``MIDDLEWARE``: the latency includes every other middleware, and a view's exception has
become its 500 response by the time it gets here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django_prometheus.conf import NAMESPACE, PROMETHEUS_LATENCY_BUCKETS
from prometheus_client import Counter, Histogram

# Not in prometheus_client's default registry: /metrics reads the processes' files, and a process
# that also loads django-prometheus' own middlewares (bench/metrics_cost.py) must not clash.
RESPONSES = Counter("django_http_responses_total_by_status_view_method", "Count of responses by status, view, method.",
                    ["status", "view", "method"], namespace=NAMESPACE, registry=None)
LATENCY = Histogram("django_http_requests_latency_seconds_by_view_method",
                    "Histogram of request processing time labelled by view.", ["view", "method"],
                    buckets=PROMETHEUS_LATENCY_BUCKETS, namespace=NAMESPACE, registry=None)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})
UNNAMED_VIEW = "<unnamed view>"  # django-prometheus' label for a request no route matched (a 404)


# (view, method, status) -> the two label children: looking one up by its labels costs as much as
# recording to it. Bounded: views, methods and statuses are.
_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}


def count_response(*, view: str, method: str, status: int, seconds: float) -> None:
    """Record one answered request; the HTTP front's own routes (api/agent_front.py) call it
    with their route's name, as the middleware below does for Django's."""
    method = method if method in _METHODS else "<invalid method>"
    key = (view, method, status)
    children = _children.get(key)
    if children is None:
        children = _children[key] = (
            RESPONSES.labels(status=str(status), view=view, method=method),
            LATENCY.labels(view=view, method=method),
        )
    children[0].inc()
    children[1].observe(seconds)


class RequestMetricsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        view = (match.view_name if match is not None else None) or UNNAMED_VIEW
        count_response(view=view, method=str(request.method), status=response.status_code,
                       seconds=time.perf_counter() - started)
        return response
