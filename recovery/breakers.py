"""Circuit breakers: one state machine, for agents and for tools.

A breaker stops work going to something that keeps failing: an agent (a ``TaskFailed`` it
wrote, a lease of its that expired) stops getting tasks before it burns every task's attempts;
a tool (no usable answer) stops being called.

- closed: everything goes through; ``threshold`` consecutive failures open it.
- open: everything is refused (``503 circuit_open`` with ``Retry-After``). Once the cool-down
  is over, exactly one request is let through as the trial and the breaker is half-open.
- half_open: everything else is refused. The trial's success closes the breaker, its failure
  opens it again with a new cool-down. A trial that was admitted but not used (the claim found
  no task, the rate limit refused the call) goes back to open with the cool-down spent, so the
  next request becomes the trial. A trial that never reports (its process died, its task was
  released) is given up after a patience period and the next request becomes the trial.
- any state: an operator's reset closes it.

The state stays on the guarded row. A ``BreakerStore`` says which model and fields hold it,
the settings (``Policy``) and how a transition is recorded: ``AGENTS`` writes a
``BreakerTransition`` row, ``TOOLS`` a log line. Every change happens under the row's lock.

Lock order: an agent's failures and successes are recorded while its task row is locked (task,
then agent). The claim gate therefore runs in its own short transaction *before* the claim
transaction, so no transaction ever holds an agent row while waiting for a task row; many
agents are locked at once only in id order (``breaker_record_failures``).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Model, QuerySet
from django.utils import timezone

from backplane.eventlog.models import Agent, BreakerTransition
from backplane.lib.sql_rows import RowLoader, recordset
from backplane.telemetry import counters
from recovery.errors import CircuitOpen
from recovery.models import Tool

logger = logging.getLogger(__name__)

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

M = TypeVar("M", bound=Model)


# --- the state machine -------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    threshold: int
    cooldown: timedelta
    # How long a trial usually takes to give its verdict; past it plus a cool-down it is given up.
    trial_timeout: timedelta

    @property
    def patience(self) -> timedelta:
        return self.trial_timeout + self.cooldown


@dataclass(frozen=True)
class Step:
    """What one event makes of a breaker; ``reason`` is set when that is a transition to record."""

    breaker: Breaker
    reason: str | None = None


@dataclass(frozen=True)
class Verdict:
    step: Step
    trial: bool = False  # this request is the trial
    retry_after: int | None = None  # set: refused, come back after this many seconds


def _seconds_until(moment: datetime, now: datetime) -> int:
    return max(1, math.ceil((moment - now).total_seconds()))


@dataclass(frozen=True)
class Breaker:
    """A breaker's state, whichever row holds it. Pure: every event returns a new one."""

    state: str
    failures: int
    opened_at: datetime | None = None  # open: when it opened
    trial_started_at: datetime | None = None  # half_open: when the trial was let through

    def failed(self, count: int, *, reason: str, now: datetime, policy: Policy) -> Step:
        failures = self.failures + count
        if self.state == HALF_OPEN:
            return Step(Breaker(OPEN, failures, opened_at=now), f"trial failed: {reason}")
        if self.state == CLOSED and failures >= policy.threshold:
            return Step(Breaker(OPEN, failures, opened_at=now), f"{failures} consecutive failures, last: {reason}")
        # Open already: a request let through before it opened failed too; it only counts.
        return Step(replace(self, failures=failures))

    def succeeded(self, *, reason: str) -> Step:
        # A success while open (a request let through before it opened) closes it as well.
        return Step(Breaker(CLOSED, 0), None if self.state == CLOSED else reason)

    def admit(self, *, now: datetime, policy: Policy) -> Verdict:
        """Let a request through, make it the trial, or refuse it with the seconds to wait."""
        if self.state == CLOSED:
            return Verdict(Step(self))
        if self.state == OPEN:
            # Without a known opening time the cool-down counts as spent: never stuck open.
            reopens_at = (self.opened_at or now - policy.cooldown) + policy.cooldown
            if now >= reopens_at:
                trial = replace(self, state=HALF_OPEN, trial_started_at=now)
                return Verdict(Step(trial, "cool-down over: one trial goes through"), trial=True)
            return Verdict(Step(self), retry_after=_seconds_until(reopens_at, now))
        started = self.trial_started_at
        if started is None or now >= started + policy.patience:
            # The trial's verdict will not come (or comes too late to wait for): hand it on.
            trial = replace(self, trial_started_at=now)
            return Verdict(Step(trial, "the trial never reported: another trial goes through"), trial=True)
        # Come back when the trial should have answered; after that, in a cool-down or when
        # the trial is given up, whichever comes first.
        expected = started + min(policy.trial_timeout, policy.cooldown)
        retry_at = expected if now < expected else min(now + policy.cooldown, started + policy.patience)
        return Verdict(Step(self), retry_after=_seconds_until(retry_at, now))

    def trial_unused(self, *, trial_started_at: datetime | None, reason: str, now: datetime,
                     policy: Policy) -> Step:
        """The trial (the one started at ``trial_started_at``; None: whichever is out) was not used."""
        if self.state != HALF_OPEN:
            return Step(self)  # the trial reported already
        if trial_started_at is not None and trial_started_at != self.trial_started_at:
            return Step(self)  # it was given up and handed to another request, whose it now is
        return Step(Breaker(OPEN, self.failures, opened_at=now - policy.cooldown), reason)

    def reset(self, *, reason: str) -> Step:
        if self.state == CLOSED and self.failures == 0:
            return Step(self)
        return Step(Breaker(CLOSED, 0), reason)


