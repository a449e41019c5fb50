"""Approvals before consequential tool calls: the tool policies that ask for them (docs/approvals.md).

A tool policy says when a call of a tool needs a person's approval (its condition, checked by
recovery/approval_rules.py), how many approvals from which group, how long a request waits and
what its expiry means. Operators set policies in the admin and the API; each change is a new
version (``tool_policy_set``), and the versions before it stay as they were, so what a request
was decided under can always be read back. ``approval_verdict`` is what dispatch asks: does this
call, with these arguments, in this namespace, need approval, and under which version.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import HandOff, WritePlan, write_events_async
from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import AlreadyDecided, IdempotencyMismatch, InvalidInput, NotFound
from backplane.eventlog.models import Agent, Task, user_actor
from backplane.eventlog.writer import EventDraft, OutboxDraft, lock_task, write_events
from backplane.lib.sql_rows import row_insert_params, row_insert_sql
from recovery.approval_rules import RuleError, parse_condition
from recovery.errors import ApprovalDenied, ApprovalExpired, NotAnApprover
from recovery.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    ApprovalVerdict,
    ExpiryAction,
    ToolPolicy,
)
from recovery.selectors import tool_policy_in_force


@dataclass(frozen=True)
class PolicyVerdict:
    """What dispatch is told: ``policy`` None when no enabled policy covers the tool."""

    needed: bool
    reason: str
    policy: ToolPolicy | None


def tool_policy_set(
    *, tool: str, namespace: str = "", condition: str = "", field_types: dict[str, Any] | None = None,
    approvals_required: int = 1, approver_group: str, open_seconds: int = 3600,
    on_expiry: str = ExpiryAction.DENY, escalate_to: str | None = None, four_eyes: bool = True,
    enabled: bool = True, set_by: str, reason: str,
) -> ToolPolicy:
    """Write the next version of the policy of ``tool`` in ``namespace`` ('' for every namespace)
    and make it the current one. Everything is checked before anything is written: a condition
    that does not parse or names an undeclared field or an unknown type, a group that does not
    exist, an escalation without its group: ``InvalidInput`` naming the field, and nothing
    changes."""
    if not reason.strip():
        raise InvalidInput("a policy change needs a reason", {"reason": "required"})
    field_types = {} if field_types is None else field_types
    groups = tool_policy_check(condition=condition, field_types=field_types, approver_group=approver_group,
                               escalate_to=escalate_to, on_expiry=on_expiry)
    return _write_version(
        tool=tool, namespace=namespace, condition=condition.strip(), field_types=field_types,
        approvals_required=approvals_required, open_seconds=open_seconds, on_expiry=on_expiry,
        four_eyes=four_eyes, enabled=enabled, set_by=set_by, reason=reason, **groups,
    )


def tool_policy_check(*, condition: str, field_types: Any, approver_group: str, escalate_to: str | None,
                      on_expiry: str) -> dict[str, Group | None]:
    """The checks of ``tool_policy_set`` that need no lock (the admin's form runs them to show
    each refusal beside its field): ``InvalidInput`` with the field's reason; else the groups."""
    try:
        parse_condition(condition, field_types)
    except RuleError as exc:
        raise InvalidInput(f"the condition is refused: {exc}", {"condition": str(exc)}) from None
    found = {group.name: group for group in Group.objects.filter(name__in=[approver_group, escalate_to or ""])}
    if approver_group not in found:
        raise InvalidInput(f"no group named {approver_group!r}", {"approver_group": "no such group"})
    if on_expiry == ExpiryAction.ESCALATE:
        if not escalate_to:
            raise InvalidInput("an escalating policy names the group it escalates to", {"escalate_to": "required"})
        if escalate_to not in found:
            raise InvalidInput(f"no group named {escalate_to!r}", {"escalate_to": "no such group"})
    elif escalate_to:
        raise InvalidInput("only a policy whose expiry escalates names a group to escalate to",
                           {"escalate_to": "only with on_expiry escalate"})
    return {"approver_group": found[approver_group], "escalate_to": found.get(escalate_to or "")}


def _write_version(*, tool: str, namespace: str, approver_group: Group | None, escalate_to: Group | None,
                   **values: Any) -> ToolPolicy:
    with transaction.atomic(durable=True):
        # Saves of one policy take turns on a lock of its (tool, namespace), held to the commit.
        # Locking the current version's row would not do: there is none before the first save,
        # and a save waiting on it would find it no longer current once the lock is granted.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                           [json.dumps(["recovery.toolpolicy", tool, namespace])])
        current = ToolPolicy.objects.filter(tool=tool, namespace=namespace, is_current=True).first()
        policy = ToolPolicy(tool=tool, namespace=namespace, version=(current.version + 1) if current else 1,
                            approver_group=approver_group, escalate_to=escalate_to, created_at=timezone.now(),
                            **values)
        try:
            policy.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as exc:
            raise InvalidInput("invalid tool policy", {field: " ".join(messages)
                                                       for field, messages in exc.message_dict.items()}) from None
        if current is not None:
            current.is_current = False
            current.save(update_fields=["is_current"])
        policy.save(force_insert=True)
    return policy


