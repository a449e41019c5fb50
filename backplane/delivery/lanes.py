"""Delivery lanes: each destination (the broker, each webhook subscription) delivered in threads
of its own, so a slow or dead destination holds up nothing but itself.

One ``LaneRunner`` per process (the Celery worker's, or ``manage.py relay``'s) owns a pool of
``BACKPLANE_OUTBOX_RELAY_THREADS`` threads. ``tick()`` is quick — two queries, no delivery — and
starts a job for every destination with due messages, as long as the destination has fewer jobs
running than its concurrency. A job loops ``outbox_relay_lane_once`` (claim, deliver, record:
relay.py) until the destination has nothing claimable or the job's time is up, then closes its
database connection and ends. The broker keeps threads of its own: webhooks together never take
more than the pool minus the broker's share, so any number of hanging endpoints leaves the
broker's deliveries alone. The periodic task that calls ``tick()`` returns at once: a Celery worker
thread never waits for a POST, and the duties beside it (the stall detector) keep theirs.

A destination whose delivery ran into its deadline goes on *trial*, as a circuit breaker's half-open
state does: its jobs claim one message at a time until one is delivered again.

In the CDC mode (backplane/delivery/cdc.py) the broker's messages are Debezium's to publish: the
broker's share of the threads runs one job instead that reads back what reached Kafka and marks
those rows delivered (``PublishedConfirmations``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from django.conf import settings
from django.db import connection

from backplane.delivery import relay
from backplane.delivery.cdc import PublishedConfirmations
from backplane.delivery.outbox import cdc_enabled
from backplane.delivery.policy import BROKER_LANE, Lane, LanePolicy
from backplane.delivery.sinks import Sinks

logger = logging.getLogger(__name__)

# A job gives its thread back after this long even with work left (the next tick goes on), so
# new settings and subscriptions are picked up and connections do not live forever.
JOB_SECONDS = 10.0


class LaneRunner:
    def __init__(self, *, threads: int | None = None, batch_size: int | None = None,
                 publisher_factory: Callable[[], relay.Publisher] | None = None) -> None:
        self.threads = threads or settings.BACKPLANE_OUTBOX_RELAY_THREADS
        self.batch_size = batch_size or settings.BACKPLANE_OUTBOX_BATCH_SIZE
        self._publisher_factory = publisher_factory or Sinks
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="outbox-lane")
        self._lock = threading.Lock()
        self._running: Counter[Lane] = Counter()
        self._futures: set[Future[None]] = set()
        self._on_trial: set[Lane] = set()
        self._stopping = threading.Event()
        self._local = threading.local()
        self._publishers: list[relay.Publisher] = []
        self._confirmations: PublishedConfirmations | None = None
        self._confirming = False

    # -- what the caller does --

    def tick(self) -> int:
        """Start jobs for the destinations that have due messages and room; return how many."""
        if self._stopping.is_set():
            return 0
        policies = relay.outbox_lanes_due()
        started = 0
        with self._lock:
            if cdc_enabled() and not self._confirming:
                self._confirming = True
                self._submit(self._confirm_job)
                started += 1
            broker_share = min(settings.BACKPLANE_OUTBOX_BROKER_CONCURRENCY, self.threads - 1)
            webhook_room = self.threads - broker_share - sum(n for lane, n in self._running.items() if lane is not None)
            for policy in policies:
                limit = broker_share if policy.lane is BROKER_LANE else policy.concurrency
                # A destination on trial gets one job; the others fill their concurrency
                # (jobs that find nothing left to claim end at once).
                if policy.lane in self._on_trial:
                    limit = 1
                while self._running[policy.lane] < limit:
                    if policy.lane is not BROKER_LANE:
                        if webhook_room <= 0:
                            break
                        webhook_room -= 1
                    self._running[policy.lane] += 1
                    self._submit(self._job, policy)
                    started += 1
        return started

    def _submit(self, job: Callable[..., None], *args: object) -> None:
        future = self._executor.submit(job, *args)
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)

    def running(self) -> dict[Lane, int]:
        with self._lock:
            return {lane: n for lane, n in self._running.items() if n}

    def stop(self, timeout: float = 60.0) -> bool:
        """Start no more jobs; running ones give their untried rows back after the delivery under
        way (at most its deadline). Waits up to ``timeout`` for them, then closes the sinks; False
        when some were still running (the process's exit waits for the pool's threads anyway)."""
        self._stopping.set()
        _, still_running = wait(list(self._futures), timeout=timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if still_running:
            return False
        if self._confirmations is not None:
            try:
                self._confirmations.close()
            except Exception:  # noqa: BLE001 - shutting down; its uncommitted records are read again
                logger.debug("closing the CDC confirmations' consumer failed", exc_info=True)
        with self._lock:
            publishers, self._publishers = self._publishers, []
        for publisher in publishers:
            close = getattr(publisher, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - shutting down; a sink that fails to close is only logged
                    logger.debug("closing a sink failed", exc_info=True)
        return True

    # -- in the pool's threads --

    def _publisher(self) -> relay.Publisher:
        """One publisher per thread (a kombu connection and an HTTP client are not thread-safe),
        kept across jobs so connections are reused."""
        publisher = getattr(self._local, "publisher", None)
        if publisher is None:
            publisher = self._local.publisher = self._publisher_factory()
            with self._lock:
                self._publishers.append(publisher)
        return publisher

    def _confirm_job(self) -> None:
        """Mark delivered what Debezium published, for one job's time (one such job at a time:
        its Kafka consumer is not shared between threads)."""
        try:
            if self._confirmations is None:
                self._confirmations = PublishedConfirmations()
            self._confirmations.confirm(until=time.monotonic() + JOB_SECONDS, should_stop=self._stopping.is_set)
        except Exception:  # noqa: BLE001 - the next tick starts another; the rows wait, counted as pending
            logger.exception("marking the messages Debezium published failed")
            # A fresh consumer next time: it reads again from the last committed offsets.
            confirmations, self._confirmations = self._confirmations, None
            if confirmations is not None:
                confirmations.close()
            time.sleep(1)
        finally:
            connection.close()
            with self._lock:
                self._confirming = False

    def _job(self, policy: LanePolicy) -> None:
        deadline = time.monotonic() + JOB_SECONDS
        try:
            while not self._stopping.is_set() and time.monotonic() < deadline:
                step = relay.outbox_relay_lane_once(
                    policy=policy, publish=self._publisher(), batch_size=self.batch_size,
                    trial=policy.lane in self._on_trial, should_stop=self._stopping.is_set, deadline=deadline,
                )
                with self._lock:
                    if step.timed_out:
                        if policy.lane not in self._on_trial:
                            logger.warning("outbox destination %s did not answer within %.0f s; trying it "
                                           "with one message at a time", policy.name, policy.timeout_seconds)
                        self._on_trial.add(policy.lane)
                    elif step.delivered:
                        self._on_trial.discard(policy.lane)
                if step.claimed == 0 or step.timed_out:
                    break
                if step.failed or step.dead:
                    logger.warning("outbox relay to %s: %d failed, %d dead of %d claimed", policy.name, step.failed,
                                   step.dead, step.claimed)
        except Exception:  # noqa: BLE001 - a lane must not take the process down; its claims expire and are retried
            logger.exception("outbox delivery to %s stopped on an error", policy.name)
        finally:
            # Every unit of work ends with its connection closed (a thread of ours is no request
            # or task, so nothing else would close it).
            connection.close()
            with self._lock:
                self._running[policy.lane] -= 1