# --- where a breaker lives ---------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    from_state: str
    to_state: str
    reason: str
    at: datetime
    task_id: uuid.UUID | None = None
    decided_by: str = ""


# eq=False: hashed by identity, so the statements built from a store can be cached per store.
@dataclass(frozen=True, eq=False)
class BreakerStore(Generic[M]):
    """The model and fields that hold a breaker, its policy, and how a transition is recorded."""

    model: type[M]
    kind: str  # "agent", "tool": in messages, and the key of the row's label in CircuitOpen's details
    label: Callable[[M], str]
    state_field: str
    failures_field: str
    opened_at_field: str
    # None: the model has no column for it, and while half-open the trial's start is kept in
    # ``opened_at_field`` (the opening time is spent by then and nothing reads it).
    trial_started_at_field: str | None
    last_error_field: str | None
    policy: Callable[[M], Policy]
    # Writes the transitions in the caller's transaction; None: the log line is the record.
    record: Callable[[Sequence[tuple[M, Transition]]], None] | None

    @property
    def fields(self) -> tuple[str, ...]:
        optional = (self.trial_started_at_field, self.last_error_field)
        return (self.state_field, self.failures_field, self.opened_at_field, *(f for f in optional if f))

    def read(self, row: M) -> Breaker:
        state = getattr(row, self.state_field)
        opened_at = getattr(row, self.opened_at_field)
        if self.trial_started_at_field is not None:
            trial_started_at = getattr(row, self.trial_started_at_field)
        elif state == HALF_OPEN:
            opened_at, trial_started_at = None, opened_at
        else:
            trial_started_at = None
        return Breaker(state, getattr(row, self.failures_field), opened_at, trial_started_at)

    def write(self, row: M, breaker: Breaker) -> None:
        setattr(row, self.state_field, breaker.state)
        setattr(row, self.failures_field, breaker.failures)
        if self.trial_started_at_field is not None:
            setattr(row, self.opened_at_field, breaker.opened_at)
            setattr(row, self.trial_started_at_field, breaker.trial_started_at)
        else:
            setattr(row, self.opened_at_field,
                    breaker.trial_started_at if breaker.state == HALF_OPEN else breaker.opened_at)

    def lock(self, pk: Any) -> M:
        return self.model._default_manager.select_for_update().get(pk=pk)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()  # timestamptz reads it back to the microsecond
    return str(value)


@functools.cache
def _update_sql(store: BreakerStore[M]) -> str:
    # Written as SQL: one statement for any number of rows (a stall sweep writes the breakers of
    # all its holders at once), cheaper than a Q() per row or bulk_update's CASE expressions.
    pk = store.model._meta.pk
    assert pk is not None
    columns = recordset(store.model, (pk.name, *store.fields))
    assignments = ", ".join(f"{column} = u.{column}" for column in columns.columns[1:])
    return f"""
UPDATE {store.model._meta.db_table} AS t SET {assignments}
FROM jsonb_to_recordset(%s::jsonb) AS {columns.definition('u')}
WHERE t.{pk.column} = u.{pk.column}
"""


