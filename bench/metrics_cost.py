"""What /metrics' counting costs the hot paths, per request or append, in one process.

- HTTP: django-prometheus' two middlewares against ``RequestMetricsMiddleware``
  (backplane/telemetry/http.py), on a request to /readyz/traffic with a view that costs nothing;
- an append: what ``count_committed_events`` and the append histogram record once it committed
  (backplane/telemetry/counters.py).

Counters are written in multiprocess mode, as the product writes them, to a throw-away directory.
Needs no database:

    .venv/bin/python bench/metrics_cost.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
_scratch = tempfile.mkdtemp(prefix="bp-metrics-cost-")
os.environ.update(BACKPLANE_ENV="test", DATABASE_URL="postgresql://bench@localhost/bench", SECRET_KEY="bench",
                  BACKPLANE_VAR_DIR=os.path.join(_scratch, "var"), DJANGO_SETTINGS_MODULE="backplane.settings")

import django  # noqa: E402

django.setup()

from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import RequestFactory  # noqa: E402
from django.urls import resolve  # noqa: E402
from django_prometheus.middleware import PrometheusAfterMiddleware, PrometheusBeforeMiddleware  # noqa: E402

from backplane.telemetry import counters  # noqa: E402
from backplane.telemetry.http import RequestMetricsMiddleware  # noqa: E402


def microseconds_per_call(call: Callable[[], object], *, calls: int = 20_000, rounds: int = 7) -> float:
    for _ in range(2_000):
        call()
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            call()
        timings.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(timings)


def main() -> None:
    request = RequestFactory().get("/readyz/traffic")
    request.resolver_match = resolve("/readyz/traffic")
    response = HttpResponse(b'{"status":"ok"}', content_type="application/json")

    def view(_: HttpRequest) -> HttpResponse:
        return response

    before, after = PrometheusBeforeMiddleware(view), PrometheusAfterMiddleware(view)
    ours = RequestMetricsMiddleware(view)

    def django_prometheus() -> None:
        before.process_request(request)
        after.process_request(request)
        after.process_view(request, view)
        after.process_response(request, response)
        before.process_response(request, response)

    def append_counted() -> None:
        counters.events_appended_count(type_label="ReasoningStepCompleted", count=1)
        counters.APPEND_DURATION.observe(0.0005)

    bare = microseconds_per_call(lambda: view(request))
    theirs_cost = microseconds_per_call(django_prometheus) - bare
    ours_cost = microseconds_per_call(lambda: ours(request)) - bare
    print(f"HTTP, django-prometheus' two middlewares: {theirs_cost:.1f} µs a request")
    print(f"HTTP, RequestMetricsMiddleware:          {ours_cost:.1f} µs a request")
    print(f"an append's counter and histogram:       {microseconds_per_call(append_counted):.1f} µs an append")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(_scratch, ignore_errors=True)
