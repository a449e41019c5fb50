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
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from backplane.eventlog.errors import InvalidInput
from recovery.approval_rules import RuleError, parse_condition
from recovery.models import ExpiryAction, ToolPolicy
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
    # Saved conditions were checked when saved; a stored one that no longer parses (edited in
    # the database by hand) asks for approval rather than letting calls through.
    try:
        condition = parse_condition(policy.condition, policy.field_types)
    except RuleError as exc:
        return PolicyVerdict(True, f"the policy's condition is refused ({exc}), so approval is asked for", policy)
    verdict = condition.needs_approval(arguments)
    return PolicyVerdict(verdict.needed, verdict.reason, policy)