def _save(store: BreakerStore[M], changes: Sequence[tuple[M, Step, uuid.UUID | None]], *, now: datetime,
          decided_by: str = "") -> None:
    """Write the breakers that changed (one statement) and record their transitions.

    The rows must be locked by the caller's transaction."""
    written: list[M] = []
    recorded: list[tuple[M, Transition]] = []
    for row, step, task_id in changes:
        before = store.read(row)
        if step.reason is None and step.breaker == before:
            continue
        if step.reason is not None:
            recorded.append((row, Transition(before.state, step.breaker.state, step.reason, now, task_id,
                                             decided_by)))
        store.write(row, step.breaker)
        written.append(row)
    if not written:
        return
    pk = store.model._meta.pk
    assert pk is not None
    columns = recordset(store.model, (pk.name, *store.fields))
    rows = [{column: getattr(row, attname) for column, attname in zip(columns.columns, columns.attnames, strict=True)}
            for row in written]
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(store), [json.dumps(rows, default=_json_value)])
    if recorded:
        if store.record is not None:
            store.record(recorded)
        lines = [(store.label(row), t) for row, t in recorded]
        # After commit: a transition that was rolled back must not appear in the log.
        transaction.on_commit(functools.partial(_log_transitions, store.kind, lines))


def _log_transitions(kind: str, lines: list[tuple[str, Transition]]) -> None:
    for label, t in lines:
        counters.breaker_transition_count(kind=kind, to_state=t.to_state)
        level = logging.WARNING if t.to_state == OPEN else logging.INFO
        suffix = f" (by {t.decided_by})" if t.decided_by else ""
        logger.log(level, "%s %s: breaker %s -> %s: %s%s", kind, label, t.from_state, t.to_state, t.reason, suffix)


def _refusal(store: BreakerStore[M], row: M, retry_after: int) -> CircuitOpen:
    label, state = store.label(row), getattr(row, store.state_field)
    return CircuitOpen(
        f"the circuit breaker of {store.kind} {label} is {state}",
        retry_after=retry_after,
        details={store.kind: label, "state": state, "consecutive_failures": getattr(row, store.failures_field),
                 "retry_after": retry_after},
    )


# --- the operations, for any store -------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    # Set when this request is the trial; names it to breaker_release_trial.
    trial_started_at: datetime | None = None


def breaker_admit(store: BreakerStore[M], row: M, *, now: datetime) -> Admission:
    """Let a request through, make it the trial, or refuse it with CircuitOpen.

    ``row`` may be a snapshot read without a lock: letting through or refusing on it is the same
    as having arrived a moment earlier, and changes nothing. Becoming the trial is decided again
    under the row lock, so of the requests that find the cool-down over (or the trial given up)
    at once, the first to get the lock wins and the others find the breaker half-open.
    Runs in its own transaction, so the trial is taken for everyone before the request goes on.
    """
    verdict = store.read(row).admit(now=now, policy=store.policy(row))
    if verdict.trial:
        with transaction.atomic(durable=True):
            row = store.lock(row.pk)
            verdict = store.read(row).admit(now=now, policy=store.policy(row))
            if verdict.trial:
                _save(store, [(row, verdict.step, None)], now=now)
    if verdict.retry_after is not None:
        raise _refusal(store, row, verdict.retry_after)
    return Admission(trial_started_at=verdict.step.breaker.trial_started_at if verdict.trial else None)


