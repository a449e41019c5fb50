"""GET /metrics: Prometheus text format, the same figures whichever web process answers.

Two kinds of figures, both the same in every process:
- states, read from the database at scrape time (a custom collector): outbox, dead letters,
  tasks, duties, integrity, sealing. Parts above the core add their own collectors with
  ``register_collector`` (recovery does in its ``AppConfig.ready``). Every figure is an
  aggregate computed by the database (a count, a group-by, a min), never a list fetched and
  counted here, so a scrape costs the same number of queries at any size;
- counters and histograms of what happened (events appended, deliveries, HTTP requests, ...),
  counted by every process into its own files (``backplane/telemetry/counters.py``,
  django-prometheus) and summed here from ``settings.PROMETHEUS_MULTIPROC_DIR``.

``BACKPLANE_METRICS_TOKEN``: when set, a scrape must send ``Authorization: Bearer <token>``
(Prometheus' ``authorization`` scrape setting). Without it the page is open only where
``BACKPLANE_METRICS_OPEN`` says so (development and tests by default), and refused in production.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.outbox import cdc_enabled
from backplane.eventlog.models import Event, Task
from backplane.integrity import verification as integrity
from backplane.integrity.models import MerkleLeaf, SignedTreeHead, VerificationRun
from backplane.integrity.stream import event_stream_lag
from backplane.runtime.duties import duties_state
from backplane.runtime.replica import replica_configured, replica_state

_SEALING_SQL = f"""
SELECT (SELECT signed_at FROM {SignedTreeHead._meta.db_table} ORDER BY tree_size DESC LIMIT 1),
       (SELECT recorded_at FROM {Event._meta.db_table}
        WHERE position > (SELECT coalesce(max(event_id), 0) FROM {MerkleLeaf._meta.db_table})
        ORDER BY position LIMIT 1),
       now()
"""


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
        # The fleet's work: sandbox forks (replays) are left out of the fleet's figures.
        tasks = GaugeMetricFamily("backplane_tasks", "Tasks by status (sandbox replays left out)", labels=["status"])
        for status, count in (Task.objects.filter(sandbox=False).values_list("status").annotate(n=Count("id"))
                              .values_list("status", "n")):
            tasks.add_metric([status], count)
        yield tasks
        summary = integrity.integrity_summary(alert_limit=0)
        yield GaugeMetricFamily("backplane_integrity_alerts_unacknowledged",
                                "Broken hash chains found by the verifier that nobody has acknowledged yet",
                                value=summary.open_alert_count)
        yield from self.collect_verification_runs(summary.last_incremental, summary.last_full)
        yield from self.collect_sealing()
        yield from self.collect_duties()
        yield from self.collect_replica()
        yield from self.collect_cdc_slot()
        if settings.BACKPLANE_EVENT_STREAM:
            yield GaugeMetricFamily("backplane_event_stream_lag_leaves",
                                    "Sealed events not yet published to the event log's Kafka topics",
                                    value=event_stream_lag())

    @staticmethod
    def collect_verification_runs(*last_runs: VerificationRun | None) -> Iterator[Metric]:
        """The last finished chain verification of each mode: how long ago, and what it found."""
        now = timezone.now()
        age = GaugeMetricFamily("backplane_verification_last_run_age_seconds",
                                "Seconds since the last finished chain verification of each mode", labels=["mode"])
        failures = GaugeMetricFamily("backplane_verification_last_run_failures",
                                     "Broken chains or rows found by the last finished verification of each mode",
                                     labels=["mode"])
        for run in last_runs:
            if run is not None and run.finished_at is not None:
                age.add_metric([run.mode], (now - run.finished_at).total_seconds())
                failures.add_metric([run.mode], run.failures)
        yield from (age, failures)

    @staticmethod
    def collect_sealing() -> Iterator[Metric]:
        """How far sealing is behind: the events past the highest sealed one, oldest first (by
        position, the primary key). The sealer runs every few seconds, so a growing age means it
        has stopped. One statement."""
        with connection.cursor() as cursor:
            cursor.execute(_SEALING_SQL)
            signed_at, oldest_unsealed, now = cursor.fetchone()
        last_signed = GaugeMetricFamily("backplane_seal_last_signed_age_seconds",
                                        "Seconds since the last signed tree head (none is signed while nothing is new)")
        if signed_at is not None:
            last_signed.add_metric([], (now - datetime.fromisoformat(signed_at)).total_seconds())
        yield last_signed
        yield GaugeMetricFamily("backplane_seal_oldest_unsealed_age_seconds",
                                "Age of the oldest event not yet sealed into the Merkle tree (0 when none waits)",
                                value=(now - oldest_unsealed).total_seconds() if oldest_unsealed is not None else 0.0)

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


    @staticmethod
    def collect_replica() -> Iterator[Metric]:
        """The read replica as this process judges it (backplane/runtime/replica.py); nothing
        without one. The lag is absent when it could not be measured (unreachable)."""
        if not replica_configured():
            return
        state = replica_state()
        yield GaugeMetricFamily("backplane_replica_usable",
                                "1 when the read replica serves the reads routed to it, 0 while they fall back to "
                                "the primary", value=1 if state.usable else 0)
        lag = GaugeMetricFamily("backplane_replica_lag_seconds",
                                "Upper bound on the age of the oldest commit the replica has not replayed")
        if state.lag_seconds is not None:
            lag.add_metric([], state.lag_seconds)
        yield lag


    @staticmethod
    def collect_cdc_slot() -> Iterator[Metric]:
        """The CDC relay's replication slot (backplane/delivery/cdc.py); nothing in the polling mode."""
        if not cdc_enabled():
            return
        state = delivery_selectors.slot_state()
        yield GaugeMetricFamily("backplane_cdc_slot_present", "1 when the CDC relay's replication slot exists",
                                value=1 if state.exists else 0)
        yield GaugeMetricFamily("backplane_cdc_slot_active", "1 while Kafka Connect reads the replication slot",
                                value=1 if state.active else 0)
        yield GaugeMetricFamily("backplane_cdc_slot_lag_bytes",
                                "WAL the CDC relay's slot holds back: from its confirmed position to the server's",
                                value=state.lag_bytes)


