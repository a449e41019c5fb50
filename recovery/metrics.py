"""Recovery's figures on /metrics, added through ``backplane.metrics.register_collector``.

Each figure is one ``COUNT(*)`` in the database, whatever the number of rows it counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, Metric

from backplane.eventlog.models import Task
from recovery.models import ToolCall, ToolCallStatus


class RecoveryCollector:
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        # The same rules as recovery.selectors.tasks_without_progress and tool_calls_overdue,
        # which list the rows for the dashboard; here only their number is wanted.
        silent_since = now - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_FLAG_SECONDS)
        without_progress = Task.objects.filter(status="running", lease_holder__isnull=False,
                                               last_event_at__lt=silent_since).count()
        overdue_since = now - timedelta(seconds=settings.BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS)
        overdue = ToolCall.objects.filter(status=ToolCallStatus.DISPATCHED, dispatched_at__lt=overdue_since).count()
        yield GaugeMetricFamily("backplane_tasks_without_progress",
                                "Running tasks that heartbeat but have written no event for too long",
                                value=without_progress)
        yield GaugeMetricFamily("backplane_tool_calls_overdue", "Tool calls in flight longer than their timeout",
                                value=overdue)
