"""The offline verifier and gated tool calls (its step 6): every call made under an approval is
shown with its approvers and the hashes of its events, and a call whose arguments were changed
after the approval fails, even when the insider who changed them recomputed the chain before
it was sealed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backplane.eventlog import services
from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.models import Event, Task
from backplane.integrity import sealing
from backplane.integrity.audit import export
from backplane.integrity.audit.verify import VerificationProblem, verify_event_lines
from recovery import approvals, leases, tool_calls
from recovery.errors import ApprovalPending
from tests.backplane.integrity.audit_support import rewrite_history, run_verifier
from tests.support.roles import staff_user

pytestmark = pytest.mark.django_db


def approved_payment() -> Task:
    """A payment the policy gated, approved by ana, then dispatched with the approved arguments."""
    approver = staff_user("ana", "Approvers")
    approvals.tool_policy_set(tool="pay", approver_group="Approvers", set_by="user:olivia", reason="all payments")
    agent = services.agent_create(name="payer", namespace="acme").agent
    services.task_create(namespace="acme", kind="payment", input={}, agent="planner")
    lease = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert lease is not None
    arguments = {"payee": "ACME GmbH", "amount": 5000}
    with pytest.raises(ApprovalPending) as pending:
        tool_calls.tool_call_dispatch(namespace="acme", task_id=lease.task.pk, step=2, tool="pay", input=arguments,
                                      agent="payer", lease_epoch=lease.lease_epoch)
    approvals.approval_decide(approval_id=pending.value.request.pk, user=approver, verdict="approve",
                              reason="checked")
    tool_calls.tool_call_dispatch(namespace="acme", task_id=lease.task.pk, step=2, tool="pay", input=arguments,
                                  agent="payer", lease_epoch=lease.lease_epoch)
    return lease.task


def hash_of(task: Task, event_type: str) -> str:
    return Event.objects.get(task=task, type=event_type).hash


def test_each_gated_call_is_listed_with_its_approval_and_event_hashes(audit_dir: Path, public_key: str) -> None:
    task = approved_payment()
    sealing.seal_new_events()
    export.audit_export_until_idle()
    result = run_verifier(audit_dir, public_key, args=("--approvals",))
    assert result.returncode == 0, result.stderr
    assert "1 gated tool call(s), each made after its approval and with the arguments approved" in result.stdout
    listed = next(line for line in result.stdout.splitlines() if line.startswith("gated call:"))
    assert f"task {task.pk} step 2 pay" in listed and "by user:ana" in listed
    for event_type in ("ApprovalRequested", "ApprovalGranted", "ToolCallDispatched"):
        assert hash_of(task, event_type) in listed, event_type


def exported_with_the_approved_arguments_changed() -> tuple[Task, Event]:
    """The approved payment, its dispatch's amount then raised by an insider who recomputed the
    chain before it was sealed, and exported: the task and the dispatch as first written."""
    task = approved_payment()
    dispatched = Event.objects.get(task=task, type="ToolCallDispatched")
    rewrite_history(task, seq=dispatched.seq, payload={**dispatched.payload,
                                                       "input": {"payee": "ACME GmbH", "amount": 50000}})
    sealing.seal_new_events()
    export.audit_export_until_idle()
    return task, dispatched


def test_arguments_changed_after_the_approval_fail_though_the_chain_was_recomputed(
    audit_dir: Path, public_key: str,
) -> None:
    task, dispatched = exported_with_the_approved_arguments_changed()
    result = run_verifier(audit_dir, public_key)
    assert result.returncode == 1
    assert f"task {task.pk} seq {dispatched.seq}: the tool call dispatched under approval" in result.stderr
    assert "not the approved" in result.stderr


def test_a_call_that_names_an_approval_its_chain_never_granted_fails_in_the_stream_too() -> None:
    task = approved_payment()
    granted = Event.objects.get(task=task, type="ApprovalGranted")
    rewrite_history(task, seq=granted.seq, payload={**granted.payload, "approval_id": "someone-elses"})
    lines = [event_as_api_dict(event) for event in Event.objects.filter(task=task).order_by("seq")]
    with pytest.raises(VerificationProblem, match="has no ApprovalGranted before it in its chain"):
        verify_event_lines([json.dumps(line).encode() for line in lines], source="stream")


def test_a_grant_whose_approvers_are_not_a_list_lists_nobody_rather_than_crashing() -> None:
    task = approved_payment()
    granted = Event.objects.get(task=task, type="ApprovalGranted")
    rewrite_history(task, seq=granted.seq, payload={**granted.payload, "approved_by": 5})
    lines = [event_as_api_dict(event) for event in Event.objects.filter(task=task).order_by("seq")]
    summary = verify_event_lines([json.dumps(line).encode() for line in lines], source="stream")
    assert [call.approved_by for call in summary.gated.calls] == [[]]
