"""/api/v1/tasks/{id}/events/ and /events/batch/ and /verify/."""

from __future__ import annotations

from typing import Any

import pytest

from backplane.eventlog.chain import api_event_hash
from backplane.eventlog.event_types import SERVER_ONLY_TYPES
from tests.api.conftest import assert_error, claim, create_task


def events_url(task: dict[str, Any]) -> str:
    return f"/api/v1/tasks/{task['task_id']}/events/"


def test_an_append_is_201_and_its_hash_checks_out_from_the_json(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    response = alice.post(events_url(task), {"type": "ReasoningStepCompleted", "payload": {"step": 1},
                                             "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "lamport": 10},
                          format="json")
    assert response.status_code == 201
    event = response.json()
    assert (event["seq"], event["lamport"], event["agent"]) == (2, 11, "alice")
    assert api_event_hash(event) == event["hash"]
    started = alice.get(events_url(task)).json()["results"][0]
    assert event["prev_hash"] == started["hash"] and api_event_hash(started) == started["hash"]


def test_an_idempotent_replay_is_200_with_the_header_and_writes_nothing(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    body = {"type": "EmailSent", "payload": {"to": "bob"}, "idempotency_key": "email-1"}
    first = alice.post(events_url(task), body, format="json")
    before = counts()
    again = alice.post(events_url(task), body, format="json")
    assert again.status_code == 200 and again["Idempotent-Replay"] == "true" and again.json() == first.json()
    assert counts() == before
    other = alice.post(events_url(task), {**body, "payload": {"to": "carol"}}, format="json")
    assert_error(other, 422, "idempotency_mismatch")
    assert counts() == before


def test_expected_seq_conflicts_are_409_with_the_last_seq(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    noted = {"type": "Noted", "payload": {}, "expected_seq": 1}
    assert alice.post(events_url(task), noted, format="json").status_code == 201
    before = counts()
    error = assert_error(alice.post(events_url(task), noted, format="json"), 409, "seq_conflict")
    assert error["details"]["last_seq"] == 2
    assert counts() == before


@pytest.mark.parametrize("event_type", sorted(SERVER_ONLY_TYPES))
def test_every_reserved_type_from_a_client_is_400(alice, counts, event_type) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    before = counts()
    error = assert_error(alice.post(events_url(task), {"type": event_type, "payload": {}}, format="json"),
                         400, "validation_error")
    assert "type" in error["details"]
    events = [{"type": "Noted", "payload": {}}, {"type": event_type, "payload": {}}]
    batch = alice.post(events_url(task) + "batch/", {"events": events}, format="json")
    assert_error(batch, 400, "validation_error")
    assert counts() == before


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"type": 7},
        {"type": "Noted", "payload": [1]},
        {"type": "Noted", "payload": "x"},
        {"type": "Noted", "payload": {}, "expected_seq": "1"},
        {"type": "Noted", "payload": {}, "expected_seq": -1},
        {"type": "Noted", "payload": {}, "lease_epoch": True},
        {"type": "Noted", "payload": {}, "idempotency_key": "k" * 256},
        {"type": "Noted", "payload": {}, "idempotency_key": 5},
        {"type": "Noted", "payload": {}, "seq": 5},
        {"type": "Noted", "payload": {}, "hash": "0" * 64},
        {"type": "Noted", "payload": {}, "agent": "someone-else"},
        {"type": "Noted", "payload": {}, "outbox": [{"payload": {}}]},
        {"type": "Noted", "payload": {}, "outbox": {"topic": "t", "payload": {}}},
        {"type": "ReasoningStepCompleted", "payload": {"step": "one"}},
        {"type": "TaskCompleted", "payload": {}},
        {"type": "TaskFailed", "payload": {"error": "x"}},
        {"type": "not-pascal", "payload": {}},
        {"type": "Noted"},
        {"type": "Noted", "payload": None},
    ],
)
def test_wrong_types_and_server_fields_are_400_and_write_nothing(alice, counts, body) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    before = counts()
    assert_error(alice.post(events_url(task), body, format="json"), 400, "validation_error")
    assert counts() == before


def test_malformed_json_and_oversize_bodies_change_nothing(alice, counts, settings) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    before = counts()
    assert_error(alice.post(events_url(task), data=b'{"type": ', content_type="application/json"),
                 400, "validation_error")
    big = {"type": "Noted", "payload": {"blob": "x" * settings.BACKPLANE_PAYLOAD_LIMIT_BYTES}}
    assert_error(alice.post(events_url(task), big, format="json"), 413, "payload_too_large")
    assert_error(alice.post(events_url(task) + "batch/", {"events": [big]}, format="json"), 413, "payload_too_large")
    assert counts() == before


def test_a_batch_is_201_all_or_nothing_and_replays_as_a_whole(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    body = {"expected_seq": 1, "events": [
        {"type": "ReasoningStepCompleted", "payload": {"step": 1}, "idempotency_key": "s1"},
        {"type": "ReasoningStepCompleted", "payload": {"step": 2}, "idempotency_key": "s2"},
    ]}
    response = alice.post(events_url(task) + "batch/", body, format="json")
    assert response.status_code == 201 and [e["seq"] for e in response.json()["results"]] == [2, 3]
    before = counts()
    again = alice.post(events_url(task) + "batch/", body, format="json")
    assert again.status_code == 200 and again["Idempotent-Replay"] == "true"
    assert again.json() == response.json()
    failing = {"events": [{"type": "Noted", "payload": {}}, {"type": "TaskCompleted", "payload": {"output": {}}},
                          {"type": "Noted", "payload": {}}]}
    assert_error(alice.post(events_url(task) + "batch/", failing, format="json"), 409, "task_closed")
    no_payload = {"events": [{"type": "Noted"}, {"type": "Noted", "payload": {}}, {"type": "Noted"}]}
    error = assert_error(alice.post(events_url(task) + "batch/", no_payload, format="json"), 400, "validation_error")
    assert set(error["details"]) == {"events[0].payload", "events[2].payload"}, error
    assert_error(alice.post(events_url(task) + "batch/", {"events": []}, format="json"), 400, "validation_error")
    assert counts() == before


def test_events_page_by_after_seq(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    alice.post(events_url(task) + "batch/", {"events": [{"type": "Noted", "payload": {"n": n}} for n in range(9)]},
               format="json")
    first = alice.get(events_url(task), {"limit": 4}).json()
    assert [e["seq"] for e in first["results"]] == [1, 2, 3, 4] and first["next_after_seq"] == 4
    rest = alice.get(events_url(task), {"after_seq": 8, "limit": 4}).json()
    assert [e["seq"] for e in rest["results"]] == [9, 10] and rest["next_after_seq"] is None
    assert_error(alice.get(events_url(task), {"limit": 1001}), 400, "validation_error")
    assert_error(alice.get(events_url(task), {"after_seq": "x"}), 400, "validation_error")


def test_completion_closes_the_task(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    lease = claim(alice)
    done = alice.post(events_url(task), {"type": "TaskCompleted", "payload": {"output": {"score": 1}},
                                         "lease_epoch": lease["lease_epoch"]}, format="json")
    assert done.status_code == 201
    state = alice.get(f"/api/v1/tasks/{task['task_id']}/").json()
    assert (state["status"], state["output"], state["lease"]) == ("completed", {"score": 1}, None)
    before = counts()
    late = {"type": "Noted", "payload": {}, "lease_epoch": lease["lease_epoch"]}
    assert_error(alice.post(events_url(task), late, format="json"), 409, "task_closed")
    assert counts() == before


def test_verify_reports_the_chain(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    alice.post(events_url(task), {"type": "Noted", "payload": {}}, format="json")
    body = alice.get(f"/api/v1/tasks/{task['task_id']}/verify/").json()
    head = alice.get(f"/api/v1/tasks/{task['task_id']}/").json()["head_hash"]
    assert body == {"valid": True, "checked": 2, "head_hash": head, "first_invalid_seq": None}


def test_outbox_messages_commit_with_the_event(alice) -> None:  # type: ignore[no-untyped-def]
    from backplane.delivery.models import OutboxMessage

    task = create_task(alice)
    response = alice.post(events_url(task), {"type": "LeadScored", "payload": {"score": 3},
                                             "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                                             "outbox": [{"topic": "leads.scored", "payload": {"score": 3}}]},
                          format="json")
    event = response.json()
    (message,) = OutboxMessage.objects.filter(topic="leads.scored")
    assert (message.topic, message.key, message.payload, message.status) == (
        "leads.scored", task["task_id"], {"score": 3}, "pending")
    assert message.headers["event_hash"] == event["hash"] and message.headers["seq"] == event["seq"]
    assert message.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")
