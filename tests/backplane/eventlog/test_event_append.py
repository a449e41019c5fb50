"""The append path: numbering, hashing, idempotency, optimistic concurrency and fencing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.chain import GENESIS_HASH, api_event_hash, event_as_api_dict
from backplane.eventlog.errors import IdempotencyMismatch, InvalidInput, NotFound, SeqConflict, StaleLease, TaskClosed
from backplane.eventlog.event_types import SERVER_ONLY_TYPES
from backplane.eventlog.models import Event, Task, TaskStatus
from backplane.eventlog.writer import EVENT_FIELDS, EventDraft, OutboxDraft


def append(task: Task, draft: EventDraft, **kwargs: Any) -> services.AppendOutcome:
    kwargs.setdefault("agent", "qualifier-1")
    return services.event_append(namespace=task.namespace, task_id=task.pk, draft=draft, **kwargs)


def step(n: int, **kwargs: Any) -> EventDraft:
    return EventDraft(type="ReasoningStepCompleted", payload={"step": n, "thought": f"step {n}"}, **kwargs)


def lease(task: Task, epoch: int = 1, holder: str = "qualifier-1") -> None:
    Task.objects.filter(pk=task.pk).update(lease_holder=holder, lease_epoch=epoch, status=TaskStatus.RUNNING)
    task.refresh_from_db()


def test_it_starts_every_task_with_task_started_as_seq_1(make_task: Callable[..., Task]) -> None:
    task = make_task()
    (first,) = Event.objects.filter(task=task)
    assert (first.seq, first.type, first.prev_hash) == (1, "TaskStarted", GENESIS_HASH)
    assert first.payload["input"] == {"lead": "alice@example.com"}
    assert (task.last_seq, task.head_hash) == (1, first.hash)


def test_it_hashes_the_api_representation_as_api_md_defines(make_task: Callable[..., Task]) -> None:
    task = make_task()
    event = append(task, step(1, trace_id="4bf92f3577b34da6a3ce929d0e0e4736")).events[0]
    event.refresh_from_db()
    api = json.loads(json.dumps(event_as_api_dict(event)))
    # An outside verifier: drop hash and position, canonicalise, SHA-256.
    assert api_event_hash(api) == api["hash"] == event.hash
    assert api["recorded_at"].endswith("Z") and len(api["recorded_at"]) == len("2026-11-29T17:00:00.123456Z")
    assert set(api) == {
        "task_id", "seq", "position", "type", "payload", "agent", "idempotency_key", "lamport",
        "causation_id", "correlation_id", "trace_id", "recorded_at", "prev_hash", "hash",
    }


def test_it_links_each_event_to_the_one_before(make_task: Callable[..., Task]) -> None:
    task = make_task()
    for n in range(1, 4):
        append(task, step(n))
    events = list(Event.objects.filter(task=task).order_by("seq"))
    assert [e.seq for e in events] == [1, 2, 3, 4]
    for before, after in zip(events, events[1:], strict=False):
        assert after.prev_hash == before.hash
    task.refresh_from_db()
    assert task.last_seq == 4 and task.head_hash == events[-1].hash


def test_it_keeps_a_lamport_clock(make_task: Callable[..., Task]) -> None:
    task = make_task()
    assert append(task, step(1)).events[0].lamport == 2
    assert append(task, step(2, lamport=41)).events[0].lamport == 42
    assert append(task, step(3, lamport=5)).events[0].lamport == 43


def test_it_hashes_payload_numbers_the_same_after_a_jsonb_round_trip(make_task: Callable[..., Task]) -> None:
    from backplane.integrity.verification import chain_check

    task = make_task()
    append(task, EventDraft(type="Measured", payload={"big": 1e21, "small": 5e-324, "neg": -0.0, "x": 0.1}))
    task.refresh_from_db()
    assert chain_check(task=task).valid


def test_it_replays_a_known_idempotency_key_without_writing(make_task: Callable[..., Task]) -> None:
    task = make_task()
    original = append(task, step(1, idempotency_key="k-1")).events[0]
    again = append(task, step(1, idempotency_key="k-1"))
    assert again.replayed and again.events[0].pk == original.pk
    assert Event.objects.filter(task=task).count() == 2


def test_it_refuses_a_known_key_with_another_body(make_task: Callable[..., Task]) -> None:
    task = make_task()
    append(task, step(1, idempotency_key="k-1"))
    with pytest.raises(IdempotencyMismatch):
        append(task, step(2, idempotency_key="k-1"))
    assert Event.objects.filter(task=task).count() == 2


def test_it_replays_for_a_recovered_holder_under_a_newer_epoch(make_task: Callable[..., Task]) -> None:
    task = make_task()
    lease(task, epoch=1)
    original = append(task, step(1, idempotency_key="k-1"), lease_epoch=1).events[0]
    lease(task, epoch=2, holder="qualifier-2")
    again = append(task, step(1, idempotency_key="k-1"), lease_epoch=2, agent="qualifier-2")
    assert again.replayed and again.events[0].pk == original.pk


def test_it_rejects_a_wrong_expected_seq_and_says_the_current_one(make_task: Callable[..., Task]) -> None:
    task = make_task()
    append(task, step(1), expected_seq=1)
    with pytest.raises(SeqConflict) as caught:
        append(task, step(2), expected_seq=1)
    assert caught.value.details["last_seq"] == 2
    assert Event.objects.filter(task=task).count() == 2


def test_it_rejects_a_stale_lease(make_task: Callable[..., Task]) -> None:
    task = make_task()
    lease(task, epoch=3)
    with pytest.raises(StaleLease):
        append(task, step(1), lease_epoch=2)
    with pytest.raises(StaleLease):
        append(task, step(1))  # leased: the epoch is required
    assert append(task, step(1), lease_epoch=3).events[0].seq == 2


def test_it_rejects_an_epoch_after_the_lease_is_gone(make_task: Callable[..., Task]) -> None:
    task = make_task()
    lease(task, epoch=3)
    Task.objects.filter(pk=task.pk).update(lease_holder=None, lease_epoch=4, status=TaskStatus.PENDING)
    with pytest.raises(StaleLease):
        append(task, step(1), lease_epoch=3)
    assert append(task, step(1)).events[0].seq == 2  # unleased: anyone in the namespace


@pytest.mark.parametrize("event_type", sorted(SERVER_ONLY_TYPES))
def test_it_rejects_every_reserved_type_from_a_client(make_task: Callable[..., Task], event_type: str) -> None:
    task = make_task()
    with pytest.raises(InvalidInput) as caught:
        append(task, EventDraft(type=event_type, payload={}))
    assert "type" in caught.value.details
    assert Event.objects.filter(task=task).count() == 1


@pytest.mark.parametrize(
    ("event_type", "payload"),
    [
        ("lowercase", {}),
        ("Ab", {}),
        ("Has-Dash", {}),
        ("ReasoningStepCompleted", {}),
        ("ReasoningStepCompleted", {"step": "1"}),
        ("ReasoningStepCompleted", {"step": True}),
        ("TaskCompleted", {"output": [1]}),
        ("TaskFailed", {"error": "boom"}),
        ("TaskFailed", {"error": 1, "retryable": False}),
        ("Custom", {"text": "nul \x00 byte"}),
        ("Custom", {"text": "lone \ud800 surrogate"}),
        ("Custom", {"n": float("nan")}),
    ],
)
def test_it_rejects_malformed_events(make_task: Callable[..., Task], event_type: str, payload: dict) -> None:
    task = make_task()
    with pytest.raises(InvalidInput):
        append(task, EventDraft(type=event_type, payload=payload))
    assert Event.objects.filter(task=task).count() == 1


def test_it_completes_a_task_and_then_refuses_appends(make_task: Callable[..., Task]) -> None:
    task = make_task()
    lease(task, epoch=1)
    append(task, EventDraft(type="TaskCompleted", payload={"output": {"score": 0.9}}), lease_epoch=1)
    task.refresh_from_db()
    assert (task.status, task.output, task.lease_holder) == ("completed", {"score": 0.9}, None)
    with pytest.raises(TaskClosed):
        append(task, step(9), lease_epoch=1)


def test_a_retryable_failure_with_attempts_left_goes_back_to_pending(make_task: Callable[..., Task]) -> None:
    task = make_task(max_attempts=2)
    failure = EventDraft(type="TaskFailed", payload={"error": "timeout", "retryable": True})
    append(task, failure)
    task.refresh_from_db()
    assert (task.status, task.attempts, task.error) == ("pending", 1, "timeout")
    append(task, failure)
    task.refresh_from_db()
    assert (task.status, task.attempts) == ("failed", 2)


def test_a_batch_is_all_or_nothing(make_task: Callable[..., Task]) -> None:
    task = make_task()
    drafts = [step(1), EventDraft(type="TaskCompleted", payload={"output": {}}), step(2)]
    with pytest.raises(TaskClosed) as refused:
        services.event_append_batch(namespace="acme", task_id=task.pk, drafts=drafts, agent="a")
    # The status the batch's own events had reached when the next one met the closed task.
    assert refused.value.details["status"] == "completed"
    task.refresh_from_db()
    assert (task.last_seq, task.status, Event.objects.filter(task=task).count()) == (1, "pending", 1)

    outcome = services.event_append_batch(
        namespace="acme", task_id=task.pk, drafts=[step(1), step(2), step(3)], agent="a", expected_seq=1
    )
    assert [e.seq for e in outcome.events] == [2, 3, 4]


def test_the_writer_builds_events_in_the_models_field_order(
        make_task: Callable[..., Task], django_assert_num_queries: Any) -> None:
    """``_number_event`` passes an event's fields by position (``writer.EVENT_FIELDS``): a field
    added to, or moved in, the model must move there too."""
    assert EVENT_FIELDS == tuple(field.attname for field in Event._meta.concrete_fields)
    task = make_task()
    outcome = services.event_append_batch(namespace="acme", task_id=task.pk, drafts=[step(1), step(2)], agent="a")
    stored = {e.seq: e for e in Event.objects.filter(task=task, seq__in=[2, 3])}
    for event in outcome.events:
        assert {name: getattr(event, name) for name in EVENT_FIELDS} == {
            name: getattr(stored[event.seq], name) for name in EVENT_FIELDS}
    with django_assert_num_queries(0):  # each event knows its task without reading it
        assert {event.task.pk for event in outcome.events} == {task.pk}


def test_a_batch_replays_only_as_a_whole(make_task: Callable[..., Task]) -> None:
    task = make_task()
    batch = [step(1, idempotency_key="a"), step(2, idempotency_key="b")]
    first = services.event_append_batch(namespace="acme", task_id=task.pk, drafts=batch, agent="x")
    again = services.event_append_batch(namespace="acme", task_id=task.pk, drafts=batch, agent="x")
    assert again.replayed and [e.pk for e in again.events] == [e.pk for e in first.events]
    with pytest.raises(IdempotencyMismatch):
        services.event_append_batch(
            namespace="acme", task_id=task.pk, drafts=[step(1, idempotency_key="a"), step(3)], agent="x"
        )
    with pytest.raises(InvalidInput):
        services.event_append_batch(
            namespace="acme", task_id=task.pk, drafts=[step(5, idempotency_key="c"), step(6, idempotency_key="c")],
            agent="x",
        )
    assert Event.objects.filter(task=task).count() == 3


def test_another_namespace_cannot_see_the_task(make_task: Callable[..., Task]) -> None:
    task = make_task(namespace="acme")
    with pytest.raises(NotFound):
        services.event_append(namespace="globex", task_id=task.pk, draft=step(1), agent="x")
    with pytest.raises(NotFound):
        services.event_append(namespace="acme", task_id=uuid.uuid4(), draft=step(1), agent="x")


def test_integers_beyond_64_bits_are_stored_exactly_on_every_write_path(make_task: Callable[..., Task]) -> None:
    """orjson writes the rows' JSON but refuses integers past 64 bits: those rows are written by
    the standard library's encoder instead (backplane/lib/sql_rows.py, recordset_json)."""
    task = make_task()
    big = 2**70 + 1
    quiet = append(task, EventDraft(type="ReasoningStepCompleted", payload={"step": 1, "n": big, "m": -big}))
    batch = services.event_append_batch(namespace=task.namespace, task_id=task.pk, agent="qualifier-1", drafts=[
        EventDraft(type="LeadScored", payload={"n": big}, outbox=(OutboxDraft(topic="t", payload={"n": big}),)),
    ])
    stored = {e.seq: e for e in Event.objects.filter(task=task)}
    assert stored[quiet.events[0].seq].payload == {"step": 1, "n": big, "m": -big}
    assert stored[batch.events[0].seq].payload == {"n": big}
    assert OutboxMessage.objects.get(topic="t").payload == {"n": big}
    for event in stored.values():  # the hash the writer computed is the one the stored row gives
        assert api_event_hash(event_as_api_dict(event)) == event.hash
