"""Model calls priced when recorded, each token type at its own rate, and rollups that always
equal the sum of the events: under concurrent writers too, and checked by rebuild_projections."""

from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from backplane.eventlog import costs, forks, services, writer
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import CostRollup, Event, ModelPrice, Task
from backplane.eventlog.writer import EventDraft
from tests.backplane.eventlog.test_concurrent_appends import run_in_threads

PROMPT = [{"role": "user", "content": "score this lead"}]


def rate(token_type: str, per_million: str, *, model: str = "m-1", version: str = "v1",
         valid_from: Any = None) -> ModelPrice:
    return ModelPrice.objects.create(provider="acme-ai", model=model, token_type=token_type,
                                     per_million=Decimal(per_million), currency="USD", version=version,
                                     valid_from=valid_from or timezone.now() - timedelta(days=1))


@pytest.fixture
def priced(db: None) -> None:
    """Five rates, each different, so a token priced at another type's rate shows."""
    for token_type, per_million in (("input", "2"), ("output", "10"), ("cache_read", "0.5"),
                                    ("cache_write", "2.5"), ("reasoning", "20")):
        rate(token_type, per_million)


def call(task: Task, *, step: int = 1, model: str = "m-1", usage: dict[str, int] | None = None, agent: str = "a",
         **extra: Any) -> Event:
    payload = {"step": step, "model": model, "provider": "acme-ai", "prompt": PROMPT,
               "prompt_sha256": prompt_sha256(PROMPT), "output": {"score": 3}, **extra}
    if usage is not None:
        payload["usage"] = usage
    return services.event_append(namespace=task.namespace, task_id=task.pk, agent=agent,
                                 draft=EventDraft(type="LLMCalled", payload=payload)).events[0]


def new_task(namespace: str = "acme", **kwargs: Any) -> Task:
    return services.task_create(namespace=namespace, kind="k", input={}, agent="a", **kwargs).task


def rollup(scope: str, key: str) -> dict[str, Any]:
    rows = CostRollup.objects.filter(scope=scope, key=key)
    return {"calls": sum(r.calls for r in rows), "cost": sum((r.cost for r in rows), Decimal(0)),
            "unpriced": sum(r.unpriced_calls for r in rows), "input": sum(r.input_tokens for r in rows),
            "reasoning": sum(r.reasoning_output_tokens for r in rows)}


USAGE = {"input_tokens": 1_000_000, "cache_read_input_tokens": 400_000, "cache_creation_input_tokens": 100_000,
         "output_tokens": 300_000, "reasoning_output_tokens": 200_000}
# 500k uncached input at 2, 400k cache reads at 0.5, 100k cache writes at 2.5, 100k output at 10,
# 200k reasoning at 20 (per million).
USAGE_COST = Decimal("1.0") + Decimal("0.2") + Decimal("0.25") + Decimal("1.0") + Decimal("4.0")


def test_each_token_type_is_priced_at_its_own_rate_and_the_version_is_kept(priced: None) -> None:
    cost = call(new_task(), usage=USAGE).payload["cost"]
    assert (cost["currency"], cost["source"], cost["price_version"]) == ("USD", "price_table", "v1")
    assert Decimal(cost["amount"]) == USAGE_COST


def test_a_rate_the_table_lacks_falls_back_and_a_price_change_never_rewrites_history(db: None) -> None:
    rate("input", "2")
    rate("output", "10")
    task = new_task()
    first = call(task, usage=USAGE)
    # Cache reads and writes at the input rate, reasoning at the output rate.
    assert Decimal(first.payload["cost"]["amount"]) == Decimal("2.0") + Decimal("3.0")
    rate("input", "1", version="v2", valid_from=timezone.now() - timedelta(seconds=1))
    second = call(task, step=2, usage={"input_tokens": 1_000_000})
    assert (second.payload["cost"]["amount"], second.payload["cost"]["price_version"]) == ("1", "v1+v2")
    first.refresh_from_db()
    assert Decimal(first.payload["cost"]["amount"]) == Decimal("5.0")