def approval_verdict(*, tool: str, namespace: str, arguments: Any) -> PolicyVerdict:
    """Whether a call of ``tool`` by an agent of ``namespace`` with ``arguments`` needs approval,
    by the policy in force (the namespace's, else the global one), and why."""
    policy = tool_policy_in_force(tool=tool, namespace=namespace)
    if policy is None or not policy.enabled:
        return PolicyVerdict(False, "no approval policy covers this tool", None)
    needed, reason = condition_asks(condition=policy.condition, field_types=policy.field_types, arguments=arguments)
    return PolicyVerdict(needed, reason, policy)


def condition_asks(*, condition: str, field_types: Any, arguments: Any) -> tuple[bool, str]:
    """Whether an enabled policy's condition asks for approval of a call with ``arguments``, and
    why; what both dispatch paths decide by."""
    # Saved conditions were checked when saved; a stored one that no longer parses (edited in
    # the database by hand) asks for approval rather than letting calls through.
    try:
        parsed = parse_condition(condition, field_types)
    except RuleError as exc:
        return True, f"the policy's condition is refused ({exc}), so approval is asked for"
    verdict = parsed.needs_approval(arguments)
    return verdict.needed, verdict.reason


# --- requests: what a gated dispatch writes, and people's decisions --------------------------------

TOPIC = "backplane.approvals"


def approval_gate(task: Task, *, key: str, step: int, tool: str, input: dict[str, Any], reason: str,
                  agent: str | None, now: datetime) -> ApprovalRequest | None:
    """Within a dispatch's transaction, its task locked: None when no policy asks for approval of
    the call; else its request, granted (for these very arguments: the call may be dispatched
    now) or pending, found (a retry, a recovered agent) or written now with its
    ``ApprovalRequested`` event. A denied or expired request, or one for other arguments, is
    refused here, before anything is written."""
    request = ApprovalRequest.objects.select_for_update().filter(idempotency_key=key).first()
    if request is not None:
        if request.argument_sha256 != canonical_sha256(input):
            raise IdempotencyMismatch(
                "this step and tool were submitted for approval with other arguments; a new approval needs a new "
                "step", {"idempotency_key": key, "approval_id": str(request.pk),
                         "argument_sha256": request.argument_sha256})
        if request.status == ApprovalStatus.DENIED:
            raise ApprovalDenied("people denied this call", _refusal_details(request))
        if request.status == ApprovalStatus.EXPIRED:
            raise ApprovalExpired("the approval request ran out undecided", _refusal_details(request))
        return request
    verdict = approval_verdict(tool=tool, namespace=task.namespace, arguments=input)
    if not verdict.needed or verdict.policy is None:
        return None
    request = _new_request(task, key=key, step=step, tool=tool, input=input, reason=reason, agent=agent, now=now,
                           policy=verdict.policy, group=verdict.policy.approver_group)
    with connection.cursor() as cursor:
        cursor.execute(row_insert_sql(ApprovalRequest), row_insert_params(request))
    write_events(task, [_requested(request, asked_because=verdict.reason)], agent=agent, now=now)
    return request


# Under the task's row lock (every writer of a call or a request takes it first, so what is read
# here holds until the dispatch commits): whether the call was made already, its request, and the
# policy in force for it (the namespace's current version, else the global one:
# selectors.tool_policy_in_force's rule) with the group it asks.
GATE_READ_SQL = """
SELECT EXISTS (SELECT 1 FROM recovery_toolcall WHERE idempotency_key = %s),
       request.id, request.status, request.argument_sha256,
       policy.id, policy.version, policy.enabled, policy.condition, policy.field_types::text,
       policy.approvals_required, policy.open_seconds, asked.id, asked.name
FROM (SELECT 1) AS one
LEFT JOIN recovery_approvalrequest AS request ON request.idempotency_key = %s
LEFT JOIN LATERAL (SELECT * FROM recovery_toolpolicy WHERE tool = %s AND namespace IN (%s, '') AND is_current
                   ORDER BY namespace DESC LIMIT 1) AS policy ON true
LEFT JOIN auth_group AS asked ON asked.id = policy.approver_group_id
"""


