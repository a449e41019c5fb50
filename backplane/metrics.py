"""GET /metrics: Prometheus text format, computed from the database at scrape time.

Collected per scrape (a custom collector) rather than with process-local counters, so
every web process reports the same figures whatever handled the writes. Parts above the core
add their own collectors with ``register_collector`` (recovery does in its ``AppConfig.ready``).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from backplane.delivery import selectors as delivery_selectors
from backplane.eventlog.models import Task
from backplane.integrity import verification as integrity


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


_registry = CollectorRegistry(auto_describe=False)
_registry.register(BackplaneCollector())  # type: ignore[arg-type]


def register_collector(collector: object) -> None:
    """Add a collector (an object with ``collect() -> Iterator[Metric]``) to /metrics."""
    _registry.register(collector)  # type: ignore[arg-type]


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
