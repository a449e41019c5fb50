"""Reads for recovery: tool-call records, the recovery context rebuilt from the log, the fleet,
bulk jobs, budgets and their spend, pauses, saved searches and alerts, tool policies."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Sum, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.lineage import history_of
from backplane.eventlog.models import ALL_TIME, Agent, BreakerTransition, CostRollup, Task, TaskStatus
from backplane.eventlog.selectors import TaskFilters, task_filters_from_json, task_visible, tasks_filtered
from backplane.lib.sql_rows import RowLoader
from backplane.privacy.services import personal_open, personal_shown
from recovery.models import (
    AlertRule,
    AlertState,
    AlertTransition,
    ApprovalRequest,
    Budget,
    BudgetAsk,
    BudgetAtLimit,
    BudgetDecision,
    BudgetPeriod,
    BudgetScope,
    BudgetUnit,
    BulkItemStatus,
    BulkJob,
    BulkJobItem,
    Pause,
    SavedSearch,
    StaffScope,
    Tool,
    ToolCall,
    ToolPolicy,
)

TOOL_CALL_ROWS = RowLoader(ToolCall)
# A tool call of a task of the namespace (any, for staff: None), on either driver (the HTTP front
# reads it on the event loop, api/agent_front.py); ``tool_call_from`` makes its row the answer.
TOOL_CALL_VISIBLE_SQL = (
    f"SELECT {TOOL_CALL_ROWS.columns} FROM recovery_toolcall JOIN backplane_task ON backplane_task.id = "
    "recovery_toolcall.task_id WHERE recovery_toolcall.idempotency_key = %(key)s "
    "AND (%(namespace)s::text IS NULL OR backplane_task.namespace = %(namespace)s)"
)


def tool_call_visible(*, namespace: str | None, key: str) -> ToolCall:
    with connection.cursor() as cursor:
        cursor.execute(TOOL_CALL_VISIBLE_SQL, {"key": key, "namespace": namespace})
        return tool_call_from(cursor.fetchone(), key=key)


def tool_call_from(row: Any, *, key: str) -> ToolCall:
    if row is None:
        raise NotFound("tool call not found", {"idempotency_key": key})
    return TOOL_CALL_ROWS.load(row)


def recovery_context(*, namespace: str | None, task_id: uuid.UUID, personal_opened: bool = False,
                     reader: str | None = None) -> dict[str, Any]:
    """Replay the task's history into what a new holder needs to continue without redoing work.

    Personal values (backplane/privacy): ``personal_opened`` for the agents of the namespace, who
    resume the work with them (``reader``: the person a token acts for, whose read is recorded);
    for anyone else they stay sealed. Either way a value whose subject
    was erased shows as erased, and the rest of the context is whole.

    Only the event log is read (not the tool-call records, which expire), so the answer
    is the same for as long as the log exists. A fork's history includes its source's events
    up to the fork point (``backplane.eventlog.lineage``): they are confirmed history, and
    each entry names the task whose log holds it (``task_id``).
    """
    task = task_visible(namespace=namespace, task_id=task_id)
    calls: dict[str, dict[str, Any]] = {}
    subtasks: dict[str, dict[str, Any]] = {}
    completed_steps: list[dict[str, Any]] = []
    model_calls: list[dict[str, Any]] = []
    last_reasoning: dict[str, Any] | None = None

    for event in history_of(task):
        payload = event.payload
        origin = str(event.task_id)
        if event.type == et.REASONING_STEP_COMPLETED:
            entry = {"seq": event.seq, "task_id": origin, "step": payload.get("step"), "payload": payload}
            completed_steps.append(entry)
            last_reasoning = entry
        elif event.type == et.TOOL_CALL_DISPATCHED:
            calls[payload["idempotency_key"]] = {
                "idempotency_key": payload["idempotency_key"],
                "task_id": origin,
                "step": payload["step"],
                "tool": payload["tool"],
                "input": payload["input"],
                "status": "in_flight",
                "result": None,
                "dispatched_seq": event.seq,
                "dispatched_at": format_timestamp(event.recorded_at),
                "result_seq": None,
            }
        elif event.type == et.TOOL_CALL_RESULT_RECEIVED:
            # A fork's answer to a call its source dispatched names the source's key as its effect.
            effect = payload.get("effect_key") or payload["idempotency_key"]
            if effect in calls:
                calls[effect].update(status=payload["status"], result=payload["result"], result_seq=event.seq)
        elif event.type == et.LLM_CALLED:
            model_calls.append({"seq": event.seq, "task_id": origin, "step": payload.get("step"),
                                "model": payload["model"], "provider": payload.get("provider"),
                                "prompt_sha256": payload["prompt_sha256"], "output": payload["output"],
                                "usage": payload.get("usage"), "cost": payload.get("cost")})
        elif event.type == et.SUB_AGENT_DISPATCHED:
            subtasks[payload["child_task_id"]] = {
                "child_task_id": payload["child_task_id"],
                "dispatch_key": payload["dispatch_key"],
                "step": payload["step"],
                "kind": payload["kind"],
                "status": "dispatched",
                "output": None,
                "error": None,
            }
        elif event.type == et.SUB_AGENT_ACCEPTED and payload["child_task_id"] in subtasks:
            subtasks[payload["child_task_id"]]["status"] = "accepted"
        elif event.type == et.SUB_AGENT_RESULT_RECEIVED:
            entry = subtasks.setdefault(payload["child_task_id"], {"child_task_id": payload["child_task_id"],
                                                                   "dispatch_key": payload.get("dispatch_key"),
                                                                   "step": None, "kind": payload.get("kind")})
            entry.update(status=payload["status"], output=payload.get("output"), error=payload.get("error"))

    in_flight = [c for c in calls.values() if c["status"] == "in_flight"]
    own = str(task.pk)
    # Everything before the first unanswered call is confirmed; with none, the whole log is. A
    # call still in flight in a fork's history came in with its TaskForked (seq 2).
    recovery_point = min((c["dispatched_seq"] if c["task_id"] == own else 2 for c in in_flight),
                         default=task.last_seq + 1) - 1
    tool_calls = list(calls.values())
    context = {
        "task_id": own,
        "attempt": task.attempts + 1,
        "recovery_point_seq": recovery_point,
        "forked_from": (
            {"task_id": str(task.forked_from_id), "at_seq": task.forked_at_seq, "sandbox": task.sandbox}
            if task.forked_from_id is not None else None
        ),
        "completed_steps": completed_steps,
        "tool_calls": tool_calls,
        "in_flight_tool_calls": in_flight,
        "subtasks": list(subtasks.values()),
        "model_calls": model_calls,
        "last_reasoning": last_reasoning,
    }
    shown = {"context": context, "input": task.input}
    shown = (personal_open(task.namespace, shown, reader=reader, where_read="recovery context", task_id=task.pk,
                           bounded=False).value
             if personal_opened else personal_shown(task.namespace, shown))
    context = shown["context"]
    context["resume_prompt"] = resume_prompt(task_kind=task.kind, task_input=shown["input"], context=context)
    return context


def _compact(value: Any, limit: int = 400) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resume_prompt(*, task_kind: str, task_input: dict[str, Any], context: dict[str, Any]) -> str:
    """Plain text that puts an LLM back at the exact decision point."""
    lines = [
        f"You are resuming task {context['task_id']} ({task_kind}), attempt {context['attempt']}.",
        f"Task input: {_compact(task_input)}",
        f"Everything up to event {context['recovery_point_seq']} is confirmed; do not redo it.",
    ]
    fork = context.get("forked_from")
    if fork is not None:
        lines.append(
            f"This task is a {'sandbox ' if fork['sandbox'] else ''}fork of task {fork['task_id']} after its event"
            f" {fork['at_seq']}: that task's steps up to there are this task's history, listed below."
        )
    if context["completed_steps"]:
        steps = ", ".join(str(s["step"]) for s in context["completed_steps"])
        lines.append(f"Completed reasoning steps: {steps}.")
    done = [c for c in context["tool_calls"] if c["status"] != "in_flight"]
    for call in done:
        lines.append(
            f"Tool call step {call['step']} {call['tool']} already {call['status']}: {_compact(call['result'], 300)}"
            " (use this result; do not call it again)."
        )
    for call in context["in_flight_tool_calls"]:
        lines.append(
            f"Tool call step {call['step']} {call['tool']} was dispatched but never answered. Re-dispatch it with"
            f" the same step and tool (idempotency key {call['idempotency_key']}); the backplane answers from"
            " its record if the first call completed."
        )
    for sub in context["subtasks"]:
        lines.append(
            f"Sub-agent {sub['kind']} (task {sub['child_task_id']}) is {sub['status']}"
            + (f" with output {_compact(sub['output'], 300)}" if sub.get("output") is not None else "")
            + "."
        )
    if context["last_reasoning"] is not None:
        lines.append(f"Your last recorded reasoning: {_compact(context['last_reasoning']['payload'], 600)}")
    lines.append("Continue from the next undecided step.")
    return "\n".join(lines)


def tasks_without_progress(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Running tasks whose holder keeps the lease alive but has written nothing for longer than
    BACKPLANE_NO_PROGRESS_FLAG_SECONDS (past BACKPLANE_NO_PROGRESS_STALL_SECONDS the stall
    detector takes them back)."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_FLAG_SECONDS)
    rows = Task.objects.filter(status="running", lease_holder__isnull=False, last_event_at__lt=since).values(
        "id", "namespace", "kind", "lease_holder", "last_event_at"
    )
    flagged = []
    for row in rows:
        last_event_at = row["last_event_at"]
        assert last_event_at is not None  # the filter above compared it
        flagged.append({**row, "silent_seconds": (now - last_event_at).total_seconds()})
    return flagged


def tool_calls_overdue(*, now: datetime | None = None) -> list[dict[str, Any]]:
    """Tool calls dispatched and never answered for longer than BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS."""
    now = now or timezone.now()
    since = now - timedelta(seconds=settings.BACKPLANE_TOOL_CALL_TIMEOUT_SECONDS)
    rows = ToolCall.objects.filter(status="dispatched", dispatched_at__lt=since).values(
        "idempotency_key", "task_id", "step", "tool", "dispatched_at"
    )
    return [{**row, "age_seconds": (now - row["dispatched_at"]).total_seconds()} for row in rows]


# --- the fleet, for the dashboard's agents page ------------------------------------------------

FLEET_MAX_AGENTS = 500
HISTORY_PER_AGENT = 5


@dataclass(frozen=True)
class AgentRow:
    agent: Agent
    active_leases: int
    failures_24h: int
    history: list[BreakerTransition]


def agents_overview(*, now: datetime | None = None) -> list[AgentRow]:
    """Every agent (up to ``FLEET_MAX_AGENTS``) with its leases held now, the attempts it lost in
    the last 24 h (tasks it failed or let stall) and its last breaker transitions: four queries."""
    now = now or timezone.now()
    agents = list(Agent.objects.order_by("namespace", "name")[:FLEET_MAX_AGENTS])
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT namespace, lease_holder, count(*) FROM backplane_task WHERE lease_holder IS NOT NULL"
            " GROUP BY 1, 2"
        )
        leases = {(ns, name): n for ns, name, n in cursor.fetchall()}
        # A stall is written by the backplane (agent NULL) and names the holder in its payload.
        cursor.execute(
            """
            SELECT t.namespace, coalesce(e.agent, e.payload->>'holder'), count(*)
              FROM backplane_event e JOIN backplane_task t ON t.id = e.task_id
             WHERE e.recorded_at >= %s AND e.type IN ('TaskFailed', 'TaskStalled')
             GROUP BY 1, 2
            """,
            [now - timedelta(hours=24)],
        )
        failures = {(ns, name): n for ns, name, n in cursor.fetchall()}
    transitions = (
        BreakerTransition.objects.annotate(
            rank=Window(RowNumber(), partition_by=[F("agent_id")], order_by=[F("at").desc(), F("pk").desc()])
        )
        .filter(agent_id__in=[a.pk for a in agents])
    )
    history: dict[int, list[BreakerTransition]] = {}
    for transition in transitions.filter(rank__lte=HISTORY_PER_AGENT).order_by("agent_id", "-at", "-pk"):
        history.setdefault(transition.agent_id, []).append(transition)
    return [
        AgentRow(
            agent=agent,
            active_leases=leases.get((agent.namespace, agent.name), 0),
            failures_24h=failures.get((agent.namespace, agent.name), 0),
            history=history.get(agent.pk, []),
        )
        for agent in agents
    ]


@dataclass(frozen=True)
class ToolRow:
    tool: Tool
    calls_last_hour: int
    failed_last_hour: int
    p50_ms: float | None
    p95_ms: float | None
    in_flight: int


def tools_overview(*, now: datetime | None = None) -> list[ToolRow]:
    """Every registered tool with its calls answered in the last hour (latency from dispatch to
    answer, p50 and p95) and calls still in flight: two queries.

    A call is counted for the tool that serves its task's namespace: that namespace's own tool
    of the name, else the global one (as the gateway resolves it, ``tool_for_namespace``), so two
    namespaces' tools of one name never share figures."""
    now = now or timezone.now()
    tools = list(Tool.objects.order_by("name", "namespace"))
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce(own.id, shared.id) AS tool_id,
                   count(*) FILTER (WHERE c.completed_at >= %(hour_ago)s),
                   count(*) FILTER (WHERE c.completed_at >= %(hour_ago)s AND c.status = 'failed'),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.completed_at - c.dispatched_at))
                       FILTER (WHERE c.completed_at >= %(hour_ago)s),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM c.completed_at - c.dispatched_at))
                       FILTER (WHERE c.completed_at >= %(hour_ago)s),
                   count(*) FILTER (WHERE c.status = 'dispatched')
              FROM recovery_toolcall c
              JOIN backplane_task t ON t.id = c.task_id
              LEFT JOIN recovery_tool own ON own.name = c.tool AND own.namespace = t.namespace
              LEFT JOIN recovery_tool shared ON shared.name = c.tool AND shared.namespace = ''
             WHERE c.tool = ANY(%(tools)s) AND (c.completed_at >= %(hour_ago)s OR c.status = 'dispatched')
             GROUP BY 1
            """,
            {"hour_ago": now - timedelta(hours=1), "tools": sorted({t.name for t in tools})},
        )
        stats = {row[0]: row[1:] for row in cursor.fetchall() if row[0] is not None}
    rows = []
    for tool in tools:
        calls, failed, p50, p95, flying = stats.get(tool.pk, (0, 0, None, None, 0))
        rows.append(ToolRow(tool=tool, calls_last_hour=calls, failed_last_hour=failed,
                            p50_ms=None if p50 is None else p50 * 1000, p95_ms=None if p95 is None else p95 * 1000,
                            in_flight=flying))
    return rows


# --- bulk jobs (recovery/bulk.py) -------------------------------------------------------------


def bulk_job_get(job_id: int) -> BulkJob:
    job = BulkJob.objects.filter(pk=job_id).first()
    if job is None:
        raise NotFound("job not found", {"job_id": job_id})
    return job


def bulk_jobs_recent(*, limit: int, before_id: int | None = None,
                     with_decisions: bool = False) -> tuple[list[BulkJob], int | None]:
    """Jobs newest first, a keyset page: the jobs and the cursor of the next page (None: last).
    ``with_decisions``: every job's decisions too, in one more query for the whole page."""
    jobs = BulkJob.objects.order_by("-pk")
    if with_decisions:
        jobs = jobs.prefetch_related("decisions")
    if before_id is not None:
        jobs = jobs.filter(pk__lt=before_id)
    page = list(jobs[: limit + 1])
    return page[:limit], page[limit - 1].pk if len(page) > limit else None


