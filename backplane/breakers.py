"""Circuit breaker per agent.

An agent that keeps failing (a ``TaskFailed`` it wrote, or a lease of its that expired)
should stop taking work before it burns every task's attempts. ``threshold`` consecutive
failures open the breaker: claims get ``503 circuit_open`` with ``Retry-After``. After the
cool-down, one claim is let through (half-open); its task's success closes the breaker,
its failure opens it again. Every change is a ``BreakerTransition`` row.

Lock order: failures and successes are recorded while the task row is locked (task, then
agent). The claim gate therefore runs in its own short transaction *before* the claim
transaction, so no transaction ever holds an agent row while waiting for a task row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from backplane.errors import CircuitOpen
from backplane.models import Agent, BreakerTransition

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


def _transition(agent: Agent, to_state: str, *, reason: str, now: datetime, task_id: object = None,
                decided_by: str = "") -> None:
    BreakerTransition.objects.create(agent=agent, from_state=agent.breaker_state, to_state=to_state, reason=reason,
                                     task_id=task_id, decided_by=decided_by, at=now)
    agent.breaker_state = to_state
    if to_state == OPEN:
        agent.breaker_opened_at = now
    if to_state == CLOSED:
        agent.consecutive_failures = 0
        agent.breaker_opened_at = None


def _locked_agent(namespace: str, name: str | None) -> Agent | None:
    if not name:
        return None
    return Agent.objects.select_for_update().filter(namespace=namespace, name=name).first()


def _count_failures(agent: Agent, failures: int, *, reason: str, task_id: object, now: datetime) -> None:
    agent.consecutive_failures += failures
    if agent.breaker_state == HALF_OPEN:
        _transition(agent, OPEN, reason=f"trial failed: {reason}", now=now, task_id=task_id)
    elif agent.breaker_state == CLOSED and agent.consecutive_failures >= settings.BACKPLANE_BREAKER_THRESHOLD:
        _transition(agent, OPEN, reason=f"{agent.consecutive_failures} consecutive failures, last: {reason}",
                    now=now, task_id=task_id)


def breaker_record_failure(*, namespace: str, agent_name: str | None, reason: str, task_id: object,
                           now: datetime, failures: int = 1) -> None:
    """Count ``failures``; opens the breaker at the threshold, re-opens it after a failed trial.

    Runs inside the caller's transaction (the one that records the failure)."""
    agent = _locked_agent(namespace, agent_name)
    if agent is None:
        return
    _count_failures(agent, failures, reason=reason, task_id=task_id, now=now)
    agent.save(update_fields=["consecutive_failures", "breaker_state", "breaker_opened_at"])


# Written as SQL: for a sweep's 20 agents, a Q() per agent and bulk_update's CASE expressions
# cost ~25 ms of Python per call, ten times the statements' own time.
_LOCK_AGENTS_SQL = """
SELECT a.* FROM backplane_agent AS a
JOIN unnest(%s::text[], %s::text[]) AS f(namespace, name) ON a.namespace = f.namespace AND a.name = f.name
ORDER BY a.id
FOR UPDATE OF a
"""
_UPDATE_AGENTS_SQL = """
UPDATE backplane_agent AS a
SET consecutive_failures = u.consecutive_failures, breaker_state = u.breaker_state,
    breaker_opened_at = u.breaker_opened_at
FROM jsonb_to_recordset(%s::jsonb) AS u(id bigint, consecutive_failures int, breaker_state text,
                                        breaker_opened_at timestamptz)
WHERE a.id = u.id
"""


def breaker_record_failures(*, failures: Mapping[tuple[str, str], tuple[int, object]], reason: str,
                            now: datetime) -> None:
    """``breaker_record_failure`` for many agents: (namespace, name) -> (failures, last task id).

    The agents are locked by one statement in id order, so two callers recording failures of
    overlapping agents at once (stall sweeps on several workers) cannot deadlock, and written
    back by one more. Runs inside the caller's transaction."""
    if not failures:
        return
    namespaces, names = zip(*failures, strict=True)
    agents = list(Agent.objects.raw(_LOCK_AGENTS_SQL, [list(namespaces), list(names)]))
    rows = []
    for agent in agents:
        count, task_id = failures[(agent.namespace, agent.name)]
        _count_failures(agent, count, reason=reason, task_id=task_id, now=now)
        rows.append({"id": agent.pk, "consecutive_failures": agent.consecutive_failures,
                     "breaker_state": agent.breaker_state,
                     "breaker_opened_at": agent.breaker_opened_at and agent.breaker_opened_at.isoformat()})
    with connection.cursor() as cursor:
        cursor.execute(_UPDATE_AGENTS_SQL, [json.dumps(rows)])


def breaker_record_success(*, namespace: str, agent_name: str | None, task_id: object, now: datetime) -> None:
    agent = _locked_agent(namespace, agent_name)
    if agent is None or (agent.breaker_state == CLOSED and agent.consecutive_failures == 0):
        return
    if agent.breaker_state != CLOSED:
        _transition(agent, CLOSED, reason="task completed", now=now, task_id=task_id)
    agent.consecutive_failures = 0
    agent.save(update_fields=["consecutive_failures", "breaker_state", "breaker_opened_at"])


@dataclass(frozen=True)
class ClaimGate:
    trial: bool  # this claim is the half-open trial


def breaker_gate_claim(*, agent_id: int) -> ClaimGate:
    """Let a claim through, make it the half-open trial, or refuse it with CircuitOpen."""
    cooldown = timedelta(seconds=settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS)
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        if agent.breaker_state == CLOSED:
            return ClaimGate(trial=False)
        now = timezone.now()
        reopen_at = (agent.breaker_opened_at or now) + cooldown
        if agent.breaker_state == OPEN and now >= reopen_at:
            # The row lock makes this the only claim that wins the trial.
            _transition(agent, HALF_OPEN, reason="cool-down over: one trial claim", now=now)
            agent.save(update_fields=["breaker_state", "breaker_opened_at", "consecutive_failures"])
            return ClaimGate(trial=True)
        wait = max(1, math.ceil((reopen_at - now).total_seconds())) if agent.breaker_state == OPEN else \
            settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS
    raise CircuitOpen(
        f"the circuit breaker of agent {agent.name} is {agent.breaker_state}",
        retry_after=wait,
        details={"state": agent.breaker_state, "consecutive_failures": agent.consecutive_failures},
    )


def breaker_trial_unused(*, agent_id: int) -> None:
    """A half-open trial claim found no task: open again with the cool-down already spent,
    so the next claim becomes the trial."""
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        if agent.breaker_state == HALF_OPEN:
            opened_at = timezone.now() - timedelta(seconds=settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS)
            _transition(agent, OPEN, reason="trial claim found no task", now=timezone.now())
            agent.breaker_opened_at = opened_at
            agent.save(update_fields=["breaker_state", "breaker_opened_at", "consecutive_failures"])


def breaker_reset(*, agent_id: int, decided_by: str) -> Agent:
    """An operator closes the breaker by hand."""
    with transaction.atomic(durable=True):
        agent = Agent.objects.select_for_update().get(pk=agent_id)
        if agent.breaker_state != CLOSED or agent.consecutive_failures:
            _transition(agent, CLOSED, reason="reset by an operator", now=timezone.now(), decided_by=decided_by)
            agent.save(update_fields=["breaker_state", "breaker_opened_at", "consecutive_failures"])
    return agent
