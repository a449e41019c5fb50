"""Approvals of gated tool calls (recovery/approvals.py): a request bound to the call's exact
arguments and its policy version, found again by the same dispatch; people's decisions, once
each, by the group asked; expiry that denies or escalates; every end in the task's chain."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.utils import timezone

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.errors import AlreadyDecided, IdempotencyMismatch
from backplane.eventlog.models import Agent, Event, Task
from recovery import approvals, detector, leases, tool_calls
from recovery.errors import ApprovalDenied, ApprovalExpired, ApprovalPending, NotAnApprover
from recovery.models import ApprovalRequest, ApprovalStatus, ToolCall
from tests.support.roles import staff_user

pytestmark = pytest.mark.django_db

PAYMENT = {"amount": 5000, "currency": "EUR", "payee": "ACME GmbH"}


@pytest.fixture
def approvers() -> list[User]:
    Group.objects.get_or_create(name="Approvers")
    Group.objects.get_or_create(name="Finance leads")
    return [staff_user(name, "Approvers") for name in ("ana", "ben")]


@pytest.fixture
def agent() -> Agent:
    return services.agent_create(name="payer", namespace="acme").agent


@pytest.fixture
def leased(agent: Agent) -> tuple[Task, int]:
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None
    return claim.task, claim.lease_epoch


def gate_payments(**values: Any) -> None:
    approvals.tool_policy_set(**{"tool": "payments.transfer", "condition": "amount > 1000",
                                 "field_types": {"amount": "number"}, "approver_group": "Approvers",
                                 "set_by": "user:olivia", "reason": "finance rule", **values})


def dispatch(leased: tuple[Task, int], *, input: dict[str, Any] = PAYMENT, step: int = 3) -> tool_calls.ToolCallOutcome:
    task, epoch = leased
    return tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=step, tool="payments.transfer",
                                         input=input, agent="payer", lease_epoch=epoch,
                                         reason="pay the October invoice")


def pending(leased: tuple[Task, int], **kwargs: Any) -> ApprovalRequest:
    with pytest.raises(ApprovalPending) as waiting:
        dispatch(leased, **kwargs)
    request: ApprovalRequest = waiting.value.request
    return request


def types_of(task: Task) -> list[str]:
    return list(Event.objects.filter(task=task).order_by("seq").values_list("type", flat=True))


def test_a_gated_call_waits_for_its_request_and_a_retry_finds_the_same_one(
    approvers: list[User], leased: tuple[Task, int],
) -> None:
    gate_payments()
    first = pending(leased)
    again = pending(leased)
    assert again.pk == first.pk and ApprovalRequest.objects.count() == 1
    assert not ToolCall.objects.exists()
    assert types_of(leased[0])[-1] == "ApprovalRequested" and types_of(leased[0]).count("ApprovalRequested") == 1
    requested = Event.objects.get(task=leased[0], type="ApprovalRequested").payload
    assert requested["argument_sha256"] == canonical_sha256(PAYMENT) == first.argument_sha256
    assert (requested["policy_version"], requested["reason"], requested["group"]) == (
        1, "pay the October invoice", "Approvers")
    assert OutboxMessage.objects.filter(topic="backplane.approvals").count() == 1


def test_an_ungated_call_is_dispatched_as_before(approvers: list[User], leased: tuple[Task, int]) -> None:
    gate_payments()
    outcome = dispatch(leased, input={"amount": 10, "currency": "EUR"})
    assert outcome.call.status == "dispatched" and not ApprovalRequest.objects.exists()


def test_once_granted_the_call_is_made_once_with_those_arguments_only(
    approvers: list[User], leased: tuple[Task, int],
) -> None:
    gate_payments()
    request = pending(leased)
    decided = approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve",
                                        reason="matches the order")
    assert decided.status == ApprovalStatus.GRANTED
    granted = Event.objects.get(task=leased[0], type="ApprovalGranted").payload
    assert granted["approved_by"][0]["by"] == "user:ana" and granted["argument_sha256"] == request.argument_sha256

    made = dispatch(leased)
    assert not made.replayed and made.call.input == PAYMENT
    assert Event.objects.get(task=leased[0], type="ToolCallDispatched").payload["approval_id"] == str(request.pk)
    assert dispatch(leased).replayed

    with pytest.raises(IdempotencyMismatch):
        dispatch(leased, input={**PAYMENT, "amount": 9000})
    assert ToolCall.objects.count() == 1


def test_other_arguments_for_a_pending_step_are_refused_and_change_nothing(
    approvers: list[User], leased: tuple[Task, int],
) -> None:
    gate_payments()
    pending(leased)
    before = types_of(leased[0])
    with pytest.raises(IdempotencyMismatch) as refused:
        dispatch(leased, input={**PAYMENT, "amount": 9000})
    assert "approval_id" in refused.value.details and types_of(leased[0]) == before


def test_a_denial_ends_it_and_the_dispatch_is_refused_naming_who(
    approvers: list[User], leased: tuple[Task, int],
) -> None:
    gate_payments()
    request = pending(leased)
    approvals.approval_decide(approval_id=request.pk, user=approvers[1], verdict="deny", reason="wrong payee")
    with pytest.raises(ApprovalDenied) as refused:
        dispatch(leased)
    assert refused.value.details == {"approval_id": str(request.pk), "status": "denied", "denied_by": "user:ben",
                                     "reason": "wrong payee"}
    with pytest.raises(AlreadyDecided):
        approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="late")
    assert types_of(leased[0])[-2:] == ["ApprovalRequested", "ApprovalDenied"]


def test_two_approvals_need_two_people(approvers: list[User], leased: tuple[Task, int]) -> None:
    gate_payments(approvals_required=2)
    request = pending(leased)
    assert approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve",
                                     reason="ok").status == ApprovalStatus.PENDING
    with pytest.raises(AlreadyDecided):
        approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="again")
    pending(leased)  # still waiting
    assert approvals.approval_decide(approval_id=request.pk, user=approvers[1], verdict="approve",
                                     reason="ok too").status == ApprovalStatus.GRANTED
    granted = Event.objects.get(task=leased[0], type="ApprovalGranted").payload
    assert [a["by"] for a in granted["approved_by"]] == ["user:ana", "user:ben"]
    assert not dispatch(leased).replayed


def test_only_the_group_asked_decides_and_four_eyes_keeps_a_person_off_their_own_agent(
    approvers: list[User], agent: Agent, leased: tuple[Task, int],
) -> None:
    gate_payments()
    request = pending(leased)
    viewer = staff_user("vera", "Viewers")
    with pytest.raises(NotAnApprover):
        approvals.approval_decide(approval_id=request.pk, user=viewer, verdict="approve", reason="looks fine")
    Agent.objects.filter(pk=agent.pk).update(user=approvers[0])
    with pytest.raises(NotAnApprover) as refused:
        approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="mine")
    assert "four eyes" in refused.value.message
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.PENDING
    assert not request.decisions.exists()


def test_an_expired_request_is_denied_and_says_so(approvers: list[User], leased: tuple[Task, int]) -> None:
    gate_payments(open_seconds=60)
    request = pending(leased)
    assert approvals.approvals_expire(now=timezone.now() + timedelta(seconds=30)) == 0
    assert approvals.approvals_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    with pytest.raises(ApprovalExpired):
        dispatch(leased)
    with pytest.raises(AlreadyDecided):
        approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="late")
    assert Event.objects.get(task=leased[0], type="ApprovalExpired").payload["outcome"] == "denied"


def test_an_escalating_policy_asks_the_other_group_then_expires(
    approvers: list[User], leased: tuple[Task, int],
) -> None:
    gate_payments(open_seconds=60, on_expiry="escalate", escalate_to="Finance leads")
    request = pending(leased)
    later = timezone.now() + timedelta(seconds=61)
    assert approvals.approvals_expire(now=later) == 1
    request.refresh_from_db()
    assert (request.status, request.group.name, request.escalated) == ("pending", "Finance leads", True)
    with pytest.raises(NotAnApprover):  # the first group's turn is over
        approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="ok")
    lead = staff_user("fay", "Finance leads")
    approvals.approval_decide(approval_id=request.pk, user=lead, verdict="approve", reason="escalated, fine")
    assert types_of(leased[0])[-3:] == ["ApprovalRequested", "ApprovalEscalated", "ApprovalGranted"]


def test_a_task_waiting_for_people_is_not_stalled(approvers: list[User], leased: tuple[Task, int]) -> None:
    gate_payments()
    request = pending(leased)
    far = timezone.now() + timedelta(hours=1)
    assert detector.lease_expire_stalled(now=far).expired == 0
    approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="ok")
    # For a lease's length after the decision the waiting agent may still make its call...
    assert detector.lease_expire_stalled(now=timezone.now()).expired == 0
    # ...and after that, a silent holder is stalled as any other.
    assert detector.lease_expire_stalled(now=timezone.now() + timedelta(hours=1)).expired == 1


@pytest.mark.django_db(transaction=True)
def test_approvers_racing_write_one_decision(committed_db: None) -> None:
    Group.objects.get_or_create(name="Approvers")
    people = [staff_user(f"p{n}", "Approvers") for n in range(4)]
    agent = services.agent_create(name="payer", namespace="acme").agent
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None
    gate_payments()
    request = pending((claim.task, claim.lease_epoch))
    outcomes: list[str] = []
    barrier = threading.Barrier(len(people))

    def decide(person: User) -> None:
        try:
            barrier.wait()
            approvals.approval_decide(approval_id=request.pk, user=person, verdict="approve", reason="go")
            outcomes.append("decided")
        except AlreadyDecided:
            outcomes.append("already")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["already"] * 3 + ["decided"]
    assert Event.objects.filter(task=claim.task, type="ApprovalGranted").count() == 1
    assert request.decisions.count() == 1


@pytest.mark.django_db(transaction=True)
def test_metrics_count_the_waiting_and_time_each_decision(committed_db: None) -> None:
    from django.test import Client

    from tests.backplane.telemetry.metrics_scrape import scrape

    Group.objects.get_or_create(name="Approvers")
    person = staff_user("ana", "Approvers")
    agent = services.agent_create(name="payer", namespace="acme").agent
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None
    gate_payments()
    client = Client()
    before = scrape(client)
    request = pending((claim.task, claim.lease_epoch))
    waiting = scrape(client)
    assert waiting.value("backplane_approvals_pending") == 1
    assert waiting.value("backplane_approval_oldest_pending_age_seconds") >= 0
    approvals.approval_decide(approval_id=request.pk, user=person, verdict="approve", reason="ok")
    after = scrape(client)
    assert after.value("backplane_approvals_pending") == 0
    assert after.moved_since(before, "backplane_approval_time_to_decision_seconds_count", outcome="granted") == 1


def test_a_task_given_back_while_waiting_is_not_handed_out_until_the_decision(
    approvers: list[User], agent: Agent, leased: tuple[Task, int],
) -> None:
    gate_payments()
    request = pending(leased)
    task, epoch = leased
    leases.lease_release(namespace="acme", task_id=task.pk, lease_epoch=epoch, agent="payer")
    services.task_create(namespace="acme", kind="payment", input={"n": 2}, agent="planner")
    # The waiting task is the oldest pending one, yet the claim passes over it (and by id, too).
    other = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert other is not None and other.task.pk != task.pk
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30, task_id=task.pk) is None
    assert Task.objects.get(pk=task.pk).status == "pending"

    approvals.approval_decide(approval_id=request.pk, user=approvers[0], verdict="approve", reason="ok")
    again = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert again is not None and again.task.pk == task.pk and not again.recovered
    made = dispatch((again.task, again.lease_epoch))
    assert not made.replayed and made.call.input == PAYMENT


def test_a_request_that_expires_while_nobody_holds_the_task_frees_it_for_the_refusal(
    approvers: list[User], agent: Agent, leased: tuple[Task, int],
) -> None:
    gate_payments(open_seconds=60)
    pending(leased)
    leases.lease_release(namespace="acme", task_id=leased[0].pk, lease_epoch=leased[1], agent="payer")
    assert leases.lease_claim(agent=agent, kinds=None, lease_seconds=30) is None
    assert approvals.approvals_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    again = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert again is not None and again.task.pk == leased[0].pk
    with pytest.raises(ApprovalExpired):
        dispatch((again.task, again.lease_epoch))
