"""/metrics speaks Prometheus and reports delivery and task figures from the database, and model
calls' tokens and cost as they commit; the span that writes a model call names it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from backplane.eventlog import event_types as et
from backplane.eventlog import forks, services
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import Event, ModelPrice, Task
from backplane.eventlog.writer import EventDraft, lock_task, write_events
from backplane.telemetry import counters, gen_ai
from tests.api.conftest import AgentClient, create_task
from tests.backplane.telemetry.conftest import spans as spans  # noqa: F401 - the telemetry tests' fixture, by its name
from tests.backplane.telemetry.metrics_scrape import scrape


def test_it_reports_outbox_and_task_figures(client: Client, make_task: Callable[..., Task]) -> None:
    from backplane.delivery.models import OutboxMessage

    make_task()
    replayed = make_task()
    # A sandbox fork (a replay) is not the fleet's work: it is left out of the task figures.
    forks.task_fork(namespace=replayed.namespace, source_task_id=replayed.pk, at_seq=1, reason="replay",
                    forked_by="alice", by_staff=False, sandbox=True)
    # One of the two lifecycle messages is under a relay's claim right now.
    first = OutboxMessage.objects.earliest("id")
    OutboxMessage.objects.filter(pk=first.pk).update(claimed_until=timezone.now() + timedelta(seconds=30))
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    assert samples[("backplane_outbox_messages", (("state", "pending"),))] == 2
    assert samples[("backplane_outbox_messages", (("state", "in_flight"),))] == 1
    assert samples[("backplane_outbox_messages", (("state", "held"),))] == 0
    assert samples[("backplane_tasks", (("status", "pending"),))] == 2
    assert samples[("backplane_dead_letters_pending", ())] == 0
    assert ("backplane_outbox_lag_seconds", ()) in samples


# --- model calls (backplane/telemetry/gen_ai.py, counters.model_calls_count_after_commit) ----------

PROMPT = [{"role": "user", "content": "score this lead"}]
TOKENS = "backplane_gen_ai_client_token_usage"
COST = "backplane_gen_ai_cost_total"
CALLS = "backplane_gen_ai_calls_total"


def model_call_payload(model: str, usage: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"step": 1, "model": model, "provider": "acme-ai", "prompt": PROMPT, "prompt_sha256": prompt_sha256(PROMPT),
            "output": {"score": 3}, "usage": usage, **extra}


def model_call(task: Task, model: str, usage: dict[str, int], **extra: Any) -> Event:
    return services.event_append(namespace=task.namespace, task_id=task.pk, agent="alice",
                                 draft=EventDraft(type=et.LLM_CALLED,
                                                  payload=model_call_payload(model, usage, **extra))).events[0]


@pytest.fixture
def price_table(committed_db: None) -> None:
    for token_type, per_million in (("input", "2"), ("output", "10"), ("reasoning", "20")):
        ModelPrice.objects.create(provider="acme-ai", model="gauge-large", token_type=token_type,
                                  per_million=Decimal(per_million), currency="USD", version="v1",
                                  valid_from=timezone.now() - timedelta(days=1))


def test_model_calls_are_counted_by_token_type_model_and_currency_once_they_commit(
        price_table: None, client: Client, make_task: Callable[..., Task]) -> None:
    task = make_task(namespace="gauges")
    before = scrape(client)
    usage = {"input_tokens": 1_000_000, "cache_read_input_tokens": 250_000, "output_tokens": 100_000,
             "reasoning_output_tokens": 40_000}
    priced = model_call(task, "gauge-large", usage)
    reported = model_call(task, "gauge-large", {"input_tokens": 10, "output_tokens": 5},
                          cost={"amount": "0.25", "currency": "EUR"})
    model_call(task, "gauge-unpriced", {"input_tokens": 70, "output_tokens": 3})

    class RolledBack(Exception):
        pass

    with pytest.raises(RolledBack), transaction.atomic():
        # The writer's own path, as every service takes it (the follow-ups run in here), with
        # the call as the service priced it.
        write_events(lock_task(namespace="gauges", task_id=task.pk),
                     [EventDraft(type=et.LLM_CALLED, payload=priced.payload)], agent="alice", now=timezone.now())
        raise RolledBack
    # A sandbox replays its source's record: its calls are not the fleet's spending.
    sandbox = forks.task_fork(namespace="gauges", source_task_id=task.pk, at_seq=1, reason="replay",
                              forked_by="alice", by_staff=False, sandbox=True).task
    model_call(sandbox, "gauge-large", usage)
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return after.moved_since(before, name, **labels)

    amount = Decimal(priced.payload["cost"]["amount"])
    assert amount == Decimal("3.4")  # 1 M input at 2, 60 k output at 10 and 40 k reasoning at 20 per million
    assert moved(COST, namespace="gauges", model="gauge-large", currency="USD") == pytest.approx(float(amount))
    assert moved(COST, namespace="gauges", model="gauge-large", currency="EUR") == pytest.approx(0.25)
    assert reported.payload["cost"]["source"] == "provider"
    assert moved(CALLS, namespace="gauges", model="gauge-large", cost_source="price_table") == 1
    assert moved(CALLS, namespace="gauges", model="gauge-large", cost_source="provider") == 1
    # The call with no price is counted as such, and adds no cost in any currency.
    assert moved(CALLS, namespace="gauges", model="gauge-unpriced", cost_source="unpriced") == 1
    assert not [key for key in after.samples if key[0] == COST and ("model", "gauge-unpriced") in key[1]]
    # Tokens: one observation per call of its input and output, and of the parts it had.
    large = {"provider": "acme-ai", "model": "gauge-large"}
    assert moved(f"{TOKENS}_count", token_type="input", **large) == 2
    assert moved(f"{TOKENS}_sum", token_type="input", **large) == 1_000_010
    assert moved(f"{TOKENS}_sum", token_type="output", **large) == 100_005
    assert moved(f"{TOKENS}_count", token_type="cache_read_input", **large) == 1
    assert moved(f"{TOKENS}_sum", token_type="cache_read_input", **large) == 250_000
    assert moved(f"{TOKENS}_sum", token_type="reasoning_output", **large) == 40_000
    assert moved(f"{TOKENS}_count", token_type="cache_creation_input", **large) == 0
    assert moved(f"{TOKENS}_bucket", token_type="input", le="16.0", **large) == 1  # the 10-token call
    assert moved(f"{TOKENS}_sum", token_type="input", provider="acme-ai", model="gauge-unpriced") == 70


def test_the_model_call_event_type_and_token_types_are_the_event_logs() -> None:
    assert gen_ai.MODEL_CALL_TYPE == et.LLM_CALLED
    assert tuple(gen_ai.TOKEN_TYPES) == et.USAGE_KEYS


def test_model_and_namespace_labels_stay_bounded() -> None:
    assert counters.model_label("claude-3-5-sonnet@20240620") == "claude-3-5-sonnet@20240620"
    assert counters.model_label("meta-llama/Llama-3-70b") == "meta-llama/Llama-3-70b"
    assert counters.model_label("x" * 200) == "other"
    assert counters.model_label("bad model name") == "other"
    many = counters.BoundedLabel(limit=2, pattern=r"[a-z]+")
    assert [many(name) for name in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]


def test_the_write_span_of_a_model_call_names_its_model_provider_and_tokens(
        spans: InMemorySpanExporter) -> None:
    created = services.agent_create(name="alice", namespace="acme", kinds=())
    alice = AgentClient()
    alice.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
    task = create_task(alice)
    usage = {"input_tokens": 1200, "cache_read_input_tokens": 800, "output_tokens": 300}
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                          {"type": et.LLM_CALLED, "payload": model_call_payload("gauge-large", usage)}, format="json")
    assert response.status_code == 201, response.content
    (server,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER and "events" in s.name]
    attributes = dict(server.attributes or {})
    assert {name: attributes.get(name) for name in (
        "gen_ai.request.model", "gen_ai.provider.name", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens")} == {
        "gen_ai.request.model": "gauge-large", "gen_ai.provider.name": "acme-ai", "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 300, "gen_ai.usage.cache_read.input_tokens": 800}
    assert "gen_ai.usage.reasoning.output_tokens" not in attributes
    assert attributes["backplane.event.type"] == et.LLM_CALLED
    # A write of no model call carries none of them.
    spans.clear()
    alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {"type": "ReasoningStepCompleted", "payload": {"step": 2}},
               format="json")
    (server,) = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER and "events" in s.name]
    assert not [name for name in (server.attributes or {}) if name.startswith("gen_ai.")]
