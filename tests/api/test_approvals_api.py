"""Approvals over the API: a gated dispatch answers 202 with its request, the agent reads it (and
waits for it on the HTTP front, with no thread and no connection held), a person in the group
asked decides it, and the call is then made once; every refusal is the contract's error."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from api.bodies import ApprovalOut, AwaitingApprovalOut
from recovery import approvals
from recovery.models import ApprovalRequest, ToolCall
from tests.api.conftest import AgentClient, assert_error, claim, create_task
from tests.api.test_agent_front import AsyncReads, both
from tests.api.test_bodies import conforms
from tests.support.roles import role_group, staff_user

PAYMENT = {"amount": 5000, "currency": "EUR"}


def session(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def gate_payments() -> None:
    role_group("Approvers")
    approvals.tool_policy_set(tool="payments.transfer", condition="amount > 1000",
                              field_types={"amount": "number"}, approver_group="Approvers", set_by="user:olivia",
                              reason="finance rule")


def leased_task(agent: AgentClient) -> dict[str, Any]:
    task = create_task(agent)
    lease = claim(agent, task_id=task["task_id"])
    return {"task_id": task["task_id"], "lease_epoch": lease["lease_epoch"]}


def dispatch(agent: AgentClient, task: dict[str, Any], **body: Any) -> Any:
    return agent.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/", {
        "step": 3, "tool": "payments.transfer", "input": PAYMENT, "lease_epoch": task["lease_epoch"],
        "reason": "pay the October invoice", **body}, format="json")


@pytest.mark.django_db
def test_a_gated_call_waits_is_approved_by_a_person_and_is_then_made_once(
    alice: AgentClient, mallory: AgentClient,
) -> None:
    gate_payments()
    task = leased_task(alice)
    waiting = conforms(dispatch(alice, task), AwaitingApprovalOut)
    assert dispatch(alice, task).status_code == 202
    assert dispatch(alice, task).json() == waiting and waiting["policy_version"] == 1
    approval = f"/api/v1/approvals/{waiting['approval_id']}/"

    read = alice.get(approval)
    assert read.status_code == 200 and conforms(read, ApprovalOut)["status"] == "pending"
    assert read.json()["reason"] == "pay the October invoice" and read.json()["input"] == PAYMENT
    assert_error(mallory.get(approval), 404, "not_found")
    assert_error(alice.post(f"{approval}approve/", {"reason": "mine"}, format="json"), 403, "permission_denied")
    viewer = session(staff_user("vera", "Viewers"))
    assert viewer.get("/api/v1/approvals/").json()["results"][0]["approval_id"] == waiting["approval_id"]
    assert_error(viewer.post(f"{approval}approve/", {"reason": "fine"}, format="json"), 403, "permission_denied")
    approver = session(staff_user("ana", "Approvers"))
    assert_error(approver.post(f"{approval}approve/", {}, format="json"), 400, "validation_error")

    decided = approver.post(f"{approval}approve/", {"reason": "matches the order"}, format="json")
    assert decided.status_code == 200 and conforms(decided, ApprovalOut)["status"] == "granted"
    assert decided.json()["decisions"][0]["by"] == "user:ana"
    assert_error(approver.post(f"{approval}deny/", {"reason": "changed my mind"}, format="json"),
                 409, "already_decided")

    made = dispatch(alice, task)
    assert (made.status_code, made.json()["status"]) == (201, "dispatched")
    assert dispatch(alice, task).json()["replayed"] is True
    assert_error(dispatch(alice, task, input={"amount": 9000, "currency": "EUR"}), 422, "idempotency_mismatch")
    assert ToolCall.objects.count() == 1
    verified = viewer.get(f"/api/v1/tasks/{task['task_id']}/verify/")
    assert verified.status_code == 200 and verified.json()["valid"] is True, verified.json()


@pytest.mark.django_db
def test_a_denied_call_is_409_naming_who_and_why(alice: AgentClient) -> None:
    gate_payments()
    task = leased_task(alice)
    waiting = dispatch(alice, task).json()
    approver = session(staff_user("ben", "Approvers"))
    assert approver.post(f"/api/v1/approvals/{waiting['approval_id']}/deny/", {"reason": "wrong payee"},
                         format="json").status_code == 200
    error = assert_error(dispatch(alice, task), 409, "approval_denied")
    assert error["details"] == {"approval_id": waiting["approval_id"], "status": "denied", "denied_by": "user:ben",
                                "reason": "wrong payee"}
    assert not ToolCall.objects.exists()


@pytest.mark.django_db
def test_bad_queries_and_ids_are_the_contracts_errors(alice: AgentClient) -> None:
    approver = session(staff_user("ana", "Approvers", "Viewers"))
    assert_error(approver.get("/api/v1/approvals/?status=maybe"), 400, "validation_error")
    missing = "/api/v1/approvals/00000000-0000-4000-8000-000000000000/"
    assert_error(alice.get(missing), 404, "not_found")
    assert_error(alice.get(f"{missing}?wait=31"), 400, "validation_error")
    assert_error(approver.post(f"{missing}approve/", {"reason": "x"}, format="json"), 404, "not_found")


@pytest.mark.django_db
def test_an_agent_lists_no_approvals_and_a_long_reason_asks_nothing(alice: AgentClient) -> None:
    from backplane.eventlog.models import Event

    gate_payments()
    task = leased_task(alice)
    assert_error(alice.get("/api/v1/approvals/"), 403, "permission_denied")
    before = Event.objects.filter(task_id=task["task_id"]).count()
    error = assert_error(dispatch(alice, task, reason="x" * 2001), 400, "validation_error")
    assert set(error["details"]) == {"reason"}
    assert not ApprovalRequest.objects.exists() and not ToolCall.objects.exists()
    assert Event.objects.filter(task_id=task["task_id"]).count() == before
    assert dispatch(alice, task, reason="x" * 2000).status_code == 202  # the longest allowed
    waiting = ApprovalRequest.objects.get()
    decider = session(staff_user("ana", "Approvers"))
    assert_error(decider.post(f"/api/v1/approvals/{waiting.pk}/approve/", {"reason": "y" * 2001}, format="json"),
                 400, "validation_error")
    assert not waiting.decisions.exists()


@pytest.fixture
def reads() -> Iterator[AsyncReads]:
    served = AsyncReads()
    try:
        yield served
    finally:
        served.close()


@pytest.mark.usefixtures("committed_db")
def test_an_agent_waiting_on_the_front_hears_of_the_decision_at_once(reads: AsyncReads) -> None:
    from backplane.eventlog import services
    from recovery import leases, tool_calls
    from recovery.errors import ApprovalPending

    gate_payments()
    created = services.agent_create(name="payer", namespace="acme")
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    lease = leases.lease_claim(agent=created.agent, kinds=None, lease_seconds=30)
    assert lease is not None
    with pytest.raises(ApprovalPending) as pending:
        tool_calls.tool_call_dispatch(namespace="acme", task_id=lease.task.pk, step=1, tool="payments.transfer",
                                      input=PAYMENT, agent="payer", lease_epoch=lease.lease_epoch)
    request: ApprovalRequest = pending.value.request
    path = f"/api/v1/approvals/{request.pk}/"
    headers = {"Authorization": f"Bearer {created.token}", "Host": "testserver"}

    started = time.monotonic()
    undecided = reads.request("GET", f"{path}?wait=1", headers, base_url="http://testserver")
    assert undecided.json()["status"] == "pending" and 1.0 <= time.monotonic() - started < 3.0
    both(reads, "GET", f"{path}?wait=31", token=created.token)  # 400 on either stack

    approver = staff_user("ana", "Approvers")

    def decide_soon() -> None:
        time.sleep(0.5)
        try:
            approvals.approval_decide(approval_id=request.pk, user=approver, verdict="approve", reason="ok")
        finally:
            connection.close()

    decider = threading.Thread(target=decide_soon)
    started = time.monotonic()
    decider.start()
    decided = reads.request("GET", f"{path}?wait=20", headers, base_url="http://testserver")
    decider.join()
    assert decided.json()["status"] == "granted" and time.monotonic() - started < 3.0


@pytest.mark.usefixtures("committed_db")
def test_the_front_does_not_hand_out_a_task_given_back_while_it_waits(reads: AsyncReads) -> None:
    from backplane.eventlog import services
    from recovery import leases, tool_calls
    from recovery.errors import ApprovalPending

    gate_payments()
    created = services.agent_create(name="payer", namespace="acme")
    task = services.task_create(namespace="acme", kind="payment", input={}, agent="planner").task
    headers = {"Authorization": f"Bearer {created.token}", "Host": "testserver", "Content-Type": "application/json"}
    lease = reads.request("POST", "/api/v1/leases/", headers, base_url="http://testserver", content=b"{}").json()
    with pytest.raises(ApprovalPending) as pending:
        tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=1, tool="payments.transfer",
                                      input=PAYMENT, agent="payer", lease_epoch=lease["lease_epoch"])
    leases.lease_release(namespace="acme", task_id=task.pk, lease_epoch=lease["lease_epoch"], agent="payer")

    refused = reads.request("POST", "/api/v1/leases/", headers, base_url="http://testserver", content=b"{}")
    assert refused.status_code == 204
    approvals.approval_decide(approval_id=pending.value.request.pk, user=staff_user("ana", "Approvers"),
                              verdict="approve", reason="ok")
    claimed = reads.request("POST", "/api/v1/leases/", headers, base_url="http://testserver", content=b"{}")
    assert claimed.status_code == 200 and claimed.json()["task"]["task_id"] == str(task.pk)
