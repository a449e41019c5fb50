"""Recovery's figures on /metrics, added through ``backplane.metrics.register_collector``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from recovery import selectors


class RecoveryCollector:
    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("backplane_tasks_without_progress",
                                "Running tasks that heartbeat but have written no event for too long",
                                value=len(selectors.tasks_without_progress()))
        yield GaugeMetricFamily("backplane_tool_calls_overdue", "Tool calls in flight longer than their timeout",
                                value=len(selectors.tool_calls_overdue()))
