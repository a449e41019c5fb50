"""The tool-call idempotency proxy: write before you act, answer once, replay from the record."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from django.utils import timezone

from backplane.eventlog.models import Event
from recovery import tool_calls
from recovery.models import ToolCall
from tests.api.conftest import assert_error, claim, create_task


def dispatch(client, task, **body):  # type: ignore[no-untyped-def]
    body = {"step": 3, "tool": "send-email", "input": {"to": "bob"}, **body}
    return client.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/", body, format="json")


def test_the_key_is_sha256_of_task_step_and_tool(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    response = dispatch(alice, task)
    assert response.status_code == 201
    body = response.json()
    expected = hashlib.sha256(f"{task['task_id']}:3:send-email".encode()).hexdigest()
    assert body["idempotency_key"] == expected and body["status"] == "dispatched" and body["replayed"] is False
    event = Event.objects.get(task_id=task["task_id"], type="ToolCallDispatched")
    assert event.payload["idempotency_key"] == expected and event.payload["input"] == {"to": "bob"}


def test_the_lifecycle_dispatch_replay_answer_replay(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    key = dispatch(alice, task).json()["idempotency_key"]
    before = counts()
    in_flight = dispatch(alice, task)
    assert in_flight.status_code == 200 and in_flight["Idempotent-Replay"] == "true"
    assert in_flight.json()["status"] == "in_flight" and in_flight.json()["replayed"] is True
    assert counts() == before

    answer = alice.post(f"/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": {"id": "m-1"}},
                        format="json")
    assert answer.status_code == 201 and answer.json()["status"] == "succeeded"
    assert Event.objects.filter(task_id=task["task_id"], type="ToolCallResultReceived").count() == 1

    before = counts()
    same = alice.post(f"/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": {"id": "m-1"}},
                      format="json")
    assert same.status_code == 200 and same.json()["replayed"] is True
    assert_error(alice.post(f"/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": {"id": "m-2"}},
                            format="json"), 422, "idempotency_mismatch")
    replay = dispatch(alice, task)
    assert replay.status_code == 200
    assert replay.json() == {"idempotency_key": key, "effect_key": key, "status": "succeeded", "result": {"id": "m-1"},
                             "replayed": True}
    assert counts() == before

    record = alice.get(f"/api/v1/tool-calls/{key}/").json()
    assert (record["status"], record["result"], record["step"], record["tool"]) == (
        "succeeded", {"id": "m-1"}, 3, "send-email")


def test_the_same_step_and_tool_with_other_input_is_422(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    dispatch(alice, task)
    before = counts()
    assert_error(dispatch(alice, task, input={"to": "carol"}), 422, "idempotency_mismatch")
    assert counts() == before


def test_bad_dispatches_and_results_are_400(alice, counts) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    key = dispatch(alice, task).json()["idempotency_key"]
    before = counts()
    bodies: list[dict[str, Any]] = [{"step": -1}, {"step": "1"}, {"tool": ""}, {"input": []},
                                    {"compensation": {"tool": "x"}}]
    for body in bodies:
        assert_error(dispatch(alice, task, **body), 400, "validation_error")
    results: list[dict[str, Any]] = [{"status": "maybe", "result": {}}, {"status": "succeeded"},
                                     {"status": "failed", "result": "x"}]
    for body in results:
        assert_error(alice.post(f"/api/v1/tool-calls/{key}/result/", body, format="json"), 400, "validation_error")
    assert counts() == before


def test_another_namespace_cannot_see_or_answer_a_call(alice, mallory) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    key = dispatch(alice, task).json()["idempotency_key"]
    assert_error(mallory.get(f"/api/v1/tool-calls/{key}/"), 404, "not_found")
    assert_error(mallory.post(f"/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": {}},
                              format="json"), 404, "not_found")
    assert_error(alice.get("/api/v1/tool-calls/" + "0" * 64 + "/"), 404, "not_found")


def test_a_recovered_holder_replays_with_its_new_epoch(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    first = claim(alice)
    dispatch(alice, task, lease_epoch=first["lease_epoch"])
    alice.post(f"/api/v1/tasks/{task['task_id']}/release/", {"lease_epoch": first["lease_epoch"]}, format="json")
    second = claim(alice)
    replay = dispatch(alice, task, lease_epoch=second["lease_epoch"])
    assert replay.status_code == 200 and replay.json()["status"] == "in_flight"


def test_records_expire_after_the_ttl(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    key = dispatch(alice, task).json()["idempotency_key"]
    record = ToolCall.objects.get(pk=key)
    assert record.expires_at - record.dispatched_at == timedelta(hours=24)
    assert tool_calls.tool_call_purge_expired(now=timezone.now()) == 0
    assert tool_calls.tool_call_purge_expired(now=record.expires_at + timedelta(seconds=1)) == 1
    assert not ToolCall.objects.filter(pk=key).exists()
    # The log keeps the dispatch even after the record is gone.
    assert Event.objects.filter(task_id=task["task_id"], type="ToolCallDispatched").count() == 1
