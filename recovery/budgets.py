"""Budgets: what a namespace, an agent or a task tree may spend on model calls, and the stop.

Spend is read from the cost rollups (backplane/eventlog/costs.py), which the writer keeps equal
to the sum of the events. A budget is checked where work starts and where spending is recorded:

1. ``budget_gate`` before a lease is granted, a tool call dispatched or a model call recorded:
   a scope whose budget is spent for the current period is refused (``409 budget_exceeded``,
   with the budget and the spend), and nothing is written;
2. ``budget_note_spending`` after each model call is recorded, in the same transaction (a
   writer follow-up): crossing 80 % and 95 % writes a ``BudgetWarning``, reaching 100 % a
   ``BudgetExceeded``, each into the log of the task whose call crossed, with an outbox message
   (topic ``backplane.budgets``) so a webhook can page someone. A conditional UPDATE of the
   budget's ``*_on`` date makes each crossing happen once a period, however many calls race it.

Usage is known only once a call returns, so a scope can overshoot. The records of a budgeted
scope are serialized on its budget rows, so the recorded spend passes the limit by at most the
one call that reached it. A model call already made when the stop came is refused its record
(that is what stops an agent looping on its model), so the provider's bill can pass the limit by
the calls in flight then: at most one per agent working in the scope (docs/costs.md).

People raise or lower a limit (``budget_set``) or let a spent scope go on for the rest of its
period (``budget_resume``); each decision is a ``BudgetDecision``. A budget that asks
(``at_limit = ask``) puts the question to its group when the limit is reached, in the same
transaction as the ``BudgetExceeded``: a ``BudgetAsk``, which a member approves (the scope is
resumed for the period) or denies (it stays stopped) with ``budget_ask_decide``; until then the
scope's work is refused as any spent scope's, the refusal naming the question. What a budget has spent and
whether it stops work are read in recovery/selectors.py (``budgets_spend``, ``budget_list``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.async_services import HandOff
from backplane.eventlog.costs import TASK_ROOT_SQL, costs_something, task_root_id
from backplane.eventlog.errors import AlreadyDecided, InvalidInput, NotFound
from backplane.eventlog.models import Task, user_actor
from backplane.eventlog.writer import EventDraft, OutboxDraft, WrittenEvents, write_events
from backplane.lib.sql_rows import RowLoader
from recovery.errors import BudgetExceeded, NotAnApprover
from recovery.models import (
    ApprovalStatus,
    ApprovalVerdict,
    Budget,
    BudgetAsk,
    BudgetAtLimit,
    BudgetDecision,
    BudgetPeriod,
    BudgetScope,
    BudgetUnit,
)
from recovery.selectors import budget_spend, budgets_spend, is_spent, period_of

TOPIC = "backplane.budgets"
THRESHOLDS = ((Decimal("0.8"), "warned_80_on"), (Decimal("0.95"), "warned_95_on"), (Decimal(1), "exceeded_on"))


# On the path of every model call's record: SQL written once, as the writer's statements are (the
# queryset API compiles a statement in more Python than its round trip takes).
BUDGET_ROWS = RowLoader(Budget)
_BUDGETS_OF_SQL = f"""
SELECT {BUDGET_ROWS.columns} FROM recovery_budget
WHERE (scope = '{BudgetScope.NAMESPACE.value}' AND key = %s) OR (scope = '{BudgetScope.AGENT.value}' AND key = %s)
   OR (scope = '{BudgetScope.TASK.value}' AND key = %s)