async def approval_gate_async(conn: psycopg.AsyncConnection[Any], task: Task, *, key: str, step: int, tool: str,
                              input: dict[str, Any], reason: str, agent: str | None,
                              now: datetime) -> tuple[ApprovalRequest | None, WritePlan | None]:
    """``approval_gate`` on the event loop's connection, in the dispatch's transaction: the same
    read, verdict, statement and event. ``(None, None)`` when no policy asks; a request granted
    for these very arguments (the call is made under it); or the request written now, pending,
    with the plan of its ``ApprovalRequested``. ``HandOff`` for what the service answers from what
    it reads: a call made already, a request pending (asked again), refused, or for other arguments."""
    row = await (await conn.execute(GATE_READ_SQL, [key, key, tool, task.namespace])).fetchone()
    assert row is not None  # FROM (SELECT 1): always one row
    (made, request_id, status, asked_digest, policy_id, version, enabled, condition, field_types, required,
     open_seconds, group_id, group_name) = row
    if made:
        raise HandOff  # the service's replay, or its 422 for other arguments
    if request_id is not None:
        if status != ApprovalStatus.GRANTED or asked_digest != canonical_sha256(input):
            raise HandOff
        return ApprovalRequest(pk=request_id, idempotency_key=key, status=status, argument_sha256=asked_digest), None
    if policy_id is None or not enabled:
        return None, None
    needed, asked_because = condition_asks(condition=condition, field_types=json.loads(field_types), arguments=input)
    if not needed:
        return None, None
    policy = ToolPolicy(pk=policy_id, version=version, approvals_required=required, open_seconds=open_seconds)
    request = _new_request(task, key=key, step=step, tool=tool, input=input, reason=reason, agent=agent, now=now,
                           policy=policy, group=Group(pk=group_id, name=group_name))
    await conn.execute(row_insert_sql(ApprovalRequest), row_insert_params(request))
    plan = await write_events_async(conn, task, [_requested(request, asked_because=asked_because)], agent=agent,
                                    now=now)
    return request, plan


def _new_request(task: Task, *, key: str, step: int, tool: str, input: dict[str, Any], reason: str,
                 agent: str | None, now: datetime, policy: ToolPolicy, group: Group) -> ApprovalRequest:
    """The request a gated call writes, bound to its arguments' canonical hash."""
    return ApprovalRequest(idempotency_key=key, task=task, step=step, tool=tool, input=input,
                           argument_sha256=canonical_sha256(input),
                           reason=reason, requested_by=agent or "", requested_at=now, policy=policy, group=group,
                           expires_at=now + timedelta(seconds=policy.open_seconds))


def _requested(request: ApprovalRequest, *, asked_because: str) -> EventDraft:
    return _draft(et.APPROVAL_REQUESTED, {
        **_request_facts(request), "reason": request.reason, "asked_because": asked_because,
        "approvals_required": request.policy.approvals_required, "group": request.group.name,
        "expires_at": format_timestamp(request.expires_at)})



def approval_awaited(task: Task, *, key: str, tool: str, input: dict[str, Any]) -> bool:
    """Whether a call would wait for people now: its request is pending (or refused), or no
    request exists and a policy in force asks for one. Read without locks, for the gateway to
    spend no rate-limit slot or breaker trial on a call that will not go out; the dispatch decides
    again under the task's lock."""
    status = ApprovalRequest.objects.filter(idempotency_key=key).values_list("status", flat=True).first()
    if status is not None:
        return status != ApprovalStatus.GRANTED
    return approval_verdict(tool=tool, namespace=task.namespace, arguments=input).needed


