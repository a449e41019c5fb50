"""The relay's three steps (backplane/delivery/relay.py): claims with a lease, delivery with no
transaction open, outcomes recorded only by the claim that still holds the row; the attempt
header, the retry schedule, strict and best-effort ordering, and the queues the broker sink
declares. Real PostgreSQL and the real filesystem broker; publishers are plain functions."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from kombu import Connection, Exchange, Queue

from backplane.delivery import outbox, relay
from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.lanes import LaneRunner
from backplane.delivery.models import DeadLetter, OutboxMessage, OutboxStatus, WebhookSubscription
from backplane.delivery.policy import BROKER_LANE, RetrySchedule, broker_policy, default_retry_schedule, webhook_policy
from backplane.delivery.sinks import KombuSink
from recovery import dead_letters

from .relay_harness import relay_database_url, wait_until


def enqueue(key: str, count: int, *, topic: str = "claims.t", first: int = 0) -> list[int]:
    """Rows straight into the outbox (the relay's input), without tasks, in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        return [
            outbox.outbox_enqueue(topic=topic, key=key, payload={"n": n}, headers={}, now=now)[0].pk
            for n in range(first, first + count)
        ]


class Recorder:
    """A publisher that records (key, n, attempt header) and refuses the keys in ``failing``."""

    def __init__(self, failing: set[str] | None = None, *, timed_out: bool = False) -> None:
        self.published: list[tuple[str, int, int]] = []
        self.failing = failing or set()
        self.timed_out = timed_out

    def __call__(self, message: OutboxMessage, body: dict[str, Any]) -> None:
        if message.key in self.failing:
            raise relay.PublishError("refused", timed_out=self.timed_out)
        self.published.append((message.key, body["payload"]["n"], body["headers"]["attempt"]))

    def of(self, key: str) -> list[int]:
        return [n for k, n, _ in self.published if k == key]


def claim_broker(limit: int = 100, lease_seconds: float = 30) -> relay.Claim | None:
    return relay.outbox_claim(lane=BROKER_LANE, limit=limit, lease_seconds=lease_seconds)


def expire_claims() -> None:
    """Make every live claim run out, as when its relay died (or stalled) a lease ago."""
    OutboxMessage.objects.exclude(claimed_until=None).update(claimed_until=timezone.now() - timedelta(seconds=1))


# --- claims and leases ------------------------------------------------------------------------


def test_a_claim_leases_the_head_of_each_key_and_counts_the_attempt(db: None) -> None:
    a, b = enqueue("a", 3), enqueue("b", 2)
    before = timezone.now()
    claim = claim_broker(lease_seconds=30)
    assert claim is not None
    assert [m.pk for m in claim.messages] == [a[0], b[0]]  # the heads only: per-key order
    rows = {row.pk: row for row in OutboxMessage.objects.all()}
    for pk in (a[0], b[0]):
        assert rows[pk].claim_token == claim.token and rows[pk].attempts == 1
        claimed_until = rows[pk].claimed_until
        assert claimed_until is not None
        assert before + timedelta(seconds=29) < claimed_until <= timezone.now() + timedelta(seconds=30)
    assert all(rows[pk].claim_token is None and rows[pk].attempts == 0 for pk in a[1:] + b[1:])
    # Claimed rows are still undelivered: their keys' next messages are not claimable yet.
    assert claim_broker() is None