def breaker_release_trial(store: BreakerStore[M], pk: Any, *, trial_started_at: datetime | None,
                          reason: str) -> None:
    """An admitted trial was not used: open again with the cool-down spent, so the next request
    becomes the trial. Only the trial named by ``trial_started_at`` (None: whichever is out)."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        row = store.lock(pk)
        step = store.read(row).trial_unused(trial_started_at=trial_started_at, reason=reason, now=now,
                                            policy=store.policy(row))
        _save(store, [(row, step, None)], now=now)


def breaker_count_failures(store: BreakerStore[M], failures: Sequence[tuple[M, int, uuid.UUID | None]], *,
                           reason: str, now: datetime) -> None:
    """Count (row, failures, task) for rows the caller's transaction has locked."""
    changes = []
    for row, count, task_id in failures:
        if store.last_error_field is not None:
            setattr(row, store.last_error_field, reason[:1000])
        changes.append((row, store.read(row).failed(count, reason=reason, now=now, policy=store.policy(row)), task_id))
    _save(store, changes, now=now)


def breaker_count_success(store: BreakerStore[M], rows: QuerySet[M], *, reason: str, now: datetime,
                          task_id: uuid.UUID | None = None) -> None:
    """Close the breakers of ``rows`` and start their failure counts again, in the caller's transaction.

    The usual case (closed, no failures) matches no row: it takes no lock and writes nothing. The
    event loop's driver asks the same of an agent's breaker (``AGENT_BREAKER_BUSY_SQL``)."""
    quiet = {store.state_field: CLOSED, store.failures_field: 0}
    for row in rows.select_for_update().exclude(**quiet).order_by("pk"):
        _save(store, [(row, store.read(row).succeeded(reason=reason), task_id)], now=now)


def breaker_close(store: BreakerStore[M], pk: Any, *, decided_by: str, reason: str = "") -> M:
    """An operator closes the breaker by hand; their reason goes into the recorded transition."""
    now = timezone.now()
    why = f"reset by an operator: {reason.strip()}" if reason.strip() else "reset by an operator"
    with transaction.atomic(durable=True):
        row = store.lock(pk)
        _save(store, [(row, store.read(row).reset(reason=why[:255]), None)], now=now, decided_by=decided_by)
    return row


# --- agents ------------------------------------------------------------------------------------


def _agent_policy(agent: Agent) -> Policy:
    # A live trial task that makes no progress for this long is stalled by the detector, which
    # reports the failure; a half-open breaker older than that (and a cool-down) lost its trial
    # some other way, e.g. the lease was released.
    return Policy(
        threshold=settings.BACKPLANE_BREAKER_THRESHOLD,
        cooldown=timedelta(seconds=settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS),
        trial_timeout=timedelta(seconds=settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS),
    )


def _record_agent_transitions(recorded: Sequence[tuple[Agent, Transition]]) -> None:
    BreakerTransition.objects.bulk_create([
        BreakerTransition(agent_id=agent.pk, from_state=t.from_state, to_state=t.to_state, reason=t.reason[:255],
                          task_id=t.task_id, decided_by=t.decided_by, at=t.at)
        for agent, t in recorded
    ])


AGENTS: BreakerStore[Agent] = BreakerStore(
    model=Agent,
    kind="agent",
    label=lambda agent: agent.name,
    state_field="breaker_state",
    failures_field="consecutive_failures",
    opened_at_field="breaker_opened_at",
    trial_started_at_field=None,  # the Agent model has no column for it
    last_error_field=None,
    policy=_agent_policy,
    record=_record_agent_transitions,
)

# Whether a success has work to do for an agent's breaker (``breaker_count_success``'s rows that
# are not quiet), asked on the event loop's connection (recovery/handlers.py).
AGENT_BREAKER_BUSY_SQL = (
    f"SELECT 1 FROM {Agent._meta.db_table} WHERE namespace = %s AND name = %s"
    f" AND NOT ({AGENTS.state_field} = '{CLOSED}' AND {AGENTS.failures_field} = 0)"
)

_AGENT_ROWS = RowLoader(Agent)
_AGENT_TABLE = Agent._meta.db_table
_LOCK_AGENTS_SQL = f"""
SELECT {_AGENT_ROWS.columns} FROM {_AGENT_TABLE}
JOIN unnest(%s::text[], %s::text[]) AS f(namespace, name)
  ON {_AGENT_TABLE}.namespace = f.namespace AND {_AGENT_TABLE}.name = f.name
ORDER BY {_AGENT_TABLE}.id
FOR UPDATE OF {_AGENT_TABLE}
"""


