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


@pytest.fixture
def awaiting_signal() -> tuple[str, str]:
    from recovery import signals

    agent = services.agent_create(name="renderer", namespace="acme").agent
    services.task_create(namespace="acme", kind="render", input={}, agent="planner")
    lease = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert lease is not None
    signals.signal_await(namespace="acme", task_id=lease.task.pk, name="render-done", timeout_seconds=3600,
                         agent="renderer", lease_epoch=lease.lease_epoch)
    return str(lease.task.pk), "render-done"


def test_tasks_waiting_for_a_signal_are_listed_and_an_operator_sends_one(awaiting_signal: tuple[str, str]) -> None:
    from backplane.eventlog.models import Event
    from recovery.models import TaskSignal

    task_id, name = awaiting_signal
    viewer = session("Viewers").get("/approvals/")
    html = viewer.content.decode()
    assert f'data-signal="{task_id}/{name}"' in html and "renderer" in html
    assert 'name="payload"' not in html and "operators send" in html
    assert f'data-signal="{task_id}/{name}"' in session("Viewers", name="vic").get(
        "/approvals/?partial=waiting").json()["signals"]

    url = f"/approvals/signals/{task_id}/{name}/"
    before = list(Event.objects.filter(task_id=task_id).values_list("seq", flat=True))
    assert session("Viewers", name="vera").post(url, {"payload": "{}"}).status_code == 403
    operator = session("Operators", name="olivia")
    for bad in ("", "[1]", "{", "x" * 20001):
        refused = operator.post(url, {"payload": bad}, follow=True)
        assert "Not sent:" in refused.content.decode(), bad
    assert list(Event.objects.filter(task_id=task_id).values_list("seq", flat=True)) == before

    sent = operator.post(url, {"payload": '{"frames": 240}'}, follow=True)
    assert f"Sent: {name} to task {task_id}." in sent.content.decode()
    signal = TaskSignal.objects.get(task_id=task_id, name=name)
    assert (signal.status, signal.payload, signal.sent_by) == ("received", {"frames": 240}, "user:olivia")
    assert f'data-signal="{task_id}/{name}"' not in sent.content.decode()
    again = operator.post(url, {"payload": '{"frames": 1}'}, follow=True)
    assert "Not sent: this signal was received already, with another payload." in again.content.decode()
