"""The circuit breaker per agent: open -> half-open -> closed, visible and resettable."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from backplane.eventlog import services
from backplane.eventlog.models import Agent, BreakerTransition, Task
from backplane.eventlog.writer import EventDraft
from recovery import breakers, detector, leases
from recovery.errors import CircuitOpen
from tests.api.conftest import assert_error


def fail_one(agent: Agent, *, retryable: bool = False) -> None:
    services.task_create(namespace=agent.namespace, kind="k", input={"t": timezone.now().isoformat()}, agent="x")
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None
    services.event_append(namespace=agent.namespace, task_id=claim.task.pk, agent=agent.name,
                          lease_epoch=claim.lease_epoch,
                          draft=EventDraft(type="TaskFailed", payload={"error": "boom", "retryable": retryable}))


def cool_down(agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(breaker_opened_at=timezone.now() - timedelta(hours=1))


@pytest.fixture
def flaky(db) -> Agent:  # type: ignore[no-untyped-def]
    return services.agent_create(name="flaky", namespace="acme").agent


def test_three_failures_open_it_and_claims_get_503_with_retry_after(flaky, settings) -> None:  # type: ignore[no-untyped-def]
    from rest_framework.test import APIClient

    for _ in range(2):
        fail_one(flaky)
    flaky.refresh_from_db()
    assert (flaky.breaker_state, flaky.consecutive_failures) == ("closed", 2)
    fail_one(flaky)
    flaky.refresh_from_db()
    assert flaky.breaker_state == "open"
    services.task_create(namespace="acme", kind="k", input={"waiting": True}, agent="x")
    with pytest.raises(CircuitOpen) as caught:
        leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)
    retry_after = caught.value.retry_after
    assert retry_after is not None and 1 <= retry_after <= settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS

    token = services.agent_rotate_token(agent_id=flaky.pk).token
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post("/api/v1/leases/", {}, format="json")
    assert_error(response, 503, "circuit_open")
    assert int(response["Retry-After"]) >= 1
    assert Task.objects.filter(input={"waiting": True}, status="pending").exists()  # nothing claimed
    assert list(BreakerTransition.objects.filter(agent=flaky).values_list("from_state", "to_state")) == [
        ("closed", "open")]


def test_after_the_cool_down_one_trial_goes_through_and_success_closes_it(flaky) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    services.task_create(namespace="acme", kind="k", input={"trial": True}, agent="x")
    trial = leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)
    assert trial is not None
    flaky.refresh_from_db()
    assert flaky.breaker_state == "half_open"
    with pytest.raises(CircuitOpen):  # only one trial at a time
        leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)
    services.event_append(namespace="acme", task_id=trial.task.pk, agent="flaky", lease_epoch=trial.lease_epoch,
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))
    flaky.refresh_from_db()
    assert (flaky.breaker_state, flaky.consecutive_failures) == ("closed", 0)
    assert list(BreakerTransition.objects.filter(agent=flaky).order_by("at", "id")
                .values_list("to_state", flat=True)) == ["open", "half_open", "closed"]


def test_a_failed_trial_opens_it_again(flaky) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    fail_one(flaky)  # the trial claim fails
    flaky.refresh_from_db()
    assert flaky.breaker_state == "open" and flaky.breaker_opened_at > timezone.now() - timedelta(minutes=1)


def test_a_trial_claim_that_finds_no_task_hands_the_trial_to_the_next_claim(flaky) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    assert leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30) is None
    flaky.refresh_from_db()
    assert flaky.breaker_state == "open"

    services.task_create(namespace="acme", kind="k", input={"later": True}, agent="x")
    assert leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30) is not None
    assert list(BreakerTransition.objects.filter(agent=flaky).order_by("at", "id").values_list(
        "to_state", "reason")) == [
        ("open", "3 consecutive failures, last: TaskFailed: boom"),
        ("half_open", "cool-down over: one trial goes through"),
        ("open", "trial claim found no task"),
        ("half_open", "cool-down over: one trial goes through"),
    ]


def test_a_trial_released_without_a_verdict_is_given_up_after_the_patience(flaky, settings) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    services.task_create(namespace="acme", kind="k", input={"trial": True}, agent="x")
    trial = leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)
    assert trial is not None
    # A release is no verdict: the breaker still waits for the trial.
    leases.lease_release(namespace="acme", task_id=trial.task.pk, lease_epoch=trial.lease_epoch, agent=flaky.name)
    with pytest.raises(CircuitOpen):
        leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)

    patience = settings.BACKPLANE_NO_PROGRESS_STALL_SECONDS + settings.BACKPLANE_BREAKER_COOLDOWN_SECONDS
    # While half-open, breaker_opened_at is when the trial was let through.
    Agent.objects.filter(pk=flaky.pk).update(breaker_opened_at=timezone.now() - timedelta(seconds=patience + 1))
    again = leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)

    assert again is not None and again.task.pk == trial.task.pk
    flaky.refresh_from_db()
    assert flaky.breaker_state == "half_open"
    assert list(BreakerTransition.objects.filter(agent=flaky).order_by("at", "id")
                .values_list("to_state", flat=True)) == ["open", "half_open", "half_open"]


def test_an_expired_lease_counts_as_a_failure(flaky) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        services.task_create(namespace="acme", kind="k", input={"t": timezone.now().isoformat()}, agent="x")
        claim = leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30)
        assert claim is not None
        Task.objects.filter(pk=claim.task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        detector.lease_expire_stalled()
    flaky.refresh_from_db()
    assert flaky.breaker_state == "open"


def test_an_operator_can_reset_it(flaky) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fail_one(flaky)
    breakers.breaker_reset(agent_id=flaky.pk, decided_by="user:op")
    flaky.refresh_from_db()
    assert (flaky.breaker_state, flaky.consecutive_failures) == ("closed", 0)
    reset = BreakerTransition.objects.filter(agent=flaky).latest("at")
    assert (reset.to_state, reset.decided_by) == ("closed", "user:op")


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_after_the_cool_down_let_exactly_one_trial_through(committed_db) -> None:  # type: ignore[no-untyped-def]
    flaky = services.agent_create(name="flaky", namespace="acme").agent
    for _ in range(3):
        fail_one(flaky)
    cool_down(flaky)
    for n in range(5):
        services.task_create(namespace="acme", kind="k", input={"n": n}, agent="x")
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def claim() -> None:
        try:
            barrier.wait()
            outcomes.append("claimed" if leases.lease_claim(agent=flaky, kinds=None, lease_seconds=30) else "none")
        except CircuitOpen:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["claimed"] + ["refused"] * 5
