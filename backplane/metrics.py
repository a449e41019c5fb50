"""GET /metrics: Prometheus text format, computed from the database at scrape time.

Collected per scrape (a custom collector) rather than with process-local counters, so
every web process reports the same figures whatever handled the writes. Parts above the core
add their own collectors with ``register_collector`` (recovery does in its ``AppConfig.ready``).
Every figure is an aggregate computed by the database (a count or a group-by), never a list
fetched and counted here, so a scrape costs the same number of queries at any size.

``BACKPLANE_METRICS_TOKEN``: when set, a scrape must send ``Authorization: Bearer <token>``
(Prometheus' ``authorization`` scrape setting); when empty the page is open, as it was.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from backplane.delivery import selectors as delivery_selectors
from backplane.eventlog.models import Task
from backplane.integrity import verification as integrity
from backplane.runtime.duties import duties_state


class BackplaneCollector:
    def collect(self) -> Iterator[Metric]:
        stats = delivery_selectors.outbox_stats()
        yield GaugeMetricFamily("backplane_outbox_lag_seconds", "Age of the oldest due, undelivered message",
                                value=stats.lag_seconds)
        messages = GaugeMetricFamily("backplane_outbox_messages", "Outbox rows by state", labels=["state"])
        messages.add_metric(["pending"], stats.pending)
        messages.add_metric(["failing"], stats.failing)
        messages.add_metric(["delivered"], stats.delivered)
        messages.add_metric(["dead"], stats.dead)
        # Under a relay's live claim, and dead letters holding their key (strict ordering).
        messages.add_metric(["in_flight"], stats.in_flight)
        messages.add_metric(["held"], stats.held)
        yield messages
        yield GaugeMetricFamily("backplane_dead_letters_pending", "Dead letters waiting for a decision",
                                value=stats.dead_letters_pending)
        tasks = GaugeMetricFamily("backplane_tasks", "Tasks by status", labels=["status"])
        for status, count in Task.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"):
            tasks.add_metric([status], count)
        yield tasks
        yield GaugeMetricFamily("backplane_integrity_alerts_unacknowledged",
                                "Broken hash chains found by the verifier that nobody has acknowledged yet",
                                value=integrity.integrity_summary(alert_limit=0).open_alert_count)
        yield from self.collect_duties()

    @staticmethod
    def collect_duties() -> Iterator[Metric]:
        """Each periodic duty's age (backplane/runtime/duties.py): alert on ``backplane_duty_overdue``."""
        age = GaugeMetricFamily("backplane_duty_last_success_age_seconds",
                                "Seconds since the duty last succeeded (or since beat started watching it)",
                                labels=["duty"])
        overdue = GaugeMetricFamily("backplane_duty_overdue",
                                    "1 when the duty has not succeeded for a few of its intervals", labels=["duty"])
        interval = GaugeMetricFamily("backplane_duty_interval_seconds", "How often beat runs the duty",
                                     labels=["duty"])
        runs = CounterMetricFamily("backplane_duty_runs", "Finished runs of the duty", labels=["duty"])
        failures = CounterMetricFamily("backplane_duty_failures", "Runs of the duty that raised", labels=["duty"])
        for duty in duties_state():
            if duty.age_seconds is not None:
                age.add_metric([duty.name], duty.age_seconds)
            overdue.add_metric([duty.name], 1 if duty.overdue else 0)
            interval.add_metric([duty.name], duty.interval_seconds)
            runs.add_metric([duty.name], duty.runs_total)
            failures.add_metric([duty.name], duty.failures_total)
        yield from (age, overdue, interval, runs, failures)


_registry = CollectorRegistry(auto_describe=False)
_registry.register(BackplaneCollector())  # type: ignore[arg-type]


def register_collector(collector: object) -> None:
    """Add a collector (an object with ``collect() -> Iterator[Metric]``) to /metrics."""
    _registry.register(collector)  # type: ignore[arg-type]


def _authorized(request: HttpRequest) -> bool:
    expected = settings.BACKPLANE_METRICS_TOKEN
    if not expected:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # compare_digest takes as long whatever prefix matches: the token cannot be guessed byte by byte.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        response = HttpResponse("metrics need Authorization: Bearer <BACKPLANE_METRICS_TOKEN>\n", status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