def breaker_record_failures(*, failures: Mapping[tuple[str, str], tuple[int, uuid.UUID | None]], reason: str,
                            now: datetime) -> None:
    """Count failures of many agents: (namespace, name) -> (failures, last task id).

    The agents are locked by one statement in id order, so two callers recording failures of
    overlapping agents at once (stall sweeps on several workers) cannot deadlock, and written
    back by one more (plus one insert of the transitions, if any). Runs inside the caller's
    transaction."""
    if not failures:
        return
    namespaces, names = zip(*failures, strict=True)
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_AGENTS_SQL, [list(namespaces), list(names)])
        agents = [_AGENT_ROWS.load(row) for row in cursor.fetchall()]
    counted: list[tuple[Agent, int, uuid.UUID | None]] = []
    for agent in agents:
        count, task_id = failures[(agent.namespace, agent.name)]
        counted.append((agent, count, task_id))
    breaker_count_failures(AGENTS, counted, reason=reason, now=now)


def breaker_record_failure(*, namespace: str, agent_name: str | None, reason: str, task_id: uuid.UUID | None,
                           now: datetime, failures: int = 1) -> None:
    """Count ``failures``; opens the breaker at the threshold, re-opens it after a failed trial.

    Runs inside the caller's transaction (the one that records the failure)."""
    if agent_name:
        breaker_record_failures(failures={(namespace, agent_name): (failures, task_id)}, reason=reason, now=now)


def breaker_record_success(*, namespace: str, agent_name: str | None, task_id: uuid.UUID | None,
                           now: datetime) -> None:
    """A task completed: the breaker closes. Runs inside the caller's transaction."""
    if agent_name:
        breaker_count_success(AGENTS, Agent.objects.filter(namespace=namespace, name=agent_name),
                              reason="task completed", now=now, task_id=task_id)


@dataclass(frozen=True)
class ClaimGate:
    trial: bool  # this claim is the half-open trial
    # When the trial was let through: names it to breaker_trial_unused.
    trial_started_at: datetime | None = None


def breaker_gate_claim(*, agent_id: int) -> ClaimGate:
    """Let a claim through, make it the half-open trial, or refuse it with CircuitOpen."""
    agent = Agent.objects.only("name", *AGENTS.fields).get(pk=agent_id)
    admission = breaker_admit(AGENTS, agent, now=timezone.now())
    return ClaimGate(trial=admission.trial_started_at is not None, trial_started_at=admission.trial_started_at)


def breaker_trial_unused(*, agent_id: int, trial_started_at: datetime | None = None) -> None:
    """A half-open trial claim found no task: open again with the cool-down already spent,
    so the next claim becomes the trial. ``trial_started_at`` (from the ClaimGate) makes sure
    it is this claim's trial, not one handed to another claim since."""
    breaker_release_trial(AGENTS, agent_id, trial_started_at=trial_started_at, reason="trial claim found no task")


def breaker_reset(*, agent_id: int, decided_by: str, reason: str = "") -> Agent:
    """An operator closes the breaker by hand."""
    return breaker_close(AGENTS, agent_id, decided_by=decided_by, reason=reason)


# --- tools -------------------------------------------------------------------------------------


def _tool_policy(tool: Tool) -> Policy:
    # A trial call reports within the tool's timeout, or its process died.
    return Policy(
        threshold=settings.BACKPLANE_TOOL_BREAKER_THRESHOLD,
        cooldown=timedelta(seconds=settings.BACKPLANE_TOOL_BREAKER_COOLDOWN_SECONDS),
        trial_timeout=timedelta(seconds=tool.timeout_seconds),
    )


# Tool transitions are recorded as log lines only: BreakerTransition belongs to the event log,
# which may not know recovery's Tool, and the log is what operators had for tools before.
TOOLS: BreakerStore[Tool] = BreakerStore(
    model=Tool,
    kind="tool",
    label=str,  # "name", or "name (namespace)" for a namespace's own tool
    state_field="breaker_state",
    failures_field="consecutive_failures",
    opened_at_field="opened_at",
    trial_started_at_field="trial_started_at",
    last_error_field="last_error",
    policy=_tool_policy,
    record=None,
)