def test_an_unknown_model_is_recorded_with_usage_and_no_cost_never_a_silent_zero(priced: None) -> None:
    task = new_task()
    event = call(task, model="never-priced", usage={"input_tokens": 10})
    assert event.payload["cost"]["source"] == "unpriced" and event.payload["cost"]["amount"] is None
    assert "acme-ai/never-priced" in event.payload["cost"]["reason"]
    assert rollup("task", str(task.pk)) == {"calls": 1, "cost": 0, "unpriced": 1, "input": 10, "reasoning": 0}


def test_a_provider_reported_cost_is_kept_as_reported(priced: None) -> None:
    event = call(new_task(), usage=USAGE, cost={"amount": "0.0042", "currency": "EUR"})
    assert event.payload["cost"] == {"amount": "0.0042", "currency": "EUR", "source": "provider"}


@pytest.mark.parametrize("usage", [
    {"input_tokens": -1}, {"input_tokens": 1.5}, {"tokens": 3}, {"input_tokens": 1, "cache_read_input_tokens": 2},
    {"output_tokens": 1, "reasoning_output_tokens": 2}, {"input_tokens": True},
])
def test_usage_that_cannot_be_priced_without_guessing_is_refused(priced: None, usage: dict[str, Any]) -> None:
    task = new_task()
    with pytest.raises(InvalidInput):
        call(task, usage=usage)
    assert not Event.objects.filter(task=task, type="LLMCalled").exists() and not CostRollup.objects.exists()


@pytest.mark.parametrize("cost", [{"amount": 1, "currency": "USD"}, {"amount": "x", "currency": "USD"},
                                  {"amount": "1", "currency": "usd"}, {"amount": "1", "currency": "USD",
                                                                       "source": "price_table"}])
