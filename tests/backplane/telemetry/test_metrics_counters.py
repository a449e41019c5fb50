"""What /metrics counts (backplane/telemetry/counters.py): only what committed, with bounded labels.

Every write is real and commits (``committed_db``), so the counting that waits for the commit
(``transaction.on_commit``) happens as it does in production. Each test compares two scrapes:
the metrics directory is the whole test run's, and other tests count into it too.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from backplane.delivery import relay
from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus
from backplane.eventlog import event_types as et
from backplane.eventlog import services
from backplane.eventlog.models import Agent, Task
from backplane.eventlog.writer import EventDraft, lock_task, write_events
from backplane.telemetry import counters
from recovery import detector, leases, tool_calls
from recovery.dead_letters import dead_letter_discard
from recovery.metrics import BUILT_IN_EVENT_TYPES
from tests.backplane.telemetry.metrics_scrape import scrape

APPENDED = "backplane_events_appended_total"


def new_task(**fields: Any) -> Task:
    return services.task_create(namespace="acme", kind="lead-qualification", input={"n": uuid.uuid4().hex},
                                agent="planner", **fields).task


def step(task: Task, n: int, *, event_type: str = et.REASONING_STEP_COMPLETED) -> None:
    services.event_append(namespace="acme", task_id=task.pk, agent="alice",
                          draft=EventDraft(type=event_type, payload={"step": n}))


@pytest.fixture
def alice(committed_db: None) -> Agent:
    return services.agent_create(name="alice", namespace="acme").agent


def test_it_counts_an_append_once_it_commits_and_never_a_write_that_rolled_back(
        committed_db: None, client: Client) -> None:
    task = new_task()
    before = scrape(client)

    class RolledBack(Exception):
        pass

    with pytest.raises(RolledBack), transaction.atomic():
        # The writer's own path, as every service takes it: the follow-ups run in here.
        write_events(lock_task(namespace="acme", task_id=task.pk),
                     [EventDraft(type=et.REASONING_STEP_COMPLETED, payload={"step": 1})], agent="alice",
                     now=timezone.now())
        assert scrape(client).value(APPENDED, type=et.REASONING_STEP_COMPLETED) == \
            before.value(APPENDED, type=et.REASONING_STEP_COMPLETED), "counted before the commit"
        raise RolledBack
    rolled_back = scrape(client)
    assert rolled_back.value(APPENDED, type=et.REASONING_STEP_COMPLETED) == \
        before.value(APPENDED, type=et.REASONING_STEP_COMPLETED)

    step(task, 1)  # the quiet append: one statement, no transaction, follow-ups after it
    step(task, 2)
    after = scrape(client)
    assert after.moved_since(before, APPENDED, type=et.REASONING_STEP_COMPLETED) == 2
    assert after.moved_since(before, "backplane_append_duration_seconds_count") == 2


def test_a_type_the_client_made_up_is_counted_as_custom(committed_db: None, client: Client) -> None:
    task = new_task()
    before = scrape(client)
    for n in range(3):
        step(task, n, event_type="LeadScored")
    after = scrape(client)

    assert after.moved_since(before, APPENDED, type="custom") == 3
    assert after.label_values(APPENDED, "type") <= BUILT_IN_EVENT_TYPES | {"custom"}
    assert "LeadScored" not in after.label_values(APPENDED, "type")


def test_every_event_type_the_backplane_defines_is_its_own_label() -> None:
    assert {et.TASK_STARTED, et.TASK_CLAIMED, et.TASK_COMPLETED, et.TASK_FAILED, et.REASONING_STEP_COMPLETED,
            et.TOOL_CALL_RESULT_RECEIVED, et.PROJECTION_RECONCILED} <= BUILT_IN_EVENT_TYPES
    assert "custom" not in BUILT_IN_EVENT_TYPES


def test_idempotent_replays_are_counted_by_kind(committed_db: None, client: Client) -> None:
    task = new_task()
    draft = EventDraft(type="LeadScored", payload={"score": 7}, idempotency_key="score-1")
    before = scrape(client)
    for _ in range(3):
        services.event_append(namespace="acme", task_id=task.pk, agent="alice", draft=draft)
    after = scrape(client)
    assert after.moved_since(before, "backplane_idempotent_replays_total", kind="event") == 2
    assert after.moved_since(before, APPENDED, type="custom") == 1


def test_claims_stalls_and_what_recovery_made_of_them(alice: Agent, client: Client) -> None:
    new_task(max_attempts=2)
    before = scrape(client)

    def claim() -> None:
        assert leases.lease_claim(agent=alice, kinds=None, lease_seconds=30) is not None

    def stall() -> None:
        assert detector.lease_expire_stalled(now=timezone.now() + timedelta(seconds=31)).expired == 1

    claim()
    stall()  # attempt 1 of 2: back to pending
    claim()  # picks up work an earlier holder left: recovered
    stall()  # attempt 2 of 2: a dead letter
    after = scrape(client)

    assert after.moved_since(before, "backplane_claims_total", recovered="false") == 1
    assert after.moved_since(before, "backplane_claims_total", recovered="true") == 1
    assert after.moved_since(before, "backplane_stalls_total", reason="lease_expired") == 2
    assert after.moved_since(before, "backplane_recoveries_total", outcome="requeued") == 1
    assert after.moved_since(before, "backplane_recoveries_total", outcome="dead_lettered") == 1
    assert after.moved_since(before, "backplane_dead_letters_created_total", source="task") == 1

    dead_letter = DeadLetter.objects.get(source="task")
    dead_letter_discard(dead_letter_id=dead_letter.pk, decided_by="olivia", reason="the lead went cold")
    decided = scrape(client)
    assert decided.moved_since(after, "backplane_dead_letters_decided_total", decision="discarded") == 1
    # Retention takes finished tasks away with their dead letters: what was counted stays counted.
    DeadLetter.objects.all().delete()
    assert scrape(client).value("backplane_dead_letters_created_total", source="task") == \
        decided.value("backplane_dead_letters_created_total", source="task")


def test_every_dead_letter_source_and_decision_has_its_series() -> None:
    assert set(counters.DEAD_LETTER_SOURCES) == set(DeadLetterSource.values)
    assert set(counters.DEAD_LETTER_DECISIONS) == set(DeadLetterStatus.values) - {DeadLetterStatus.PENDING}


def test_tool_calls_are_counted_per_tool_with_their_latency(committed_db: None, client: Client) -> None:
    task = new_task()
    before = scrape(client)

    def dispatch() -> tool_calls.ToolCallOutcome:
        return tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=1, tool="send-email",
                                             input={"to": "bob@example.com"}, agent="alice", lease_epoch=None)

    key = dispatch().call.pk
    assert dispatch().replayed
    tool_calls.tool_call_record_result(namespace="acme", key=key, status="succeeded", result={"id": "m-1"},
                                       agent="alice", lease_epoch=None)
    # A tool name no administrator chose is not a label of its own.
    tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=2, tool="send email to bob?",
                                  input={}, agent="alice", lease_epoch=None)
    after = scrape(client)

    assert after.moved_since(before, "backplane_tool_calls_dispatched_total", tool="send-email") == 1
    assert after.moved_since(before, "backplane_tool_calls_dispatched_total", tool="other") == 1
    assert after.moved_since(before, "backplane_idempotent_replays_total", kind="tool_call") == 1
    assert after.moved_since(before, "backplane_tool_calls_total", tool="send-email", status="succeeded") == 1
    assert after.moved_since(before, "backplane_tool_call_duration_seconds_count", tool="send-email") == 1
    assert "send email to bob?" not in after.label_values("backplane_tool_calls_dispatched_total", "tool")


def test_the_tool_label_stays_bounded() -> None:
    assert counters.tool_label("crm-update") == "crm-update"
    assert counters.tool_label("x" * 65) == "other"
    assert counters.tool_label("../etc/passwd") == "other"


def test_deliveries_and_failures_are_counted_per_kind_of_destination(committed_db: None, client: Client) -> None:
    new_task()  # its lifecycle message goes to the broker
    before = scrape(client)
    delivered = relay.outbox_relay_once(publish=lambda message, envelope: None).delivered
    assert delivered >= 1
    new_task()

    def broken(message: object, envelope: dict[str, Any]) -> None:
        raise relay.PublishError("the broker is away")

    assert relay.outbox_relay_once(publish=broken).failed >= 1
    after = scrape(client)
    assert after.moved_since(before, "backplane_deliveries_total", destination="broker") == delivered
    assert after.moved_since(before, "backplane_delivery_failures_total", destination="broker", outcome="failed") >= 1


def test_a_breaker_that_opens_is_a_transition_and_an_open_breaker(alice: Agent, client: Client) -> None:
    before = scrape(client)
    for _ in range(3):
        new_task()
        claim = leases.lease_claim(agent=alice, kinds=None, lease_seconds=30)
        assert claim is not None
        services.event_append(namespace="acme", task_id=claim.task.pk, agent="alice", lease_epoch=claim.lease_epoch,
                              draft=EventDraft(type=et.TASK_FAILED, payload={"error": "boom", "retryable": False}))
    after = scrape(client)
    assert after.moved_since(before, "backplane_breaker_transitions_total", kind="agent", to_state="open") == 1
    assert after.value("backplane_breakers_open", kind="agent") == 1


def test_http_requests_are_counted_by_view_and_status(committed_db: None, client: Client) -> None:
    name = "django_http_responses_total_by_status_view_method_total"
    before = scrape(client)
    client.get("/readyz/traffic")
    client.get("/no-such-page")
    after = scrape(client)
    assert after.moved_since(before, name, status="200", view="readyz-traffic", method="GET") == 1
    assert after.total(name, status="404", method="GET") - before.total(name, status="404", method="GET") == 1