ORDER BY id
"""
_LOCK_BUDGETS_OF_SQL = _BUDGETS_OF_SQL + " FOR UPDATE"


def budgets_of(*, namespace: str, agent: str | None, root_id: uuid.UUID | None, lock: bool = False) -> list[Budget]:
    """The budgets that apply to work of this namespace, agent and task tree; ``lock``: locked
    for the rest of the transaction, in id order."""
    return BUDGET_ROWS.fetch_all(_LOCK_BUDGETS_OF_SQL if lock else _BUDGETS_OF_SQL,
                                 _budgets_of_params(namespace=namespace, agent=agent, root_id=root_id))


def _budgets_of_params(*, namespace: str, agent: str | None, root_id: uuid.UUID | None) -> list[Any]:
    return [namespace, f"{namespace}/{agent}" if agent else None, str(root_id) if root_id else None]


async def budget_gate_async(conn: psycopg.AsyncConnection[Any], *, namespace: str, agent: str | None, task: Task,
                            now: datetime) -> None:
    """``budget_gate`` of work on ``task`` on an async connection (the HTTP front's): the same
    statements; ``HandOff`` when a budget is spent, whose 409 the sync service gives (it reads
    the spend)."""
    root_id = task.pk
    if task.parent_id is not None:
        root = await (await conn.execute(TASK_ROOT_SQL, [task.pk])).fetchone()
        assert root is not None  # every tree has its root: a parent is never deleted before its children
        root_id = root[0]
    rows = await (await conn.execute(_BUDGETS_OF_SQL, _budgets_of_params(namespace=namespace, agent=agent,
                                                                         root_id=root_id))).fetchall()
    if any(is_spent(BUDGET_ROWS.load(row), now=now) for row in rows):
        raise HandOff


def _refusal(budget: Budget, *, now: datetime, less: Decimal = Decimal(0)) -> BudgetExceeded:
    spend = budget_spend(budget, now=now) - less
    unit = budget.currency if budget.unit == BudgetUnit.CURRENCY else "tokens"
    details: dict[str, Any] = {
        "budget_id": budget.pk, "scope": budget.scope, "key": budget.key, "period": budget.period,
        "unit": budget.unit, "currency": budget.currency or None, "limit": str(budget.limit), "spend": str(spend)}
    if budget.at_limit == BudgetAtLimit.ASK:
        ask = BudgetAsk.objects.filter(budget=budget, period_day=period_of(budget, now)).select_related("group").first()
        if ask is not None:
            # A waiting agent may try again once the group has said yes.
            details["ask"] = {"ask_id": ask.pk, "status": ask.status, "group": ask.group.name}
    return BudgetExceeded(
        f"the {budget.scope} budget of {budget.key} is spent: {spend} of {budget.limit} {unit} "
        f"{'today' if budget.period == BudgetPeriod.DAY else 'for this task'}", details)


def budget_gate(*, namespace: str, agent: str | None, task: Task, now: datetime) -> None:
    """Refuse work on ``task`` of a scope whose budget is spent (``409 budget_exceeded``). One
    query when no budget applies (two for a sub-task: its tree's root). A claim, which has no task
    yet, reads its budgets with ``claim_budgets``."""
    for budget in budgets_of(namespace=namespace, agent=agent, root_id=task_root_id(task)):
        if is_spent(budget, now=now):
            raise _refusal(budget, now=now)


def spends(written: WrittenEvents) -> bool:
    """Whether ``budget_note_spending`` concerns a write: something in it costs, outside a sandbox."""
    return not written.task.sandbox and any(costs_something(event) for event in written.events)


async def budgets_idle_async(conn: psycopg.AsyncConnection[Any], written: WrittenEvents) -> bool:
    """Whether ``budget_note_spending`` has nothing to do for the write: no budget applies to its
    scope (``budgets_of``'s statement on the event loop's connection). A sub-task's spending is
    the sync service's: its tree's root, the key of a tree's budget and rollup, is read there."""
    task = written.task
    if task.parent_id is not None:
        return False
    agent = next(event.agent for event in written.events if costs_something(event))
    applying = await conn.execute(_BUDGETS_OF_SQL, _budgets_of_params(namespace=task.namespace, agent=agent,
                                                                     root_id=task.pk))
    return await applying.fetchone() is None


def budget_note_spending(written: WrittenEvents) -> None:
    """Writer follow-up: a model call of a budgeted scope refused when the scope is spent, else
    recorded, and any line its spending crossed written into the task's log, once a period.

    The scope's budgets are locked (in id order) before the spend is read: the model calls of a
    budgeted scope are recorded one after another, each seeing every earlier one, so the call
    that reaches the limit is the last one recorded and the next is refused."""
    spending = [event for event in written.events if costs_something(event)]
    task = written.task
    now = written.now
    locked = budgets_of(namespace=task.namespace, agent=spending[0].agent, root_id=task_root_id(task), lock=True)
    if not locked:
        return
    model_calls = [event for event in spending if event.type == et.LLM_CALLED]
    for budget in locked:
        # A paid tool's answer is never refused: the tool acted, and its answer must be kept.
        if model_calls and is_spent(budget, now=now):
            # Rolls the record back: nothing is written. The spend shown is without this write.
            raise _refusal(budget, now=now, less=_spent_by(spending, budget))
    drafts = []
    for budget, spend in zip(locked, budgets_spend(locked, now=now), strict=True):
        period = period_of(budget, now)
        for share, field in THRESHOLDS:
            if spend < budget.limit * share:
                break
            if getattr(budget, field) != period:
                setattr(budget, field, period)
                budget.save(update_fields=[field, "updated_at"])
                ask = _ask(budget, period=period, spend=spend, task=task, now=now) if share >= 1 else None
                drafts.append(_crossing(budget, share=share, spend=spend, ask=ask))
    if drafts:
        write_events(task, drafts, agent=None, now=now, allow_closed=True)


def _spent_by(calls: list[Any], budget: Budget) -> Decimal:
    """What these events add to the budget's spend, in its unit."""
    total = Decimal(0)
    for call in calls:
        if budget.unit == BudgetUnit.TOKENS:
            usage = call.payload.get("usage") or {}
            total += usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
        elif (call.payload.get("cost") or {}).get("currency") == budget.currency:
            total += Decimal(call.payload["cost"]["amount"])
    return total


def _ask(budget: Budget, *, period: date, spend: Decimal, task: Task, now: datetime) -> BudgetAsk | None:
    """The question a budget that asks puts to its group on reaching its limit, once a period."""
    if budget.at_limit != BudgetAtLimit.ASK or budget.ask_group_id is None:
        return None
    ask, _ = BudgetAsk.objects.get_or_create(budget=budget, period_day=period, defaults={
        "group_id": budget.ask_group_id, "spend": spend, "crossed_by_task_id": task.pk, "asked_at": now})
    return ask


def _crossing(budget: Budget, *, share: Decimal, spend: Decimal, ask: BudgetAsk | None = None) -> EventDraft:
    payload: dict[str, Any] = {
        "budget_id": budget.pk, "scope": budget.scope, "key": budget.key, "period": budget.period,
        "unit": budget.unit, "currency": budget.currency or None, "limit": str(budget.limit),
        "spend": str(spend), "threshold": f"{int(share * 100)}%",
    }
    if ask is not None:
        payload["asks"] = {"ask_id": ask.pk, "group": ask.group.name}
    kind = et.BUDGET_EXCEEDED if share >= 1 else et.BUDGET_WARNING
    return EventDraft(type=kind, payload=payload,
                      outbox=(OutboxDraft(topic=TOPIC, payload={"event": kind, **payload}, key=f"budget:{budget.pk}"),))


# --- people's decisions ----------------------------------------------------------------------


def budget_set(
    *, scope: str, key: str, period: str, unit: str, limit: Decimal, currency: str = "", decided_by: str,
    reason: str, at_limit: str = BudgetAtLimit.STOP, ask_group: str | None = None,
) -> Budget:
    """Set (create, raise or lower) a budget. A limit the spend has reached stops the scope now;
    one raised above the spend lets it go on (the crossings of the period start afresh).
    ``at_limit = ask`` makes it ask ``ask_group`` (a group's name) whether to go on at the limit."""
    if not reason.strip():
        raise InvalidInput("a budget decision needs a reason", {"reason": "required"})
    group = None
    if at_limit == BudgetAtLimit.ASK:
        group = Group.objects.filter(name=ask_group or "").first()
        if group is None:
            raise InvalidInput("a budget that asks names an existing group to ask",
                               {"ask_group": "no such group" if ask_group else "required with at_limit ask"})
    elif at_limit != BudgetAtLimit.STOP:
        raise InvalidInput("at_limit is stop or ask", {"at_limit": "one of stop, ask"})
    elif ask_group:
        raise InvalidInput("only a budget that asks names a group", {"ask_group": "only with at_limit ask"})
    # is_finite first: ordering a NaN raises InvalidOperation (a 500), and an infinite limit is none.
    if not limit.is_finite() or limit <= 0:
        raise InvalidInput("the limit must be positive", {"limit": "greater than 0"})
    now = timezone.now()
    with transaction.atomic(durable=True):
        budget = Budget.objects.select_for_update().filter(scope=scope, key=key, period=period, unit=unit).first()
        old = budget.limit if budget else None
        if budget is None:
            budget = Budget(scope=scope, key=key, period=period, unit=unit, currency=currency, limit=limit)
        budget.limit, budget.at_limit, budget.ask_group = limit, at_limit, group
        try:
            budget.full_clean(validate_unique=False)
        except Exception as exc:  # noqa: BLE001 - a ValidationError: the contract's 400
            raise InvalidInput("invalid budget", {"budget": str(exc)}) from None
        spend = budget_spend(budget, now=now)
        period_day = period_of(budget, now)
        # The crossings follow the new limit: those it is now below can happen again.
        for share, field in THRESHOLDS:
            reached = spend >= limit * share
            setattr(budget, field, period_day if reached else None)
        budget.save()
        BudgetDecision.objects.create(budget=budget, action="set", old_limit=old, new_limit=limit, spend=spend,
                                      decided_by=decided_by, reason=reason, at=now)
    return budget


def budget_resume(*, budget_id: int, decided_by: str, reason: str) -> Budget:
    """Let a spent scope go on for the rest of its period, its limit unchanged."""
    if not reason.strip():
        raise InvalidInput("a budget decision needs a reason", {"reason": "required"})
    now = timezone.now()
    with transaction.atomic(durable=True):
        budget = Budget.objects.select_for_update().filter(pk=budget_id).first()
        if budget is None:
            raise NotFound("budget not found", {"budget_id": budget_id})
        budget.resumed_on = period_of(budget, now)
        budget.save(update_fields=["resumed_on", "updated_at"])
        BudgetDecision.objects.create(budget=budget, action="resume", old_limit=budget.limit,
                                      new_limit=budget.limit, spend=budget_spend(budget, now=now),
                                      decided_by=decided_by, reason=reason, at=now)
    return budget


# What a claim answers to, in one read on either driver (recovery/leases.py): the namespace's
# and the agent's budgets (a spent one refuses the claim) and every task tree's that has been
# exceeded once (a spent one's tree is passed over).
CLAIM_BUDGETS_SQL = f"""
SELECT {BUDGET_ROWS.columns} FROM recovery_budget
WHERE (scope = '{BudgetScope.NAMESPACE.value}' AND key = %s) OR (scope = '{BudgetScope.AGENT.value}' AND key = %s)
   OR (scope = '{BudgetScope.TASK.value}' AND exceeded_on IS NOT NULL)
ORDER BY id
"""


@dataclass(frozen=True)
class ClaimBudgets:
    """``CLAIM_BUDGETS_SQL``'s rows as a claim takes them: a spent budget of the namespace or
    the agent (the claim is refused: ``budget_refusal``), and the roots whose tree is passed over."""

    spent: Budget | None
    blocked_roots: list[uuid.UUID]


def claim_budgets_params(*, namespace: str, agent: str) -> list[Any]:
    return [namespace, f"{namespace}/{agent}"]


def claim_budgets_of(rows: list[Budget], *, now: datetime) -> ClaimBudgets:
    spent = [budget for budget in rows if is_spent(budget, now=now)]
    return ClaimBudgets(spent=next((b for b in spent if b.scope != BudgetScope.TASK), None),
                        blocked_roots=[uuid.UUID(b.key) for b in spent if b.scope == BudgetScope.TASK])


def claim_budgets(*, namespace: str, agent: str, now: datetime) -> ClaimBudgets:
    return claim_budgets_of(BUDGET_ROWS.fetch_all(CLAIM_BUDGETS_SQL, claim_budgets_params(namespace=namespace,
                                                                                             agent=agent)), now=now)


def budget_refusal(budget: Budget, *, now: datetime) -> BudgetExceeded:
    """The 409 of work a spent ``budget`` stops, with what its scope has spent."""
    return _refusal(budget, now=now)


def budget_ask_decide(*, budget_id: int, user: Any, verdict: str, reason: str) -> BudgetAsk:
    """A member of the group a spent budget asks decides, with a reason: approve resumes the
    scope for the rest of the period (a ``resume`` decision), deny leaves it stopped (a
    ``refuse`` decision). Once: a decided question is ``409 already_decided``."""
    if not reason.strip():
        raise InvalidInput("a decision needs a reason", {"reason": "required"})
    if verdict not in ApprovalVerdict.values:
        raise InvalidInput("approve or deny", {"verdict": "one of approve, deny"})
    now = timezone.now()
    with transaction.atomic(durable=True):
        budget = Budget.objects.select_for_update().filter(pk=budget_id).first()
        if budget is None:
            raise NotFound("budget not found", {"budget_id": budget_id})
        period = period_of(budget, now)
        ask = (BudgetAsk.objects.select_for_update(of=("self",)).select_related("group")
               .filter(budget=budget, period_day=period).first())
        if ask is None:
            raise NotFound("this budget asks nothing this period", {"budget_id": budget_id})
        if ask.status != ApprovalStatus.PENDING:
            raise AlreadyDecided(f"the question was {ask.status} already", {"decided_by": ask.decided_by})
        if not user.groups.filter(pk=ask.group_id).exists():
            raise NotAnApprover(f"only members of {ask.group.name!r} answer this budget's question",
                                {"group": ask.group.name})
        decided_by = user_actor(user)
        spend = budget_spend(budget, now=now)
        if verdict == ApprovalVerdict.APPROVE:
            ask.status, budget.resumed_on = ApprovalStatus.GRANTED, period
            budget.save(update_fields=["resumed_on", "updated_at"])
        else:
            ask.status = ApprovalStatus.DENIED
        ask.decided_by, ask.decided_at, ask.reason = decided_by, now, reason
        ask.save(update_fields=["status", "decided_by", "decided_at", "reason"])
        BudgetDecision.objects.create(budget=budget, action="resume" if verdict == ApprovalVerdict.APPROVE
                                      else "refuse", old_limit=budget.limit, new_limit=budget.limit, spend=spend,
                                      decided_by=decided_by, reason=reason, at=now)
    return ask
