"""The Python client and gated tool calls (docs/approvals.md), against the product's web process:
a session waits for people's decision and then makes the call once; a denial raises; an agent
that stopped waiting (or crashed) finds the same request in its next attempt."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from backplane_client import ApprovalDenied, AwaitingApproval
from recovery import approvals
from recovery.models import ApprovalRequest
from tests.client.conftest import Agents
from tests.support.roles import staff_user

AMOUNT = {"amount": 5000, "currency": "EUR"}


@pytest.fixture
def approver(agents: Agents) -> User:
    user = staff_user(f"ana-{agents.fleet.namespace}", "Approvers")
    approvals.tool_policy_set(tool="pay", namespace=agents.fleet.namespace, condition="amount > 1000",
                              field_types={"amount": "number"}, approver_group="Approvers", set_by="user:olivia",
                              reason="finance rule")
    return user


def decide_when_asked(user: User, verdict: str, *, after: float = 0.3) -> threading.Thread:
    """A person who decides the first request that comes, a moment after it came."""

    def decide() -> None:
        try:
            deadline = time.monotonic() + 20
            while (request := ApprovalRequest.objects.filter(status="pending").first()) is None:
                assert time.monotonic() < deadline, "no request came"
                time.sleep(0.05)
            time.sleep(after)
            approvals.approval_decide(approval_id=request.pk, user=user, verdict=verdict, reason="checked")
        finally:
            connection.close()

    person = threading.Thread(target=decide)
    person.start()
    return person


def test_a_session_waits_for_the_approval_and_makes_the_call_once(agents: Agents, approver: User) -> None:
    task_id = agents.task()
    effects: Counter[str] = Counter()

    def pay(key: str, body: dict[str, Any]) -> dict[str, Any]:
        effects[key] += 1
        return {"paid": body["amount"]}

    person = decide_when_asked(approver, "approve")
    with agents.claim(agents.worker) as session:
        started = time.monotonic()
        call = session.call_tool(3, "pay", AMOUNT, pay, reason="the October invoice")
        waited = time.monotonic() - started
        session.complete({"paid": call.result})
    person.join()
    assert call.status == "succeeded" and effects == Counter({call.key: 1}) and 0.3 <= waited < 10
    types = agents.types(task_id)
    assert (types["ApprovalRequested"], types["ApprovalGranted"], types["ToolCallDispatched"]) == (1, 1, 1)


def test_a_denial_raises_and_nothing_is_made(agents: Agents, approver: User) -> None:
    agents.task()
    person = decide_when_asked(approver, "deny")
    with agents.claim(agents.worker) as session:
        with pytest.raises(ApprovalDenied) as refused:
            session.call_tool(3, "pay", AMOUNT, lambda key, body: pytest.fail("the tool must not be called"))
        session.fail("the payment was denied", retryable=False)
    person.join()
    assert refused.value.details["denied_by"] == f"user:{approver.username}"


def test_an_agent_that_stopped_waiting_finds_its_request_in_the_next_attempt(agents: Agents, approver: User) -> None:
    task_id = agents.task()
    with agents.claim(agents.worker) as first:
        with pytest.raises(AwaitingApproval) as waiting:
            first.call_tool(3, "pay", AMOUNT, lambda key, body: pytest.fail("not before the approval"), wait=False)
    approvals.approval_decide(approval_id=uuid.UUID(waiting.value.approval_id), user=approver, verdict="approve",
                              reason="ok")
    agents.expire()  # the first attempt is gone; the approval stands for the call, not the attempt
    effects: Counter[str] = Counter()
    with agents.claim(agents.other) as second:
        call = second.call_tool(3, "pay", AMOUNT, lambda key, body: effects.update([key]) or {"paid": True})
        second.complete({})
    assert effects == Counter({call.key: 1})
    assert agents.types(task_id)["ApprovalRequested"] == 1 and ApprovalRequest.objects.count() == 1


def test_the_async_client_dispatches_waits_and_dispatches_again(agents: Agents, approver: User,
                                                                 sdk_server: Any) -> None:
    import asyncio

    from backplane_client import AsyncAgentClient

    agents.task()
    lease = agents.worker.claim([agents.fleet.KIND], lease_seconds=60)
    assert lease is not None
    person = decide_when_asked(approver, "approve")

    async def agent() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with AsyncAgentClient(sdk_server.url, agents.fleet.tokens["worker"]) as bp:
            waiting = await bp.dispatch_tool_call(lease.task_id, 3, "pay", AMOUNT, lease_epoch=lease.lease_epoch,
                                                  reason="the October invoice")
            decided = await bp.wait_for_approval(waiting["approval_id"], timeout=20)
            made = await bp.dispatch_tool_call(lease.task_id, 3, "pay", AMOUNT, lease_epoch=lease.lease_epoch)
            return waiting, decided, made

    waiting, decided, made = asyncio.run(agent())
    person.join()
    assert (waiting["status"], decided["status"], made["status"]) == ("awaiting_approval", "granted", "dispatched")
    assert decided["reason"] == "the October invoice" and decided["argument_sha256"] == waiting["argument_sha256"]


def test_a_session_waits_for_a_signal_another_agent_sends(agents: Agents) -> None:
    task_id = agents.task()

    def send_soon() -> None:
        time.sleep(0.5)
        agents.planner.send_signal(task_id, "invoice-paid", {"paid_at": "2026-12-06"})

    sender = threading.Thread(target=send_soon)
    with agents.claim(agents.worker) as session:
        sender.start()
        payload = session.wait_for_signal("invoice-paid", timeout=60)
        session.complete({"paid": payload})
    sender.join()
    assert payload == {"paid_at": "2026-12-06"}
    assert agents.types(task_id)["SignalReceived"] == 1
