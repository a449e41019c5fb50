"""Forks over REST: provenance, history answered from the record, sandboxes, drift."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import forks
from backplane.eventlog.models import Event, Task
from recovery.models import ToolCall
from tests.api.conftest import AgentClient, assert_error, claim, create_task
from tests.backplane.integrity.audit_support import rewrite_history

Counts = Callable[[], dict[str, int]]


def append(client: APIClient, task_id: str, type: str, payload: dict[str, Any], **body: Any) -> dict[str, Any]:
    response = client.post(f"/api/v1/tasks/{task_id}/events/", {"type": type, "payload": payload, **body},
                           format="json")
    assert response.status_code == 201, response.content
    return response.json()


def dispatch(client: APIClient, task_id: str, step: int, tool: str, input: dict[str, Any], **body: Any) -> Any:
    return client.post(f"/api/v1/tasks/{task_id}/tool-calls/", {"step": step, "tool": tool, "input": input, **body},
                       format="json")


def answer(client: APIClient, key: str, result: dict[str, Any], **body: Any) -> Any:
    return client.post(f"/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": result, **body},
                       format="json")


def fork(client: APIClient, source: str, **body: Any) -> Any:
    body.setdefault("reason", "try again from here")
    return client.post(f"/api/v1/tasks/{source}/fork/", body, format="json")


@pytest.fixture
def worked(alice: AgentClient) -> dict[str, Any]:
    """A task that reasoned (seq 2), looked the CRM up (3, 4), sent a mail that never answered
    (5), and failed for good (6)."""
    task = create_task(alice, max_attempts=1)
    tid = task["task_id"]
    append(alice, tid, "ReasoningStepCompleted", {"step": 1, "thought": "look it up"})
    crm = dispatch(alice, tid, 2, "crm-lookup", {"lead": 7}).json()["idempotency_key"]
    assert answer(alice, crm, {"employees": 40}).status_code == 201
    mail = dispatch(alice, tid, 3, "email-send", {"to": "bob"}).json()["idempotency_key"]
    append(alice, tid, "TaskFailed", {"error": "mail relay silent", "retryable": False})
    return {"task_id": tid, "crm": crm, "mail": mail}


def test_a_fork_opens_with_its_provenance_and_leaves_the_source_alone(
    alice: AgentClient, worked: dict[str, Any], counts: Counts
) -> None:
    source = Task.objects.get(pk=worked["task_id"])
    source_events = list(Event.objects.filter(task=source).values_list("seq", "hash"))
    response = fork(alice, worked["task_id"], at_seq=4)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending" and body["forked_from"] == {"task_id": worked["task_id"], "at_seq": 4}
    assert body["sandbox"] is False and body["input"] == source.input and body["last_seq"] == 2
    started, forked = Event.objects.filter(task_id=body["task_id"]).order_by("seq")
    assert started.type == "TaskStarted" and forked.type == "TaskForked"
    at4 = Event.objects.get(task=source, seq=4)
    assert forked.payload["source_task_id"] == worked["task_id"] and forked.payload["at_seq"] == 4
    assert forked.payload["source_hash"] == at4.hash and forked.payload["source_type"] == "ToolCallResultReceived"
    assert forked.payload["forked_by"] == "alice" and forked.payload["reason"] == "try again from here"
    assert list(Event.objects.filter(task=source).values_list("seq", "hash")) == source_events
    verify = alice.get(f"/api/v1/tasks/{body['task_id']}/verify/").json()
    assert verify["valid"] is True and verify["checked"] == 2


def test_a_fork_is_idempotent_on_its_task_id(alice: AgentClient, worked: dict[str, Any], counts: Counts) -> None:
    task_id = str(uuid.uuid4())
    first = fork(alice, worked["task_id"], at_seq=3, task_id=task_id)
    assert first.status_code == 201
    before = counts()
    again = fork(alice, worked["task_id"], at_seq=3, task_id=task_id)
    assert again.status_code == 200 and again["Idempotent-Replay"] == "true" and again.json() == first.json()
    assert_error(fork(alice, worked["task_id"], at_seq=2, task_id=task_id), 409, "task_exists")
    assert counts() == before


@pytest.mark.parametrize("body, status, code", [
    ({"at_seq": 0}, 400, "validation_error"),
    ({"at_seq": 7}, 400, "validation_error"),
    ({"at_seq": 2, "reason": ""}, 400, "validation_error"),
    ({"at_seq": 2, "input": []}, 400, "validation_error"),
    ({"at_seq": 2, "tool_answers": [{"step": 1, "tool": "x", "status": "succeeded", "result": {}}]},
     400, "validation_error"),
])
def test_bad_forks_are_refused_and_write_nothing(
    alice: AgentClient, worked: dict[str, Any], counts: Counts, body: dict[str, Any], status: int, code: str
) -> None:
    before = counts()
    assert_error(fork(alice, worked["task_id"], **body), status, code)
    assert counts() == before


def test_another_namespaces_task_cannot_be_forked(mallory: AgentClient, worked: dict[str, Any], counts: Counts) -> None:
    before = counts()
    assert_error(fork(mallory, worked["task_id"], at_seq=2), 404, "not_found")
    assert counts() == before


def test_an_oversized_replacement_input_is_413(
    alice: AgentClient, worked: dict[str, Any], counts: Counts, settings: Any
) -> None:
    before = counts()
    big = {"blob": "x" * (settings.BACKPLANE_PAYLOAD_LIMIT_BYTES + 10)}
    assert_error(fork(alice, worked["task_id"], at_seq=2, input=big), 413, "payload_too_large")
    assert counts() == before


def test_a_sandbox_cannot_be_forked_into_production(alice: AgentClient, worked: dict[str, Any], counts: Counts) -> None:
    sandbox = fork(alice, worked["task_id"], at_seq=1, sandbox=True).json()
    before = counts()
    assert_error(fork(alice, sandbox["task_id"], at_seq=2), 409, "sandbox_refused")
    assert counts() == before
    assert fork(alice, sandbox["task_id"], at_seq=2, sandbox=True).status_code == 201


def test_the_recovery_context_presents_the_history_up_to_the_fork_point(
    alice: AgentClient, worked: dict[str, Any]
) -> None:
    forked = fork(alice, worked["task_id"], at_seq=5).json()
    context = alice.get(f"/api/v1/tasks/{forked['task_id']}/recovery-context/").json()
    assert context["forked_from"] == {"task_id": worked["task_id"], "at_seq": 5, "sandbox": False}
    assert [(s["step"], s["task_id"]) for s in context["completed_steps"]] == [(1, worked["task_id"])]
    calls = {c["tool"]: c for c in context["tool_calls"]}
    assert calls["crm-lookup"]["status"] == "succeeded" and calls["crm-lookup"]["result"] == {"employees": 40}
    assert [c["tool"] for c in context["in_flight_tool_calls"]] == ["email-send"]
    assert context["recovery_point_seq"] == 1
    assert f"fork of task {worked['task_id']} after its event 5" in context["resume_prompt"]


def test_a_forks_calls_of_recorded_steps_are_answered_from_the_record(
    alice: AgentClient, worked: dict[str, Any], counts: Counts
) -> None:
    forked = fork(alice, worked["task_id"], at_seq=5).json()
    lease = claim(alice, task_id=forked["task_id"])
    epoch = lease["lease_epoch"]
    before = Event.objects.filter(task_id=forked["task_id"]).count()

    crm = dispatch(alice, forked["task_id"], 2, "crm-lookup", {"lead": 7}, lease_epoch=epoch)
    assert crm.status_code == 200 and crm["Idempotent-Replay"] == "true"
    assert crm.json()["status"] == "succeeded" and crm.json()["result"] == {"employees": 40}
    assert crm.json()["effect_key"] == worked["crm"] != crm.json()["idempotency_key"]
    # The answer is in the fork's history already: nothing new in its log.
    assert Event.objects.filter(task_id=forked["task_id"]).count() == before

    assert_error(dispatch(alice, forked["task_id"], 2, "crm-lookup", {"lead": 8}, lease_epoch=epoch),
                 422, "idempotency_mismatch")

    mail = dispatch(alice, forked["task_id"], 3, "email-send", {"to": "bob"}, lease_epoch=epoch)
    assert mail.status_code == 200 and mail.json()["status"] == "in_flight"
    # The tool must see the key the source dispatched with: it may have acted already.
    assert mail.json()["effect_key"] == worked["mail"]
    recorded = answer(alice, mail.json()["idempotency_key"], {"message_id": "m-1"}, lease_epoch=epoch)
    assert recorded.status_code == 201 and recorded.json()["effect_key"] == worked["mail"]
    result_event = Event.objects.get(task_id=forked["task_id"], type="ToolCallResultReceived")
    assert result_event.payload["effect_key"] == worked["mail"]
    context = alice.get(f"/api/v1/tasks/{forked['task_id']}/recovery-context/").json()
    assert context["in_flight_tool_calls"] == []
    assert {c["tool"]: c["status"] for c in context["tool_calls"]} == {"crm-lookup": "succeeded",
                                                                      "email-send": "succeeded"}

    new = dispatch(alice, forked["task_id"], 4, "payments-charge", {"cents": 100}, lease_epoch=epoch)
    assert new.status_code == 201 and new.json()["effect_key"] == new.json()["idempotency_key"]

    # A sibling fork finds the answer the first fork recorded for the same effect.
    sibling = fork(alice, worked["task_id"], at_seq=5).json()
    again = dispatch(alice, sibling["task_id"], 3, "email-send", {"to": "bob"})
    assert again.json()["status"] == "succeeded" and again.json()["result"] == {"message_id": "m-1"}
    assert again.json()["effect_key"] == worked["mail"]
    # ... and a fork of the fork stands on both.
    grandchild = fork(alice, forked["task_id"], at_seq=Task.objects.get(pk=forked["task_id"]).last_seq).json()
    context = alice.get(f"/api/v1/tasks/{grandchild['task_id']}/recovery-context/").json()
    assert [c["tool"] for c in context["tool_calls"]] == ["crm-lookup", "email-send", "payments-charge"]
    assert [c["status"] for c in context["tool_calls"]] == ["succeeded", "succeeded", "in_flight"]


def test_fleet_claims_skip_sandboxes_which_are_claimed_by_id(alice: AgentClient, worked: dict[str, Any]) -> None:
    sandbox = fork(alice, worked["task_id"], at_seq=1, sandbox=True).json()
    assert alice.post("/api/v1/leases/", {}, format="json").status_code == 204
    lease = claim(alice, task_id=sandbox["task_id"])
    assert lease["task"]["task_id"] == sandbox["task_id"] and lease["task"]["sandbox"] is True


def test_a_sandbox_answers_only_from_the_record_and_sends_nothing(
    alice: AgentClient, worked: dict[str, Any], counts: Counts
) -> None:
    edited = [{"step": 2, "tool": "crm-lookup", "status": "succeeded", "result": {"employees": 3}}]
    outbox_before = OutboxMessage.objects.count()
    sandbox = fork(alice, worked["task_id"], at_seq=1, sandbox=True, tool_answers=edited).json()
    epoch = claim(alice, task_id=sandbox["task_id"])["lease_epoch"]
    sid = sandbox["task_id"]

    crm = dispatch(alice, sid, 2, "crm-lookup", {"lead": 7}, lease_epoch=epoch).json()
    assert crm["status"] == "succeeded" and crm["result"] == {"employees": 3}
    dispatched, received = Event.objects.filter(task_id=sid, seq__gt=3).order_by("seq")
    assert (dispatched.type, received.type) == ("ToolCallDispatched", "ToolCallResultReceived")
    assert received.payload["recorded_from"] == {"tool_answers": True}

    before = counts()
    # The source dispatched the mail and never heard back: a sandbox does not call the tool.
    assert_error(dispatch(alice, sid, 3, "email-send", {"to": "bob"}, lease_epoch=epoch), 409, "sandbox_refused")
    assert_error(dispatch(alice, sid, 9, "never-recorded", {}, lease_epoch=epoch), 409, "sandbox_refused")
    outbox = [{"topic": "leads.scored", "payload": {"score": 1}}]
    response = alice.post(f"/api/v1/tasks/{sid}/events/", {"type": "LeadScored", "payload": {}, "outbox": outbox,
                                                          "lease_epoch": epoch}, format="json")
    assert_error(response, 409, "sandbox_refused")
    assert counts() == before
    append(alice, sid, "TaskCompleted", {"output": {}}, lease_epoch=epoch)
    assert OutboxMessage.objects.count() == outbox_before  # no lifecycle message either
    assert ToolCall.objects.filter(task_id=worked["task_id"]).count() == 2


def test_the_diff_names_the_first_divergent_event_and_field(alice: AgentClient, worked: dict[str, Any]) -> None:
    forked = fork(alice, worked["task_id"], at_seq=4).json()
    fid = forked["task_id"]
    same = alice.get(f"/api/v1/tasks/{worked['task_id']}/diff/{worked['task_id']}/").json()
    assert same["first_divergence"] is None and same["counts"]["changed"] == 0
    # Unleased, as the source's steps were: a claim would be the first difference.
    mail = dispatch(alice, fid, 3, "email-send", {"to": "carol"})
    assert mail.status_code == 201
    diff = alice.get(f"/api/v1/tasks/{worked['task_id']}/diff/{fid}/")
    assert diff.status_code == 200, diff.content
    body = diff.json()
    first = body["first_divergence"]
    # Aligned: TaskStarted, the step, the CRM call and its answer, then the mail.
    assert first["kind"] == "changed" and first["path"] == "$.payload.input.to", first
    assert (first["a_value"], first["b_value"]) == ("bob", "carol")
    assert first["a"] == {"task_id": worked["task_id"], "seq": 5, "type": "ToolCallDispatched"}
    assert first["b"]["task_id"] == fid and first["b"]["type"] == "ToolCallDispatched"
    assert body["counts"]["same"] == 4
    assert_error(alice.get(f"/api/v1/tasks/{worked['task_id']}/diff/{uuid.uuid4()}/"), 404, "not_found")


def test_a_forks_hand_off_gets_the_sources_child(alice: AgentClient, make_agent: Callable[..., AgentClient]) -> None:
    researcher = make_agent("researcher", "acme")
    parent = create_task(alice)
    pid = parent["task_id"]

    def hand_off(task_id: str, n: int) -> Any:
        return alice.post(f"/api/v1/tasks/{task_id}/subtasks/", {"step": n, "kind": "research", "input": {"n": n}},
                          format="json")

    finished = hand_off(pid, 1).json()["task"]
    unfinished = hand_off(pid, 2).json()["task"]
    at = Task.objects.get(pk=pid).last_seq  # both dispatched; no result yet
    lease = claim(researcher, task_id=finished["task_id"])
    append(researcher, finished["task_id"], "TaskCompleted", {"output": {"score": 9}},
           lease_epoch=lease["lease_epoch"])
    forked = fork(alice, pid, at_seq=at).json()
    fid = forked["task_id"]
    later = fork(alice, pid, at_seq=Task.objects.get(pk=pid).last_seq).json()  # after the first result
    children = Task.objects.count()

    # The child that finished after the fork point: its result is written into the fork now.
    again = hand_off(fid, 1)
    assert again.status_code == 200 and again.json()["task"]["task_id"] == finished["task_id"]
    # The unfinished one is adopted, not started twice.
    adopted = hand_off(fid, 2)
    assert adopted.status_code == 200 and adopted.json()["task"]["task_id"] == unfinished["task_id"]
    assert hand_off(fid, 2).json()["task"]["task_id"] == unfinished["task_id"]
    assert Task.objects.count() == children
    results = Event.objects.filter(task_id=fid, type="SubAgentResultReceived")
    assert [e.payload["child_task_id"] for e in results] == [finished["task_id"]]
    # A fork made after the result has it in its history: nothing is written again.
    assert hand_off(later["task_id"], 1).json()["task"]["task_id"] == finished["task_id"]
    assert not Event.objects.filter(task_id=later["task_id"], type="SubAgentResultReceived").exists()

    lease = claim(researcher, task_id=unfinished["task_id"])
    append(researcher, unfinished["task_id"], "TaskCompleted", {"output": {"score": 4}},
           lease_epoch=lease["lease_epoch"])
    for task_id in (pid, fid):
        heard = Event.objects.filter(task_id=task_id, type="SubAgentResultReceived",
                                     payload__child_task_id=unfinished["task_id"])
        assert heard.count() == 1 and heard.get().payload["output"] == {"score": 4}
    # The later fork never adopted it, so it is not told.
    assert not Event.objects.filter(task_id=later["task_id"], type="SubAgentResultReceived").exists()
    context = alice.get(f"/api/v1/tasks/{fid}/recovery-context/").json()
    assert {s["child_task_id"]: s["status"] for s in context["subtasks"]} == {
        finished["task_id"]: "completed", unfinished["task_id"]: "completed"}


def test_a_fork_from_failure_continues_before_the_last_failure(alice: AgentClient, worked: dict[str, Any]) -> None:
    assert forks.failure_point(Task.objects.get(pk=worked["task_id"])) == 5
    assert forks.failure_point(Task.objects.get(pk=create_task(alice)["task_id"])) is None


def test_llm_called_is_checked(alice: AgentClient) -> None:
    from backplane.eventlog.event_types import prompt_sha256

    task = create_task(alice)
    prompt = [{"role": "user", "content": "score this lead"}]
    good = {"model": "gpt-x", "prompt": prompt, "prompt_sha256": prompt_sha256(prompt), "output": {"score": 3},
            "usage": {"input_tokens": 12, "output_tokens": 3}, "step": 2}
    append(alice, task["task_id"], "LLMCalled", good)
    for bad in ({**good, "prompt_sha256": "0" * 64}, {k: v for k, v in good.items() if k != "output"},
                {**good, "usage": {"input_tokens": -1}}, {**good, "model": 3}):
        response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {"type": "LLMCalled", "payload": bad},
                              format="json")
        assert_error(response, 400, "validation_error")


def test_a_forks_verify_checks_its_provenance(alice: AgentClient, worked: dict[str, Any]) -> None:
    forked = fork(alice, worked["task_id"], at_seq=2).json()
    assert alice.get(f"/api/v1/tasks/{forked['task_id']}/verify/").json()["valid"] is True
    # Someone with the database rewrites the source's history and re-chains it consistently:
    # the source's own chain holds again, but the fork recorded the hash that was there.
    rewrite_history(Task.objects.get(pk=worked["task_id"]), seq=2, payload={"step": 1, "thought": "never mind"})
    assert alice.get(f"/api/v1/tasks/{worked['task_id']}/verify/").json()["valid"] is True
    verify = alice.get(f"/api/v1/tasks/{forked['task_id']}/verify/").json()
    assert (verify["valid"], verify["first_invalid_seq"]) == (False, 2)


def test_staff_fork_in_any_namespace_and_a_long_username_is_recorded_cut(worked: dict[str, Any]) -> None:
    from tests.support.roles import staff_user

    staff = APIClient()
    staff.force_login(staff_user("o" * 150, "Operators"))
    response = fork(staff, worked["task_id"], at_seq=2)
    assert response.status_code == 201, response.content
    forked = Event.objects.get(task_id=response.json()["task_id"], seq=2)
    assert forked.payload["by_staff"] is True and forked.agent == ("user:" + "o" * 150)[:100]
    assert response.json()["namespace"] == "acme"