def statements_of(queries: CaptureQueriesContext) -> list[str]:
    """The statements run, without the transaction's own (the test's atomic makes the claim's a savepoint)."""
    return [q["sql"] for q in queries.captured_queries
            if not q["sql"].startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT"))]


def test_a_claim_is_one_statement_that_returns_what_it_won_with_the_claims_values(db: None) -> None:
    enqueue("a", 2)
    enqueue("b", 1)
    with CaptureQueriesContext(connection) as queries:
        claim = claim_broker(lease_seconds=30)
    assert claim is not None
    # The rows come back as claimed, not read again after the update: their token and count are
    # the ones the claim wrote (a read before the update would show attempts 0 and no token).
    assert [(m.key, m.claim_token, m.attempts, m.claimed_until) for m in claim.messages] == [
        ("a", claim.token, 1, claim.until), ("b", claim.token, 1, claim.until)]
    statements = statements_of(queries)
    assert len(statements) == 1 and statements[0].lstrip().startswith("WITH won AS"), statements


def test_webhook_claims_read_their_subscription_once(db: None) -> None:
    subscription = WebhookSubscription.objects.create(name="s", url="http://127.0.0.1:9/h", topic_pattern="claims.#",
                                                      secret="s" * 32)
    now = timezone.now()
    with transaction.atomic():
        for n in range(3):
            outbox.outbox_enqueue(topic="claims.t", key=f"k{n}", payload={"n": n}, headers={}, now=now)
    with CaptureQueriesContext(connection) as queries:
        claim = relay.outbox_claim(lane=subscription.pk, limit=10, lease_seconds=30)
        assert claim is not None and len(claim.messages) == 3
        assert {m.subscription for m in claim.messages} == {subscription}
    statements = statements_of(queries)
    assert len(statements) == 2, statements  # the claim, and the subscription for all its rows


def test_an_expired_claim_is_taken_by_the_next_relay_and_the_first_ones_outcome_is_dropped(db: None) -> None:
    (pk,) = enqueue("a", 1)
    first = claim_broker()
    assert first is not None and claim_broker() is None  # leased
    expire_claims()  # the first relay stalled past its lease
    second = claim_broker()
    assert second is not None and [m.pk for m in second.messages] == [pk] and second.token != first.token
    assert OutboxMessage.objects.get(pk=pk).attempts == 2  # the lost attempt counts

    # The first relay wakes up: neither its success nor its failure changes the row now.
    assert relay.outbox_mark_delivered(claim=first, ids=[pk]) == 0
    outcome = relay.outbox_record_failure(message=first.messages[0], claim=first, error="late", policy=broker_policy())
    assert outcome == relay.LOST
    row = OutboxMessage.objects.get(pk=pk)
    assert (row.status, row.claim_token, row.last_error) == (OutboxStatus.PENDING, second.token, "")

    assert relay.outbox_mark_delivered(claim=second, ids=[pk]) == 1
    row.refresh_from_db()
    assert row.status == OutboxStatus.DELIVERED and row.claim_token is None and row.claimed_until is None


def test_the_attempt_header_counts_a_delivery_a_relay_never_finished(db: None) -> None:
    enqueue("a", 1)
    assert claim_broker() is not None  # a relay claims, publishes, and dies before recording
    expire_claims()
    recorder = Recorder()
    step = relay.outbox_relay_once(publish=recorder)
    assert step.delivered == 1 and recorder.published == [("a", 0, 2)]


def test_a_failure_schedules_the_next_attempt_and_frees_the_claim(db: None, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS = 60
    enqueue("a", 2)
    step = relay.outbox_relay_once(publish=Recorder(failing={"a"}))
    assert (step.claimed, step.failed, step.delivered) == (1, 1, 0)
    head = OutboxMessage.objects.earliest("id")
    assert head.claim_token is None and head.claimed_until is None and head.attempts == 1
    assert head.next_attempt_at is not None
    assert timezone.now() + timedelta(seconds=29) < head.next_attempt_at < timezone.now() + timedelta(seconds=61)
    assert head.failures[0]["attempt"] == 1 and head.last_error == "refused"
    assert relay.outbox_relay_once(publish=Recorder()).claimed == 0  # backing off, and its successor waits


def test_a_destination_that_times_out_gets_the_rest_of_the_claim_back_untried(db: None) -> None:
    for key in ("a", "b", "c"):
        enqueue(key, 1)
    step = relay.outbox_relay_once(publish=Recorder(failing={"a", "b", "c"}, timed_out=True))
    assert (step.claimed, step.failed, step.released, step.timed_out) == (3, 1, 2, True)
    attempts = list(OutboxMessage.objects.order_by("id").values_list("attempts", "claim_token", "last_error"))
    assert attempts == [(1, None, "refused"), (0, None, ""), (0, None, "")]


def test_a_lease_that_would_run_out_during_a_delivery_is_extended_first(db: None) -> None:
    (pk,) = enqueue("a", 1)
    claim = claim_broker(lease_seconds=1)  # shorter than the broker's deadline
    assert claim is not None
    seen: list[Any] = []

    def publish(message: OutboxMessage, body: dict[str, Any]) -> None:
        seen.append(OutboxMessage.objects.get(pk=message.pk).claimed_until)

    step = relay.outbox_deliver_claim(claim=claim, publish=publish, policy=broker_policy())
    assert step.delivered == 1
    assert seen[0] >= timezone.now() + timedelta(seconds=broker_policy().timeout_seconds)


def test_a_relay_that_outlived_its_lease_does_not_deliver_what_another_relay_took(db: None) -> None:
    enqueue("a", 1)
    enqueue("b", 1)
    stalled = claim_broker()
    assert stalled is not None
    OutboxMessage.objects.filter(key="a").update(claimed_until=timezone.now() - timedelta(seconds=1))
    taken = claim_broker()  # another relay takes "a", whose lease ran out; "b" is still leased
    assert taken is not None and [m.key for m in taken.messages] == ["a"]
    stalled.until = timezone.now()  # the stalled relay resumes: its lease needs extending first
    recorder = Recorder()
    step = relay.outbox_deliver_claim(claim=stalled, publish=recorder, policy=broker_policy())
    assert recorder.published == [("b", 0, 1)] and (step.delivered, step.lost) == (1, 1)
    assert OutboxMessage.objects.get(key="a").claim_token == taken.token


def test_nothing_is_held_open_while_a_message_is_published(transactional_db: None) -> None:
    """The claim is committed before the publish: another connection sees it, and this
    connection's backend is idle (not "idle in transaction") while the publisher runs."""
    (pk,) = enqueue("a", 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    observed: list[tuple[Any, ...]] = []

    def publish(message: OutboxMessage, body: dict[str, Any]) -> None:
        assert not connection.in_atomic_block
        with psycopg.connect(relay_database_url(), autocommit=True) as other:
            [(token,)] = other.execute("SELECT claim_token FROM backplane_outboxmessage WHERE id = %s", [pk]).fetchall()
            [(state, xact_start)] = other.execute(
                "SELECT state, xact_start FROM pg_stat_activity WHERE pid = %s", [backend]
            ).fetchall()
        observed.append((token, state, xact_start))

    assert relay.outbox_relay_once(publish=publish).delivered == 1
    ((token, state, xact_start),) = observed
    assert token is not None and state == "idle" and xact_start is None


# --- the retry schedule -------------------------------------------------------------------------


def test_the_default_schedule_rides_out_a_day_long_outage() -> None:
    schedule = default_retry_schedule()
    shortest, longest = schedule.window_seconds()
    assert (schedule.max_attempts, schedule.base_seconds, schedule.max_delay_seconds) == (35, 10, 7200)
    assert 24 * 3600 < shortest and longest < 3 * 24 * 3600  # more than a day, less than Stripe's 3 days
    # A 30-second outage costs the first message of a key a few early retries, never its life.
    assert sum(schedule.ceiling(n) for n in range(1, 4)) >= 30 and schedule.max_attempts > 4


def test_delays_double_with_jitter_up_to_the_cap() -> None:
    schedule = RetrySchedule(max_attempts=10, base_seconds=10, max_delay_seconds=100)
    assert [schedule.ceiling(n) for n in range(1, 7)] == [10, 20, 40, 80, 100, 100]
    delays = [schedule.delay_after(3) for _ in range(200)]
    assert all(20 <= d <= 40 for d in delays) and max(delays) - min(delays) > 5


def test_a_subscription_overrides_the_schedule_and_inherits_what_it_leaves_empty(db: None, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 7
    settings.BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS = 900
    hook = WebhookSubscription.objects.create(name="crm", topic_pattern="#", url="http://127.0.0.1:9/", secret="s",
                                              retry_base_seconds=3, timeout_seconds=4, max_concurrency=3)
    policy = webhook_policy(hook)
    assert policy.retry == RetrySchedule(max_attempts=7, base_seconds=3, max_delay_seconds=900)
    assert (policy.timeout_seconds, policy.concurrency, policy.ordering) == (4, 3, "strict")
    assert broker_policy().retry.max_attempts == 7 and broker_policy().ordering == "strict"


# --- ordering ------------------------------------------------------------------------------------


def test_strict_a_dead_letter_holds_its_key_until_it_is_requeued_then_the_key_arrives_in_order(
    db: None, settings: Any
) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    enqueue("a", 4)
    enqueue("b", 2)
    refusing = Recorder(failing={"a"})
    relay.outbox_relay_until_idle(publish=refusing, budget_seconds=10)
    assert refusing.of("b") == [0, 1] and refusing.of("a") == []
    dead_letter = DeadLetter.objects.get()
    head = OutboxMessage.objects.get(dead_letters=dead_letter)
    assert head.status == OutboxStatus.DEAD and head.holds_key
    assert delivery_selectors.dead_letter_waiting_behind(dead_letter.pk) == 3

    # The endpoint is back, but nothing of key "a" goes before the dead letter is decided.
    recorder = Recorder()
    assert relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10).claimed == 0
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:rita", reason="fixed")
    assert delivery_selectors.dead_letter_waiting_behind(dead_letter.pk) == 0
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10)
    assert recorder.of("a") == [0, 1, 2, 3]
    assert recorder.published[0] == ("a", 0, 1)  # from attempt 1 again


def test_strict_discarding_the_dead_letter_lets_its_key_go_on_without_it(db: None, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    enqueue("a", 3)
    relay.outbox_relay_until_idle(publish=Recorder(failing={"a"}), budget_seconds=10)
    dead_letter = DeadLetter.objects.get()
    dead_letters.dead_letter_discard(dead_letter_id=dead_letter.pk, decided_by="user:rita", reason="obsolete")
    recorder = Recorder()
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10)
    assert recorder.of("a") == [1, 2]
    assert OutboxMessage.objects.get(dead_letters=dead_letter).status == OutboxStatus.DEAD


def test_best_effort_a_dead_letter_leaves_the_sequence_and_the_key_goes_on_in_order(db: None, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    settings.BACKPLANE_OUTBOX_BROKER_ORDERING = "best_effort"
    enqueue("a", 4)
    first = Recorder(failing={"a"})
    relay.outbox_relay_once(publish=first)  # the head dies
    recorder = Recorder()
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10)
    assert recorder.of("a") == [1, 2, 3]
    dead_letter = DeadLetter.objects.get()
    assert not OutboxMessage.objects.get(dead_letters=dead_letter).holds_key
    assert delivery_selectors.dead_letter_waiting_behind(dead_letter.pk) == 0
    # Requeued, it comes late: after the messages that went on without it (documented).
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:rita", reason="retry")
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10)
    assert recorder.of("a") == [1, 2, 3, 0]


def test_a_requeued_message_goes_before_the_key_messages_still_waiting_behind_it(db: None, settings: Any) -> None:
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 1
    settings.BACKPLANE_OUTBOX_BROKER_ORDERING = "best_effort"
    enqueue("a", 1)
    relay.outbox_relay_once(publish=Recorder(failing={"a"}))
    enqueue("a", 2, first=1)  # written after the head died, not delivered yet
    dead_letter = DeadLetter.objects.get()
    dead_letters.dead_letter_requeue(dead_letter_id=dead_letter.pk, decided_by="user:rita", reason="retry")
    recorder = Recorder()
    relay.outbox_relay_until_idle(publish=recorder, budget_seconds=10)
    assert recorder.of("a") == [0, 1, 2]


# --- queues the product's consumers read ---------------------------------------------------------


def test_the_broker_sink_declares_the_configured_queues_before_it_publishes(db: None) -> None:
    queue_name = f"claims-test-{int(time.time() * 1000)}"
    exchange = Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)
    sink = KombuSink(queues=[(queue_name, "claims.#")])
    enqueue("a", 1)
    try:
        assert relay.outbox_relay_once(publish=lambda m, body: sink.publish(m, body)).delivered == 1
    finally:
        sink.close()
    # No consumer existed when it was published: the queue the sink declared kept it.
    conn = Connection(settings.BACKPLANE_OUTBOX_BROKER_URL, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS)
    try:
        with conn.SimpleQueue(Queue(queue_name, exchange, routing_key="claims.#", durable=True)) as simple:
            message = simple.get(timeout=2)
            assert message.payload["payload"] == {"n": 0} and message.payload["topic"] == "claims.t"
            message.ack()
            simple.queue.delete()
    finally:
        conn.release()


# --- lanes ----------------------------------------------------------------------------------------


def test_a_tick_starts_the_lanes_and_returns_while_they_deliver(transactional_db: None) -> None:
    for key in ("a", "b", "c"):
        enqueue(key, 5)
    gate = threading.Event()
    published: list[tuple[str, int]] = []

    def publish(message: OutboxMessage, body: dict[str, Any]) -> None:
        gate.wait(10)  # a slow destination
        published.append((message.key, body["payload"]["n"]))

    runner = LaneRunner(threads=4, batch_size=10, publisher_factory=lambda: publish)
    try:
        started = time.monotonic()
        assert runner.tick() == 2  # the broker's concurrency
        assert time.monotonic() - started < 1.0, "the tick waited for a delivery"
        runner.tick()
        assert runner.running()[BROKER_LANE] <= 2
        gate.set()
        wait_until(lambda: not OutboxMessage.objects.filter(status="pending").exists(), timeout=20,
                   what="the lanes deliver everything")
    finally:
        runner.stop()
    for key in ("a", "b", "c"):
        assert [n for k, n in published if k == key] == [0, 1, 2, 3, 4]
    wait_until(lambda: runner.running() == {}, timeout=5, what="the jobs end")
