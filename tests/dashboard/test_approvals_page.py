"""The Approvals page: what waits, with the exact arguments, their hash and what led to each
request; a member of the group asked decides with a reason; anyone else is told why not, and
nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from recovery import approvals, leases, tool_calls
from recovery.errors import ApprovalPending
from recovery.models import ApprovalRequest, ApprovalStatus
from tests.support.roles import role_group, staff_user

pytestmark = pytest.mark.django_db


def session(*roles: str, name: str = "ana") -> Client:
    client = Client()
    client.force_login(staff_user(name, *roles))
    return client


@pytest.fixture
def waiting() -> ApprovalRequest:
    role_group("Approvers")
    approvals.tool_policy_set(tool="payments.transfer", condition="amount > 1000", field_types={"amount": "number"},
                              approver_group="Approvers", set_by="user:olivia", reason="finance rule")
    agent = services.agent_create(name="payer", namespace="acme").agent
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    lease = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert lease is not None
    services.event_append(namespace="acme", task_id=lease.task.pk, agent="payer", lease_epoch=lease.lease_epoch,
                          draft=EventDraft(type="ReasoningStepCompleted",
                                           payload={"step": 2, "thought": "invoice INV-7 matches order 91"}))
    with pytest.raises(ApprovalPending) as pending:
        tool_calls.tool_call_dispatch(namespace="acme", task_id=lease.task.pk, step=3, tool="payments.transfer",
                                      input={"payee": "ACME GmbH", "amount": 5000}, agent="payer",
                                      lease_epoch=lease.lease_epoch, reason="pay INV-7")
    request: ApprovalRequest = pending.value.request
    return request


def test_it_shows_what_waits_with_its_exact_arguments_and_what_led_to_it(waiting: ApprovalRequest) -> None:
    page = session("Viewers").get("/approvals/")
    html = page.content.decode()
    assert page.status_code == 200
    assert escape('{"amount":5000,"payee":"ACME GmbH"}') in html  # canonical: keys sorted, no spaces
    assert waiting.argument_sha256 in html and "pay INV-7" in html
    assert "invoice INV-7 matches order 91" in html and "amount &gt; 1000" in html
    assert "Deciding is for members of Approvers." in html and 'name="reason"' not in html
    partial = session("Viewers", name="vic").get("/approvals/?partial=waiting")
    assert str(waiting.pk) in partial.json()["waiting"]


def test_a_member_of_the_group_decides_with_a_reason(waiting: ApprovalRequest) -> None:
    approver = session("Approvers")
    assert 'name="reason"' in approver.get("/approvals/").content.decode()
    refused = approver.post(f"/approvals/{waiting.pk}/approve/", {"reason": ""}, follow=True)
    assert "Not decided: a decision needs a reason." in refused.content.decode()
    assert ApprovalRequest.objects.get(pk=waiting.pk).status == ApprovalStatus.PENDING
    decided = approver.post(f"/approvals/{waiting.pk}/approve/", {"reason": "matches the order"}, follow=True)
    assert "Granted: payments.transfer at step 3" in decided.content.decode()
    assert ApprovalRequest.objects.get(pk=waiting.pk).status == ApprovalStatus.GRANTED
    page = approver.get("/approvals/").content.decode()
    assert "Nothing waits for a decision." in page and "ana: approve" in page


@pytest.mark.parametrize("roles", [("Viewers",), ("Operators",), ("Reviewers",)])
def test_anyone_outside_the_group_is_told_why_and_nothing_changes(waiting: ApprovalRequest, roles: Any) -> None:
    refused = session(*roles).post(f"/approvals/{waiting.pk}/deny/", {"reason": "no"}, follow=True)
    assert "Not decided: only members of &#x27;Approvers&#x27; decide this request." in refused.content.decode()
    assert ApprovalRequest.objects.get(pk=waiting.pk).status == ApprovalStatus.PENDING
    assert not waiting.decisions.exists()


def test_someone_logged_out_is_sent_to_log_in(waiting: ApprovalRequest) -> None:
    answer = Client().post(f"/approvals/{waiting.pk}/approve/", {"reason": "x"})
    assert answer.status_code == 302 and "/login/" in answer["Location"]
    assert ApprovalRequest.objects.get(pk=waiting.pk).status == ApprovalStatus.PENDING