def bulk_job_items_page(job: BulkJob, *, status: str | None, after_index: int,
                        limit: int) -> tuple[list[BulkJobItem], int | None]:
    """A job's items in index order after ``after_index`` (keyset), optionally of one status;
    the items and the cursor of the next page (None: last)."""
    if status is not None and status not in BulkItemStatus.values:
        raise InvalidInput("unknown status", {"status": f"one of {', '.join(BulkItemStatus.values)}"})
    items = BulkJobItem.objects.filter(job=job, index__gt=after_index)
    if status is not None:
        items = items.filter(status=status)
    page = list(items.order_by("index")[: limit + 1])
    return page[:limit], page[limit - 1].index if len(page) > limit else None


def bulk_job_planned_counts(job: BulkJob) -> list[tuple[str, int]]:
    """What the dry run plans, by outcome, most first: ``[("retry", 2950), ("skip: …", 50)]``."""
    rows = BulkJobItem.objects.filter(job=job).values_list("planned").annotate(n=Count("pk")).order_by("-n", "planned")
    return [(planned, n) for planned, n in rows]


def staff_namespace(*, user_id: int) -> str | None:
    """The one namespace a staff user is limited to (StaffScope), or None: every namespace."""
    return StaffScope.objects.filter(user_id=user_id).values_list("namespace", flat=True).first()


