"""The one circuit-breaker state machine (recovery/breakers.py), on its own and on both of its
stores: agents (claims) and tools (gateway calls), against the real database and real threads."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Agent, BreakerTransition
from recovery import breakers, gateway
from recovery.breakers import CLOSED, HALF_OPEN, OPEN, Breaker, Policy
from recovery.errors import CircuitOpen
from recovery.models import Tool

# --- the state machine, pure -------------------------------------------------------------------

POLICY = Policy(threshold=3, cooldown=timedelta(seconds=60), trial_timeout=timedelta(seconds=10))
T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def opened(at_: datetime = T0, failures: int = 3) -> Breaker:
    return Breaker(OPEN, failures, opened_at=at_)


def half_open(started: datetime = T0, failures: int = 3) -> Breaker:
    return Breaker(HALF_OPEN, failures, opened_at=T0 - timedelta(hours=1), trial_started_at=started)


def test_it_counts_failures_and_opens_at_the_threshold() -> None:
    two = Breaker(CLOSED, 0).failed(2, reason="boom", now=T0, policy=POLICY)
    assert two.breaker == Breaker(CLOSED, 2) and two.reason is None

    three = two.breaker.failed(1, reason="boom", now=at(1), policy=POLICY)

    assert three.breaker == Breaker(OPEN, 3, opened_at=at(1))
    assert three.reason == "3 consecutive failures, last: boom"


def test_failures_while_open_only_count() -> None:
    step = opened().failed(1, reason="late", now=at(5), policy=POLICY)
    assert step.breaker == opened(failures=4) and step.reason is None


def test_it_refuses_while_open_and_says_when_the_cool_down_ends() -> None:
    assert opened().admit(now=at(15), policy=POLICY).retry_after == 45
    assert opened().admit(now=at(59.5), policy=POLICY).retry_after == 1


def test_after_the_cool_down_one_request_becomes_the_trial() -> None:
    verdict = opened().admit(now=at(60), policy=POLICY)

    assert verdict.trial and verdict.retry_after is None
    assert verdict.step.breaker == Breaker(HALF_OPEN, 3, opened_at=T0, trial_started_at=at(60))
    assert verdict.step.reason == "cool-down over: one trial goes through"


def test_an_open_breaker_without_an_opening_time_is_not_stuck() -> None:
    assert Breaker(OPEN, 3).admit(now=T0, policy=POLICY).trial


def test_half_open_refuses_others_until_the_trial_should_have_answered() -> None:
    # Within the trial's timeout: come back when it should have answered.
    assert half_open().admit(now=at(4), policy=POLICY).retry_after == 6
    # Later: in a cool-down, or when the trial is given up (timeout + cool-down), if sooner.
    assert half_open().admit(now=at(11), policy=POLICY).retry_after == 59
    assert half_open().admit(now=at(50), policy=POLICY).retry_after == 20


def test_a_trial_that_never_reports_is_given_up_after_the_patience() -> None:
    assert not half_open().admit(now=at(69), policy=POLICY).trial

    verdict = half_open().admit(now=at(70), policy=POLICY)

    assert verdict.trial and verdict.step.breaker.trial_started_at == at(70)
    assert verdict.step.breaker.state == HALF_OPEN and verdict.step.breaker.failures == 3
    assert verdict.step.reason == "the trial never reported: another trial goes through"


def test_a_failed_trial_opens_it_again_with_a_new_cool_down() -> None:
    step = half_open().failed(1, reason="boom", now=at(5), policy=POLICY)
    assert step.breaker == Breaker(OPEN, 4, opened_at=at(5)) and step.reason == "trial failed: boom"


def test_a_success_closes_it_from_any_state() -> None:
    for breaker in (half_open(), opened()):
        step = breaker.succeeded(reason="done")
        assert step.breaker == Breaker(CLOSED, 0) and step.reason == "done"
    # Closed with failures: the count starts again, but that is no transition.
    assert Breaker(CLOSED, 2).succeeded(reason="done") == breakers.Step(Breaker(CLOSED, 0), None)


def test_an_unused_trial_goes_back_to_open_with_the_cool_down_spent() -> None:
    step = half_open().trial_unused(trial_started_at=T0, reason="no task", now=at(2), policy=POLICY)

    assert step.breaker == Breaker(OPEN, 3, opened_at=at(2) - POLICY.cooldown) and step.reason == "no task"
    assert step.breaker.admit(now=at(2), policy=POLICY).trial


def test_an_unused_trial_that_was_handed_on_changes_nothing() -> None:
    # Given up and handed to another request at 70 s: the first trial's release is not its.
    handed_on = half_open(started=at(70))
    assert handed_on.trial_unused(trial_started_at=T0, reason="no task", now=at(71), policy=POLICY).reason is None
    assert Breaker(CLOSED, 0).trial_unused(trial_started_at=None, reason="x", now=T0, policy=POLICY).reason is None


def test_a_reset_closes_it_and_a_quiet_breaker_needs_none() -> None:
    step = opened().reset(reason="reset by an operator")
    assert step.breaker == Breaker(CLOSED, 0) and step.reason == "reset by an operator"
    assert Breaker(CLOSED, 0).reset(reason="reset").reason is None


# --- both stores: agents and tools -------------------------------------------------------------


@dataclass
class Subject:
    """One guarded row (an agent or a tool) and the public calls its callers make."""

    kind: str
    pk: int
    admit: Callable[[], datetime | None]  # the trial's start when this request is the trial
    fail: Callable[[str], None]
    release: Callable[[datetime | None], None]

    def row(self) -> Agent | Tool:
        return Agent.objects.get(pk=self.pk) if self.kind == "agent" else Tool.objects.get(pk=self.pk)

    def state(self) -> tuple[str, int]:
        row = self.row()
        return row.breaker_state, row.consecutive_failures

    def set(self, state: str, *, since: timedelta, failures: int = 3) -> None:
        """Put the breaker in ``state``, opened (or its trial started) ``since`` ago."""
        moment = timezone.now() - since
        if self.kind == "agent":
            # The agent store keeps a half-open trial's start in breaker_opened_at.
            Agent.objects.filter(pk=self.pk).update(breaker_state=state, consecutive_failures=failures,
                                                    breaker_opened_at=moment)
        else:
            Tool.objects.filter(pk=self.pk).update(
                breaker_state=state, consecutive_failures=failures, opened_at=moment,
                trial_started_at=moment if state == HALF_OPEN else None)


def agent_subject() -> Subject:
    agent = services.agent_create(name="flaky", namespace="acme").agent

    def fail(reason: str) -> None:
        with transaction.atomic():
            breakers.breaker_record_failure(namespace="acme", agent_name="flaky", reason=reason, task_id=None,
                                            now=timezone.now())

    return Subject(
        kind="agent",
        pk=agent.pk,
        admit=lambda: breakers.breaker_gate_claim(agent_id=agent.pk).trial_started_at,
        fail=fail,
        release=lambda started: breakers.breaker_trial_unused(agent_id=agent.pk, trial_started_at=started),
    )


def tool_subject() -> Subject:
    tool = Tool.objects.create(name="send-email", url="http://127.0.0.1:9/", timeout_seconds=5)

    def admit() -> datetime | None:
        # As the gateway does: decide on the row read at the start of the request.
        snapshot = Tool.objects.get(pk=tool.pk)
        return gateway.tool_breaker_admit(tool=snapshot, now=timezone.now()).trial_started_at

    def fail(reason: str) -> None:
        gateway.tool_breaker_record_failure(tool_id=tool.pk, reason=reason)

    return Subject(
        kind="tool",
        pk=tool.pk,
        admit=admit,
        fail=fail,
        release=lambda started: gateway._trial_release(tool, gateway.Permit(trial_started_at=started)),
    )


@pytest.fixture(params=["agent", "tool"])
def subject(request: pytest.FixtureRequest, db: None) -> Subject:
    return agent_subject() if request.param == "agent" else tool_subject()


@pytest.fixture(params=["agent", "tool"])
def committed_subject(request: pytest.FixtureRequest, committed_db: None) -> Subject:
    return agent_subject() if request.param == "agent" else tool_subject()


def test_it_goes_round_the_whole_cycle(subject: Subject) -> None:
    for _ in range(3):
        assert subject.admit() is None
        subject.fail("boom")
    assert subject.state() == (OPEN, 3)
    with pytest.raises(CircuitOpen) as refused:
        subject.admit()
    assert refused.value.details[subject.kind] and refused.value.details["state"] == OPEN
    retry_after = refused.value.retry_after
    assert retry_after is not None and refused.value.details["retry_after"] == retry_after >= 1

    subject.set(OPEN, since=timedelta(hours=1))
    started = subject.admit()
    assert started is not None and subject.state() == (HALF_OPEN, 3)
    with pytest.raises(CircuitOpen):
        subject.admit()
    subject.release(started)  # not used: the next request is the trial
    assert subject.state() == (OPEN, 3)
    assert subject.admit() is not None
    subject.fail("still broken")
    assert subject.state() == (OPEN, 4)


def test_a_release_of_a_trial_that_was_handed_on_keeps_the_new_one(subject: Subject) -> None:
    subject.set(HALF_OPEN, since=timedelta(hours=2))  # its trial never reported
    stale = subject.row()
    stale_start = stale.breaker_opened_at if subject.kind == "agent" else stale.trial_started_at  # type: ignore[union-attr]

    new_start = subject.admit()
    subject.release(stale_start)

    assert new_start is not None and new_start != stale_start
    assert subject.state() == (HALF_OPEN, 3)


def test_the_agent_store_keeps_a_trials_start_in_breaker_opened_at(db: None) -> None:
    subject = agent_subject()
    subject.set(OPEN, since=timedelta(hours=1))

    started = subject.admit()

    agent = Agent.objects.get(pk=subject.pk)
    assert (agent.breaker_state, agent.breaker_opened_at) == (HALF_OPEN, started)
    assert breakers.AGENTS.read(agent) == Breaker(HALF_OPEN, 3, opened_at=None, trial_started_at=started)
    assert list(BreakerTransition.objects.filter(agent=agent).values_list("from_state", "to_state", "reason")) == [
        (OPEN, HALF_OPEN, "cool-down over: one trial goes through")]


def test_an_agent_whose_trial_never_reports_gets_another_trial(db: None, settings: Any) -> None:
    subject = agent_subject()
    patience = settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS + settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS
    subject.set(HALF_OPEN, since=timedelta(seconds=patience - 5))
    with pytest.raises(CircuitOpen):
        subject.admit()
    subject.set(HALF_OPEN, since=timedelta(seconds=patience + 1))

    assert subject.admit() is not None
    assert list(BreakerTransition.objects.filter(agent_id=subject.pk).values_list("from_state", "to_state")) == [
        (HALF_OPEN, HALF_OPEN)]


def test_failures_of_many_agents_are_locked_by_one_statement_and_written_by_one_more(
        db: None, settings: Any, django_assert_num_queries: Any) -> None:
    settings.BACKPLANE_BREAKER_THRESHOLD = 3
    agents = [services.agent_create(name=f"a{n}", namespace="acme").agent for n in range(5)]
    task_id = uuid.uuid4()
    failures = {("acme", a.name): (n + 1, task_id) for n, a in enumerate(agents)}
    failures[("acme", "nobody")] = (1, task_id)  # unknown: nothing to count

    with transaction.atomic(), django_assert_num_queries(3):  # lock, write, the transitions
        breakers.breaker_record_failures(failures=failures, reason="lease expired", now=timezone.now())
    with transaction.atomic(), django_assert_num_queries(2):  # no transition this time
        breakers.breaker_record_failures(failures={("acme", "a0"): (1, None)}, reason="x", now=timezone.now())

    counts = dict(Agent.objects.values_list("name", "consecutive_failures"))
    assert counts == {"a0": 2, "a1": 2, "a2": 3, "a3": 4, "a4": 5}
    assert sorted(BreakerTransition.objects.values_list("agent__name", "to_state", "task_id")) == [
        ("a2", OPEN, task_id), ("a3", OPEN, task_id), ("a4", OPEN, task_id)]


def statements(captured: CaptureQueriesContext) -> list[str]:
    """What ran, without the savepoints that stand in for transactions inside a test's own."""
    return [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def test_a_success_of_a_quiet_breaker_takes_no_lock_and_writes_nothing(subject: Subject) -> None:
    if subject.kind == "agent":
        # In the transaction of the append that completed the task, as the follow-up runs.
        with transaction.atomic(), CaptureQueriesContext(connection) as captured:
            breakers.breaker_record_success(namespace="acme", agent_name="flaky", task_id=None, now=timezone.now())
    else:
        with CaptureQueriesContext(connection) as captured:
            gateway.tool_breaker_record_success(tool_id=subject.pk)

    (select,) = statements(captured)
    assert select.startswith("SELECT") and "FOR UPDATE" in select
    assert subject.state() == (CLOSED, 0)


def test_an_operator_reset_closes_it_and_is_recorded(subject: Subject, caplog: pytest.LogCaptureFixture,
                                                   django_capture_on_commit_callbacks: Any) -> None:
    subject.set(OPEN, since=timedelta(seconds=0))
    with caplog.at_level(logging.INFO, logger="recovery.breakers"), \
            django_capture_on_commit_callbacks(execute=True):
        if subject.kind == "agent":
            breakers.breaker_reset(agent_id=subject.pk, decided_by="user:op")
        else:
            gateway.tool_breaker_reset(tool_id=subject.pk, decided_by="user:op")

    assert subject.state() == (CLOSED, 0)
    row = subject.row()
    assert (row.breaker_opened_at if subject.kind == "agent" else row.opened_at) is None  # type: ignore[union-attr]
    # Tools have no transition table: the log line is their record (agents get both).
    assert [r.getMessage() for r in caplog.records if r.name == "recovery.breakers"] == [
        f"{subject.kind} {row.name}: breaker open -> closed: reset by an operator (by user:op)"]


def test_a_tool_failure_keeps_the_last_error(db: None) -> None:
    subject = tool_subject()
    subject.fail("tool send-email answered HTTP 503")
    tool = Tool.objects.get(pk=subject.pk)
    assert (tool.consecutive_failures, tool.last_error) == (1, "tool send-email answered HTTP 503")


# --- races, with real threads and connections --------------------------------------------------


def in_threads(count: int, work: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work()
        except BaseException as exc:  # noqa: BLE001 - the test asserts on them
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


@pytest.mark.django_db(transaction=True)
def test_requests_racing_for_the_trial_let_exactly_one_through(committed_subject: Subject) -> None:
    committed_subject.set(OPEN, since=timedelta(hours=1))

    results = in_threads(8, committed_subject.admit)

    trials = [r for r in results if isinstance(r, datetime)]
    refused = [r for r in results if isinstance(r, CircuitOpen)]
    assert len(trials) == 1 and len(refused) == 7, results
    assert all(r.details["state"] == HALF_OPEN and r.retry_after is not None and r.retry_after >= 1 for r in refused)
    assert committed_subject.state() == (HALF_OPEN, 3)
    if committed_subject.kind == "agent":
        assert BreakerTransition.objects.filter(from_state=OPEN, to_state=HALF_OPEN).count() == 1


@pytest.mark.django_db(transaction=True)
def test_requests_racing_for_a_given_up_trial_let_exactly_one_through(committed_subject: Subject) -> None:
    committed_subject.set(HALF_OPEN, since=timedelta(hours=2))

    results = in_threads(8, committed_subject.admit)

    assert sum(isinstance(r, datetime) for r in results) == 1, results
    assert sum(isinstance(r, CircuitOpen) for r in results) == 7, results


@pytest.mark.django_db(transaction=True)
def test_concurrent_failures_are_all_counted_and_open_it_once(committed_subject: Subject) -> None:
    results = in_threads(8, lambda: committed_subject.fail("boom"))

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert committed_subject.state() == (OPEN, 8)
    if committed_subject.kind == "agent":
        assert list(BreakerTransition.objects.values_list("from_state", "to_state", "reason")) == [
            (CLOSED, OPEN, "3 consecutive failures, last: boom")]