def approval_decide(*, approval_id: uuid.UUID, user: Any, verdict: str, reason: str,
                    namespace: str | None = None) -> ApprovalRequest:
    """One person's decision. A member of the group asked now decides a pending request once;
    a denial ends it, and the approvals its policy requires grant it. Each end writes its event
    into the task's chain (who, why, the argument hash, the policy version) with a message on
    ``backplane.approvals``. ``namespace``: a staff user scoped to one sees only its requests."""
    if not reason.strip():
        raise InvalidInput("a decision needs a reason", {"reason": "required"})
    if verdict not in ApprovalVerdict.values:
        raise InvalidInput("approve or deny", {"verdict": f"one of {', '.join(ApprovalVerdict.values)}"})
    found = ApprovalRequest.objects.filter(pk=approval_id).values_list("task_id", flat=True).first()
    if found is None:
        raise NotFound("approval request not found", {"approval_id": str(approval_id)})
    now = timezone.now()
    with transaction.atomic(durable=True):
        # The task first, then the request: the order a dispatch takes them in.
        task = lock_task(namespace=namespace, task_id=found)
        request = (ApprovalRequest.objects.select_for_update(of=("self",)).select_related("policy", "group")
                   .get(pk=approval_id))
        if request.status != ApprovalStatus.PENDING:
            raise AlreadyDecided(f"the request is {request.status} already", _refusal_details(request))
        if request.expires_at <= now:
            raise AlreadyDecided("the request ran out before this decision; it is being expired",
                                 {"approval_id": str(request.pk), "expires_at": format_timestamp(request.expires_at)})
        if not user.groups.filter(pk=request.group_id).exists():
            raise NotAnApprover(f"only members of {request.group.name!r} decide this request",
                                    {"group": request.group.name})
        if request.policy.four_eyes and _agent_is_bound_to(task, request.requested_by, user):
            raise NotAnApprover("four eyes: a person does not approve a request of an agent acting for them",
                                    {"requested_by": request.requested_by})
        if request.decisions.filter(user=user).exists():
            raise AlreadyDecided("you decided this request already", {"approval_id": str(request.pk)})
        decided_by = user_actor(user)
        ApprovalDecision.objects.create(request=request, user=user, decided_by=decided_by, verdict=verdict,
                                        reason=reason, at=now)
        approvals = list(request.decisions.filter(verdict=ApprovalVerdict.APPROVE).order_by("at", "pk"))
        if verdict == ApprovalVerdict.DENY:
            request.status = ApprovalStatus.DENIED
            event = _draft(et.APPROVAL_DENIED, {**_request_facts(request), "denied_by": decided_by, "reason": reason,
                                                "approved_by": [_decision_facts(d) for d in approvals]})
        elif len(approvals) >= request.policy.approvals_required:
            request.status = ApprovalStatus.GRANTED
            event = _draft(et.APPROVAL_GRANTED, {**_request_facts(request),
                                                 "approved_by": [_decision_facts(d) for d in approvals]})
        else:
            return request  # more approvals to come; the decision is recorded
        request.decided_at = now
        request.save(update_fields=["status", "decided_at"])
        write_events(task, [event], agent=None, now=now, allow_closed=True)
    return request


def approvals_expire(*, now: datetime | None = None, batch_size: int = 200) -> int:
    """Pending requests past their time (a beat duty): escalated to the policy's other group for
    another wait when the policy says so and they were not escalated yet, else expired, which
    denies the call. Returns how many were handled."""
    now = now or timezone.now()
    due = list(ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
               .order_by("expires_at").values_list("pk", "task_id")[:batch_size])
    handled = 0
    for approval_id, task_id in due:
        with transaction.atomic(durable=True):
            task = lock_task(namespace=None, task_id=task_id)
            request = (ApprovalRequest.objects.select_for_update(of=("self",))
                       .select_related("policy", "policy__escalate_to")
                       .filter(pk=approval_id, status=ApprovalStatus.PENDING, expires_at__lte=now).first())
            if request is None:
                continue  # decided meanwhile
            policy = request.policy
            if policy.on_expiry == ExpiryAction.ESCALATE and not request.escalated and policy.escalate_to:
                request.escalated, request.group = True, policy.escalate_to
                request.expires_at = now + timedelta(seconds=policy.open_seconds)
                request.save(update_fields=["escalated", "group", "expires_at"])
                event = _draft(et.APPROVAL_ESCALATED, {**_request_facts(request), "group": policy.escalate_to.name,
                                                       "expires_at": format_timestamp(request.expires_at)})
            else:
                request.status, request.decided_at = ApprovalStatus.EXPIRED, now
                request.save(update_fields=["status", "decided_at"])
                event = _draft(et.APPROVAL_EXPIRED, {**_request_facts(request), "outcome": "denied"})
            write_events(task, [event], agent=None, now=now, allow_closed=True)
            handled += 1
    return handled


def _agent_is_bound_to(task: Task, agent_name: str, user: Any) -> bool:
    return Agent.objects.filter(namespace=task.namespace, name=agent_name, user_id=user.pk).exists()


def _request_facts(request: ApprovalRequest) -> dict[str, Any]:
    """What every approval event says of its request: the call, its arguments' hash, the policy version."""
    return {"approval_id": str(request.pk), "idempotency_key": request.idempotency_key, "step": request.step,
            "tool": request.tool, "argument_sha256": request.argument_sha256, "policy_id": request.policy_id,
            "policy_version": request.policy.version, "requested_at": format_timestamp(request.requested_at)}


def _decision_facts(decision: ApprovalDecision) -> dict[str, Any]:
    return {"by": decision.decided_by, "reason": decision.reason, "at": format_timestamp(decision.at)}


def _refusal_details(request: ApprovalRequest) -> dict[str, Any]:
    details = {"approval_id": str(request.pk), "status": request.status}
    denial = request.decisions.filter(verdict=ApprovalVerdict.DENY).first()
    if denial is not None:
        details |= {"denied_by": denial.decided_by, "reason": denial.reason}
    return details


def _draft(event_type: str, payload: dict[str, Any]) -> EventDraft:
    return EventDraft(type=event_type, payload=payload,
                      outbox=(OutboxDraft(topic=TOPIC, payload={"type": event_type, **payload}),))