# --- budgets (recovery/budgets.py) ------------------------------------------------------------------


def period_of(budget: Budget, now: datetime) -> date:
    """The day a budget's current period is filed under: today (UTC) for a day budget; for a
    task tree's, one fixed day (its period never ends)."""
    return now.date() if budget.period == BudgetPeriod.DAY else date(1970, 1, 1)


def is_spent(budget: Budget, *, now: datetime) -> bool:
    """Whether the budget stops work now: reached this period, and not resumed this period."""
    period = period_of(budget, now)
    return budget.exceeded_on == period and budget.resumed_on != period


# The cost rollups' scope that holds each budget scope's spend.
_ROLLUP_SCOPE = {BudgetScope.NAMESPACE: "namespace", BudgetScope.AGENT: "agent", BudgetScope.TASK: "tree"}


def budgets_spend(budgets: Sequence[Budget], *, now: datetime) -> list[Decimal]:
    """What each budget's scope has spent this period, in the budget's unit, from the rollups:
    one query however many budgets (none for none), so a list of budgets is never N+1.

    A namespace's or an agent's spend is today's hours (UTC), a tree's its one all-time row per
    currency. The sums are grouped by currency: a currency budget takes its own currency's, a
    token budget adds every currency's tokens."""
    if not budgets:
        return []
    day_start = datetime.combine(now.date(), time(), tzinfo=now.tzinfo)
    keys: dict[str, set[str]] = {}
    for budget in budgets:
        keys.setdefault(_ROLLUP_SCOPE[BudgetScope(budget.scope)], set()).add(budget.key)
    wanted = Q()
    for rollup_scope, scope_keys in keys.items():
        hours = Q(hour=ALL_TIME) if rollup_scope == "tree" else Q(hour__gte=day_start)
        wanted |= Q(hours, scope=rollup_scope, key__in=sorted(scope_keys))
    sums = (CostRollup.objects.filter(wanted).values("scope", "key", "currency")
            .annotate(cost=Sum("cost"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"))
            .order_by())
    by_scope: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in sums:
        by_scope.setdefault((row["scope"], row["key"]), []).append(row)
    spends = []
    for budget in budgets:
        rows = by_scope.get((_ROLLUP_SCOPE[BudgetScope(budget.scope)], budget.key), [])
        if budget.unit == BudgetUnit.CURRENCY:
            cost = next((row["cost"] for row in rows if row["currency"] == budget.currency), None)
            # A sum of zero shows as 0, not with the rollups' twelve places.
            spends.append(cost or Decimal(0))
        else:
            spends.append(Decimal(sum((row["input_tokens"] or 0) + (row["output_tokens"] or 0) for row in rows)))
    return spends


def budget_spend(budget: Budget, *, now: datetime) -> Decimal:
    """What the budget's scope has spent this period, in the budget's unit, from the rollups."""
    return budgets_spend([budget], now=now)[0]


@dataclass(frozen=True)
class BudgetState:
    budget: Budget
    spend: Decimal
    spent: bool
    resumed: bool  # resumed for the current period
    ask: BudgetAsk | None = None  # the question a budget that asks put this period


def budget_states_of(budgets: Sequence[Budget], *, now: datetime | None = None) -> list[BudgetState]:
    """These budgets with their spend and state now: one query for all of their spends, one
    for the questions the budgets that ask put this period."""
    now = now or timezone.now()
    asks: dict[int, BudgetAsk] = {}
    asking = [budget for budget in budgets if budget.at_limit == BudgetAtLimit.ASK]
    if asking:
        periods = Q()
        for budget in asking:
            periods |= Q(budget_id=budget.pk, period_day=period_of(budget, now))
        asks = {ask.budget_id: ask for ask in BudgetAsk.objects.filter(periods).select_related("group")}
    return [BudgetState(budget=budget, spend=spend, spent=is_spent(budget, now=now),
                        resumed=budget.resumed_on == period_of(budget, now), ask=asks.get(budget.pk))
            for budget, spend in zip(budgets, budgets_spend(budgets, now=now), strict=True)]


def budget_state(budget: Budget, *, now: datetime | None = None) -> BudgetState:
    return budget_states_of([budget], now=now)[0]


def budget_list(*, now: datetime | None = None) -> list[BudgetState]:
    """Every budget by scope and key, with its spend and state: three queries however many."""
    return budget_states_of(list(Budget.objects.select_related("ask_group").order_by("scope", "key", "pk")), now=now)


def budget_decisions_recent(*, limit: int) -> list[BudgetDecision]:
    """The last decisions on budgets, newest first, each with its budget."""
    return list(BudgetDecision.objects.select_related("budget").order_by("-at")[:limit])


# --- pauses (recovery/fleet.py) ---------------------------------------------------------------------

# How many lifted pauses the pages and the API show beside those in force.
RECENT_LIFTED = 20


def pauses_in_force(*, namespace: str | None = None) -> list[Pause]:
    pauses = Pause.objects.filter(resumed_at__isnull=True)
    if namespace is not None:
        pauses = pauses.filter(namespace=namespace)
    return list(pauses.order_by("-paused_at", "-pk"))


def pauses_recently_lifted(*, limit: int = RECENT_LIFTED) -> list[Pause]:
    return list(Pause.objects.filter(resumed_at__isnull=False).order_by("-resumed_at", "-pk")[:limit])


def pause_blocking(task: Task) -> Pause | None:
    """The pause that holds this pending task back (its namespace's, else its kind's)."""
    if task.status != TaskStatus.PENDING:
        return None
    return pauses_holding_back(task.namespace, task.kind).order_by("kind", "paused_at").first()


def pauses_holding_back(namespace: Any, kind: Any) -> QuerySet[Pause]:
    """The pauses in force over work of ``namespace`` and ``kind`` (values or ``OuterRef``s):
    the namespace's own, or its kind's, as a claim passes over them (recovery/leases.py)."""
    return Pause.objects.filter(Q(kind="") | Q(kind=kind), namespace=namespace, resumed_at__isnull=True)


# --- saved searches and alerts (recovery/alerts.py) ---------------------------------------------------


def search_filters(search: SavedSearch) -> TaskFilters:
    """The search's filter, checked again on the way out: a row written by hand (the admin) or by
    an older release is refused here (``InvalidInput``) rather than counted wrongly."""
    return task_filters_from_json(search.filter)


def alert_count(rule: AlertRule, *, now: datetime) -> int:
    """The tasks the rule's search matches whose ``updated_at`` is in ``(now - window, now]``."""
    since = now - timedelta(seconds=rule.window_seconds)
    return tasks_filtered(search_filters(rule.search)).filter(updated_at__gt=since, updated_at__lte=now).count()


@dataclass(frozen=True)
class SearchCount:
    search: SavedSearch
    count: int | None  # None: the stored filter is not valid any more


def _count_sql(tasks: QuerySet[Task]) -> tuple[str, tuple[Any, ...]]:
    sql, params = tasks.order_by().values("pk").query.sql_with_params()
    return f"(SELECT count(*) FROM ({sql}) AS matching)", tuple(params)


def saved_search_counts(searches: Sequence[SavedSearch]) -> list[SearchCount]:
    """How many tasks each search matches now (the task list's filter, no window): one statement
    for all of them, each count a subquery."""
    parts: list[str] = []
    params: list[Any] = []
    counted: list[SavedSearch] = []
    for search in searches:
        try:
            filters = search_filters(search)
        except InvalidInput:
            continue
        sql, sql_params = _count_sql(tasks_filtered(filters))
        parts.append(sql)
        params += sql_params
        counted.append(search)
    counts: dict[int, int] = {}
    if parts:
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(parts), params)
            row = cursor.fetchone()
        counts = {search.pk: int(value) for search, value in zip(counted, row or (), strict=True)}
    return [SearchCount(search=search, count=counts.get(search.pk)) for search in searches]


def saved_searches(*, pinned_only: bool = False) -> list[SavedSearch]:
    """Saved searches by name; every one with its alert rules (two queries), or only the pinned
    ones, without (one)."""
    searches = SavedSearch.objects.order_by("name", "pk")
    return list(searches.filter(pinned=True) if pinned_only else searches.prefetch_related("alert_rules"))


def saved_searches_bare() -> list[SavedSearch]:
    """Every saved search without its rules (one query): what their counts need."""
    return list(SavedSearch.objects.order_by("pk"))


def saved_search_named(slug: str) -> SavedSearch | None:
    """The saved search a link names by its slug, if there is one."""
    return SavedSearch.objects.filter(slug=slug).first()


def alerts_firing() -> list[AlertRule]:
    """Rules firing now, the longest-firing first."""
    return list(AlertRule.objects.filter(state=AlertState.FIRING).select_related("search").order_by("state_since"))


def alert_transitions_recent(*, state: str | None = None, limit: int = 10) -> list[AlertTransition]:
    transitions = AlertTransition.objects.order_by("-at", "-pk")
    if state:
        transitions = transitions.filter(state=state)
    return list(transitions.select_related("rule__search")[:limit])


def tool_policy_in_force(*, tool: str, namespace: str) -> ToolPolicy | None:
    """The current version of the namespace's policy for ``tool``, else of the global one; one
    query (the namespace's sorts first)."""
    return (ToolPolicy.objects.filter(tool=tool, namespace__in=[namespace, ""], is_current=True)
            .select_related("approver_group", "escalate_to").order_by("-namespace").first())


def tool_policy_list() -> list[ToolPolicy]:
    """Every policy's current version, by tool then namespace (global first)."""
    return list(ToolPolicy.objects.filter(is_current=True).select_related("approver_group", "escalate_to")
                .order_by("tool", "namespace"))


def tool_policy_get(policy_id: int) -> ToolPolicy:
    """One version, current or not (what a request was decided under)."""
    policy = ToolPolicy.objects.select_related("approver_group", "escalate_to").filter(pk=policy_id).first()
    if policy is None:
        raise NotFound("tool policy not found", {"policy_id": policy_id})
    return policy


def tool_policy_versions(*, tool: str, namespace: str) -> list[ToolPolicy]:
    """Every version of one policy, newest first."""
    return list(ToolPolicy.objects.filter(tool=tool, namespace=namespace)
                .select_related("approver_group", "escalate_to").order_by("-version"))


def _approvals() -> QuerySet[ApprovalRequest]:
    return (ApprovalRequest.objects.select_related("policy", "group", "task")
            .prefetch_related("decisions"))


def approval_visible(*, namespace: str | None, approval_id: uuid.UUID) -> ApprovalRequest:
    """One approval request, of a task of the namespace (any, for staff: None)."""
    requests = _approvals().filter(pk=approval_id)
    if namespace is not None:
        requests = requests.filter(task__namespace=namespace)
    request = requests.first()
    if request is None:
        raise NotFound("approval request not found", {"approval_id": str(approval_id)})
    return request


# A request's (or a signal's) status alone, of a task of the namespace (any, for staff: NULL): a
# waiting agent's poll on the event loop (api/agent_front.py).
APPROVAL_STATUS_SQL = (
    "SELECT a.status FROM recovery_approvalrequest a JOIN backplane_task t ON t.id = a.task_id "
    "WHERE a.id = %(approval_id)s AND (%(namespace)s::text IS NULL OR t.namespace = %(namespace)s)"
)
SIGNAL_STATUS_SQL = (
    "SELECT s.status FROM recovery_tasksignal s JOIN backplane_task t ON t.id = s.task_id "
    "WHERE s.task_id = %(task_id)s AND s.name = %(name)s "
    "AND (%(namespace)s::text IS NULL OR t.namespace = %(namespace)s)"
)


def approvals_list(*, status: str | None, namespace: str | None = None, limit: int = 200) -> list[ApprovalRequest]:
    """Requests by status (all: None), the longest waiting first; a scoped staff user's namespace only."""
    requests = _approvals()
    if status is not None:
        requests = requests.filter(status=status)
    if namespace is not None:
        requests = requests.filter(task__namespace=namespace)
    return list(requests.order_by("requested_at", "pk")[:limit])