class SummedAcrossProcesses:
    """The counters and histograms every process wrote to its files, summed (prometheus_client's
    multiprocess mode). The directory is read at each scrape, so files of processes that started
    or died since are counted; a dead process's counts stay in the sums."""

    def collect(self) -> Iterable[Metric]:
        files = [str(path) for path in Path(settings.PROMETHEUS_MULTIPROC_DIR).glob("*.db")]
        return MultiProcessCollector.merge(files, accumulate=True)


_registry = CollectorRegistry(auto_describe=False)
_registry.register(BackplaneCollector())
_registry.register(SummedAcrossProcesses())


def register_collector(collector: Collector) -> None:
    """Add a collector (an object with ``collect() -> Iterator[Metric]``) to /metrics."""
    _registry.register(collector)


def metrics_token_sent(request: HttpRequest) -> bool:
    """``Authorization: Bearer <BACKPLANE_METRICS_TOKEN>``, with a token set (also what opens
    ``/readyz``'s details, backplane/health.py)."""
    expected = settings.BACKPLANE_METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # compare_digest takes as long whatever prefix matches: the token cannot be guessed byte by byte.
    return bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                                 expected.encode())


def _authorized(request: HttpRequest) -> bool:
    if not settings.BACKPLANE_METRICS_TOKEN:
        return bool(settings.BACKPLANE_METRICS_OPEN)
    return metrics_token_sent(request)


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        explanation = (
            "metrics need Authorization: Bearer <BACKPLANE_METRICS_TOKEN>\n" if settings.BACKPLANE_METRICS_TOKEN
            else "metrics are closed: set BACKPLANE_METRICS_TOKEN, or BACKPLANE_METRICS_OPEN=true where only your "
                 "scraper can reach this port\n")
        response = HttpResponse(explanation, status=401,
                                content_type="text/plain; charset=utf-8")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(_registry), content_type=CONTENT_TYPE_LATEST)
