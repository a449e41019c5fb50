"""Two-phase hand-off to sub-agents."""

from __future__ import annotations

from backplane.eventlog.models import Event
from tests.api.conftest import assert_error, claim, create_task


def test_the_hand_off_from_dispatch_to_result(make_agent, counts) -> None:  # type: ignore[no-untyped-def]
    orchestrator = make_agent("orchestrator", "acme", kinds=("plan",))
    researcher = make_agent("researcher", "acme", kinds=("research",))
    parent = create_task(orchestrator, kind="plan")
    lease = claim(orchestrator)
    url = f"/api/v1/tasks/{parent['task_id']}/subtasks/"
    body = {"step": 2, "kind": "research", "input": {"q": "who is bob"}, "lease_epoch": lease["lease_epoch"]}

    first = orchestrator.post(url, body, format="json")
    assert first.status_code == 201
    child = first.json()["task"]
    assert child["parent_task_id"] == parent["task_id"] and child["kind"] == "research"
    before = counts()
    again = orchestrator.post(url, body, format="json")
    assert again.status_code == 200 and again.json()["task"]["task_id"] == child["task_id"]
    assert again.json()["dispatch_key"] == first.json()["dispatch_key"]
    assert counts() == before
    assert_error(orchestrator.post(url, {**body, "input": {"q": "other"}}, format="json"), 422,
                 "idempotency_mismatch")

    child_lease = claim(researcher)
    assert child_lease["task"]["task_id"] == child["task_id"]
    done = researcher.post(f"/api/v1/tasks/{child['task_id']}/events/", {
        "type": "TaskCompleted", "payload": {"output": {"answer": "a builder"}},
        "lease_epoch": child_lease["lease_epoch"]}, format="json")
    assert done.status_code == 201

    parent_types = list(Event.objects.filter(task_id=parent["task_id"]).order_by("seq").values_list("type", flat=True))
    assert parent_types == ["TaskStarted", "TaskClaimed", "SubAgentDispatched", "SubAgentAccepted",
                            "SubAgentResultReceived"]
    result = Event.objects.get(task_id=parent["task_id"], type="SubAgentResultReceived")
    assert result.payload["output"] == {"answer": "a builder"} and result.payload["status"] == "completed"
    context = orchestrator.get(f"/api/v1/tasks/{parent['task_id']}/recovery-context/").json()
    assert context["subtasks"][0]["status"] == "completed"


def test_a_terminal_child_failure_also_reaches_the_parent(alice) -> None:  # type: ignore[no-untyped-def]
    parent = create_task(alice)
    child = alice.post(f"/api/v1/tasks/{parent['task_id']}/subtasks/",
                       {"step": 1, "kind": "k", "input": {}}, format="json").json()["task"]
    alice.post(f"/api/v1/tasks/{child['task_id']}/events/",
               {"type": "TaskFailed", "payload": {"error": "no data", "retryable": False}}, format="json")
    result = Event.objects.get(task_id=parent["task_id"], type="SubAgentResultReceived")
    assert (result.payload["status"], result.payload["error"]) == ("failed", "no data")


def test_a_closed_parent_cannot_dispatch(alice) -> None:  # type: ignore[no-untyped-def]
    parent = create_task(alice)
    alice.post(f"/api/v1/tasks/{parent['task_id']}/events/",
               {"type": "TaskCompleted", "payload": {"output": {}}}, format="json")
    assert_error(alice.post(f"/api/v1/tasks/{parent['task_id']}/subtasks/",
                            {"step": 1, "kind": "k", "input": {}}, format="json"), 409, "task_closed")