def test_a_reported_cost_must_be_an_amount_and_a_currency(priced: None, cost: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        call(new_task(), usage=USAGE, cost=cost)


def test_rollups_sum_a_task_its_tree_agent_model_and_namespace(priced: None) -> None:
    parent = new_task()
    child = new_task(parent_task_id=parent.pk)
    grandchild = new_task(parent_task_id=child.pk)
    call(parent, usage=USAGE, agent="planner")
    call(child, usage=USAGE, agent="researcher")
    call(grandchild, usage={"input_tokens": 7}, agent="researcher", model="never-priced")
    assert rollup("task", str(parent.pk))["cost"] == USAGE_COST
    assert rollup("tree", str(parent.pk)) == {"calls": 3, "cost": 2 * USAGE_COST, "unpriced": 1,
                                              "input": 2_000_007, "reasoning": 400_000}
    assert rollup("agent", "acme/researcher")["calls"] == 2
    assert rollup("model", "acme-ai/m-1")["cost"] == 2 * USAGE_COST
    assert rollup("namespace", "acme")["calls"] == 3
    assert costs.rollup_differences() == []
    call_command("rebuild_projections", "--check")  # exits 0


def test_one_write_over_many_tasks_adds_rows_they_share_once(priced: None) -> None:
    """The writer's statement may not update a row twice: tasks that share a rollup row (same
    namespace, agent, model and shard) have their increments merged before it runs."""
    first = new_task()
    second = new_task()
    while second.pk.int % costs.SHARDS != first.pk.int % costs.SHARDS:
        second = new_task()
    priced_call = costs.llm_called_priced({"model": "m-1", "provider": "acme-ai", "output": {}, "usage": USAGE},
                                          at=timezone.now())
    with transaction.atomic():
        tasks = [writer.lock_task(namespace="acme", task_id=task.pk) for task in (first, second)]
        writes = [writer.TaskWrite(task=task, drafts=[EventDraft(type="LLMCalled", payload=priced_call)])
                  for task in tasks]
        writer.write_events_many(writes, agent="a", now=timezone.now())
    assert rollup("namespace", "acme") == {"calls": 2, "cost": 2 * USAGE_COST, "unpriced": 0,
                                           "input": 2_000_000, "reasoning": 400_000}
    assert CostRollup.objects.filter(scope="namespace").count() == 1
    assert costs.rollup_differences() == []


def test_the_check_finds_a_rollup_that_is_not_the_sum_of_its_events(priced: None) -> None:
    call(new_task(), usage=USAGE)
    CostRollup.objects.filter(scope="namespace").update(cost=Decimal("1"))
    assert len(costs.rollup_differences()) == 1
    with pytest.raises(SystemExit) as exited:
        call_command("rebuild_projections", "--check")
    assert exited.value.code == 1


def test_a_sandboxs_model_calls_are_not_the_fleets_spending(priced: None) -> None:
    source = new_task()
    sandbox = forks.task_fork(namespace="acme", source_task_id=source.pk, at_seq=1, reason="replay",
                              forked_by="a", by_staff=False, sandbox=True).task
    call(sandbox, usage=USAGE)
    assert not CostRollup.objects.exists() and costs.rollup_differences() == []


def test_a_replayed_request_is_not_priced_or_summed_twice(priced: None) -> None:
    task = new_task()
    payload = {"step": 1, "model": "m-1", "provider": "acme-ai", "prompt_sha256": prompt_sha256(PROMPT),
               "output": {}, "usage": USAGE}
    for _ in range(2):
        services.event_append(namespace="acme", task_id=task.pk, agent="a",
                              draft=EventDraft(type="LLMCalled", payload=payload, idempotency_key="llm-1"))
    assert rollup("task", str(task.pk))["calls"] == 1


@pytest.mark.django_db(transaction=True)
def test_rollups_equal_the_events_after_concurrent_writers(committed_db: None) -> None:
    for token_type, per_million in (("input", "2"), ("output", "10")):
        rate(token_type, per_million)
    tasks = [new_task() for _ in range(6)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(index: int) -> None:
        for step in range(15):
            try:
                call(tasks[index % len(tasks)], step=index * 100 + step, agent=f"agent-{index % 3}",
                     usage={"input_tokens": 1000 + step, "output_tokens": 10})
            except BaseException as exc:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(exc)

    assert run_in_threads(12, work) == [] and errors == []
    assert Event.objects.filter(type="LLMCalled").count() == 180
    assert rollup("namespace", "acme")["calls"] == 180
    assert costs.rollup_differences() == []


def test_a_paid_tools_answer_is_summed_under_its_tool(priced: None) -> None:
    from recovery import tool_calls

    task = new_task()
    call(task, usage=USAGE)
    key = tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=2, tool="enrich", input={},
                                        agent="a", lease_epoch=None).call.pk
    tool_calls.tool_call_record_result(namespace="acme", key=key, status="succeeded", result={}, agent="a",
                                       lease_epoch=None, cost={"amount": "0.020", "currency": "USD"})
    answered = Event.objects.get(task=task, type="ToolCallResultReceived")
    assert answered.payload["cost"] == {"amount": "0.02", "currency": "USD", "source": "provider"}
    assert rollup("tool", "acme/enrich") == {"calls": 1, "cost": Decimal("0.02"), "unpriced": 0, "input": 0,
                                             "reasoning": 0}
    assert rollup("task", str(task.pk))["cost"] == USAGE_COST + Decimal("0.02")
    assert rollup("task", str(task.pk))["calls"] == 1  # model calls
    assert costs.rollup_differences() == []
    with pytest.raises(InvalidInput) as refused:
        tool_calls.tool_call_record_result(namespace="acme", key=key, status="succeeded", result={}, agent="a",
                                           lease_epoch=None, cost={"amount": "-1", "currency": "USD"})
    assert "cost.amount" in refused.value.details
