"""Spend on the pages: the overview's panel, a task's own and tree figures, each model call's row
and timeline point (and a paid tool's charge), each agent's last 24 h. Every figure is checked
against the rollups and against the events themselves; calls with no price are shown as such."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backplane.eventlog import event_types as et
from backplane.eventlog import forks, services
from backplane.eventlog.event_types import USAGE_KEYS, prompt_sha256
from backplane.eventlog.models import CostRollup, Event, ModelPrice, Task
from backplane.eventlog.writer import EventDraft
from dashboard.selectors.spend import SPEND_TOP, agent_spend, spend_today, task_spend
from dashboard.text import money_text, spend_summary
from recovery.tool_calls import tool_call_dispatch, tool_call_record_result
from tests.dashboard.conftest import History, html

PROMPT = [{"role": "user", "content": "score this lead"}]
# Per million: input 2, output 10, cache reads 0.5, reasoning 20 (cache writes at the input rate).
RATES = {"input": "2", "output": "10", "cache_read": "0.5", "reasoning": "20"}


@pytest.fixture
def priced(db: None) -> None:
    for model in ("m-large", "m-small"):
        for token_type, per_million in RATES.items():
            ModelPrice.objects.create(provider="acme-ai", model=model, token_type=token_type,
                                      per_million=Decimal(per_million) / (1 if model == "m-large" else 4),
                                      currency="USD", version="v1", valid_from=timezone.now() - timedelta(days=1))


def model_call(task: Task, *, agent: str | None, model: str = "m-large", step: int = 1,
               usage: dict[str, int] | None = None, lease_epoch: int | None = None, **extra: Any) -> Event:
    payload = {"step": step, "model": model, "provider": "acme-ai", "prompt": PROMPT,
               "prompt_sha256": prompt_sha256(PROMPT), "output": {"score": 3}, **extra}
    payload["usage"] = usage or {"input_tokens": 1200, "output_tokens": 300}
    return services.event_append(namespace=task.namespace, task_id=task.pk, agent=agent, lease_epoch=lease_epoch,
                                 draft=EventDraft(type=et.LLM_CALLED, payload=payload)).events[0]


@dataclass
class Calls:
    history: History
    events: list[Event]


@pytest.fixture
def calls(priced: None, make_history: Any) -> Calls:
    """A task and its sub-agent calling models: priced at the table's rates, one the provider
    priced in EUR, two with no price; and a sandbox's call, which is no spending."""
    history: History = make_history()
    parent, child, epoch = history.task, history.child, history.epoch
    events = [
        model_call(parent, agent="qualifier-1", lease_epoch=epoch,
                   usage={"input_tokens": 10_000, "cache_read_input_tokens": 4_000, "output_tokens": 2_000,
                          "reasoning_output_tokens": 500}),
        model_call(parent, agent="qualifier-1", lease_epoch=epoch, model="m-small", step=2),
        model_call(parent, agent="qualifier-1", lease_epoch=epoch, model="never-priced", step=3),
        model_call(child, agent="enricher-2", step=1, cost={"amount": "0.0300", "currency": "EUR"}),
        model_call(child, agent="enricher-2", model="m-small", step=2),
        model_call(child, agent=None, model="never-priced", step=3, usage={"input_tokens": 7, "output_tokens": 1}),
    ]
    # A paid tool: its answer carries what it charged, summed with the model calls.
    paid = tool_call_dispatch(namespace="acme", task_id=parent.pk, step=4, tool="enrich-api", input={},
                              agent="qualifier-1", lease_epoch=epoch)
    tool_call_record_result(namespace="acme", key=paid.call.pk, status="succeeded", result={"ok": True},
                            agent="qualifier-1", lease_epoch=epoch, cost={"amount": "0.0200", "currency": "USD"})
    events.append(Event.objects.get(task=parent, type=et.TOOL_CALL_RESULT_RECEIVED, payload__tool="enrich-api"))
    sandbox = forks.task_fork(namespace=None, source_task_id=parent.pk, at_seq=3, reason="replay",
                              forked_by="user:olivia", by_staff=True, sandbox=True).task
    model_call(sandbox, agent="qualifier-1", usage={"input_tokens": 9_999_999, "output_tokens": 9_999_999})
    return Calls(history=history, events=events)


def model_calls(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == et.LLM_CALLED]


def summed(events: list[Event]) -> dict[str, Any]:
    """What ``events`` add up to, from their payloads alone: the cost of model calls and paid
    tools' answers; the calls (with no price) and tokens of the model calls."""
    cost: dict[str, Decimal] = defaultdict(Decimal)
    tokens = dict.fromkeys(USAGE_KEYS, 0)
    unpriced = 0
    for event in events:
        recorded = event.payload["cost"]
        if recorded["amount"] is None:
            unpriced += 1
        else:
            cost[recorded["currency"]] += Decimal(recorded["amount"])
        for key in USAGE_KEYS:
            tokens[key] += event.payload.get("usage", {}).get(key, 0)
    return {"calls": len(model_calls(events)), "unpriced_calls": unpriced, "tokens": tokens, "cost": dict(cost)}


def rolled_up(scope: str, key: str | None = None) -> dict[str, Any]:
    """The rollups of a scope (one key, or all), shards and hours summed, currencies apart."""
    rows = CostRollup.objects.filter(scope=scope, **({"key": key} if key else {}))
    cost: dict[str, Decimal] = defaultdict(Decimal)
    for row in rows:
        if row.currency:
            cost[row.currency] += row.cost
    return {"calls": sum(r.calls for r in rows), "unpriced_calls": sum(r.unpriced_calls for r in rows),
            "tokens": {key: sum(getattr(r, key) for r in rows) for key in USAGE_KEYS}, "cost": dict(cost)}


def shown(spend: dict[str, Any]) -> dict[str, Any]:
    """A spend as a page's JSON has it, with its amounts as decimals."""
    return {**spend, "cost": {currency: Decimal(amount) for currency, amount in spend["cost"].items()}}


def json_script(page: str, element_id: str) -> Any:
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', page, re.S)
    assert match, f"no {element_id}"
    return json.loads(match.group(1))


def tile_value(page: str, name: str) -> str:
    match = re.search(rf'data-tile="{name}".*?<div class="tile-value">(.*?)</div>', page, re.S)
    assert match, f"no tile {name}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def amounts(fragment: str) -> dict[str, Decimal]:
    return {currency: Decimal(amount)
            for currency, amount in re.findall(r'data-currency="(\w+)" data-amount="([\d.]+)"', fragment)}


def field(page: str, name: str) -> str:
    match = re.search(rf'data-field="{name}">(.*?)</div>', page, re.S)
    assert match, f"no {name}"
    return match.group(1)


# --- the overview ---------------------------------------------------------------------------------


def test_the_overview_panel_is_todays_rollups_and_equals_the_events(olivia_client: Client, calls: Calls) -> None:
    page = html(olivia_client.get("/"))
    data = json_script(page, "spend-data")
    assert shown(data["total"]) == summed(calls.events) == rolled_up("namespace", "acme")
    assert data["total"]["calls"] == 6 and data["total"]["unpriced_calls"] == 2
    assert set(data["currencies"]) == {"USD", "EUR"}

    def key_of(scope: str, event: Event) -> tuple[str, str]:
        if scope == "agent":
            return "agent", f"acme/{event.agent or ''}"
        if event.type == et.LLM_CALLED:
            return "model", f"acme-ai/{event.payload['model']}"
        return "tool", f"acme/{event.payload['tool']}"

    # Per model or tool and per agent, each bar is its rollup, and its rollup is its events' sum.
    for group, scope in (("by_model", "model"), ("by_agent", "agent")):
        chart = data[group]
        for index, (row_scope, key) in enumerate(zip(chart["scopes"], chart["keys"], strict=True)):
            events = [e for e in calls.events if key_of(scope, e) == (row_scope, key)]
            want = summed(events)
            if row_scope == "tool":  # a tool's rows count its paid answers
                want["calls"] = len(events)
            assert want == rolled_up(row_scope, key), key
            assert {c: Decimal(v["amounts"][index]) for c, v in chart["cost"].items() if Decimal(v["amounts"][index])} \
                == want["cost"], key
            assert chart["calls"][index] == want["calls"] and chart["unpriced_calls"][index] == want["unpriced_calls"]
            parts = {part: values[index] for part, values in chart["tokens"].items()}
            assert sum(parts.values()) == want["tokens"]["input_tokens"] + want["tokens"]["output_tokens"], key
        assert len(chart["keys"]) == len({key_of(scope, e) for e in calls.events})
    tool = data["by_model"]["labels"].index("tool acme/enrich-api")
    assert data["by_model"]["summary"][tool] == "0.02 USD · 1 paid answer"
    # The calls with no price: counted, and shown as such beside their model, never as 0.
    never = data["by_model"]["labels"].index("acme-ai/never-priced")
    assert data["by_model"]["unpriced_text"][never] == "2 calls with no price"
    assert all(not Decimal(v["amounts"][never]) for v in data["by_model"]["cost"].values())
    assert data["by_model"]["cost"]["USD"]["text"][never] == ""
    assert tile_value(page, "unpriced-today") == "2"
    assert '<span class="unpriced">+ 2 calls with no price</span>' in page and "cost unknown, not zero" in page
    assert tile_value(page, "calls-today") == "6" and "3 models" in page
    figures = page.split('id="spend-figures"')[1].split("</section>")[0]
    assert amounts(figures) == summed(calls.events)["cost"]
    # The overview's live read carries the same figures and data.
    live = olivia_client.get("/live/overview/?after_position=0").json()
    assert live["spend_chart"] == data and amounts(live["spend"]) == summed(calls.events)["cost"]


def test_only_todays_hours_are_in_the_panel(calls: Calls) -> None:
    today = spend_today()
    assert today.total.calls == 6
    assert today.since == timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert spend_today(now=timezone.now() + timedelta(days=1)).total.calls == 0


def test_with_no_model_call_the_panel_says_so(olivia_client: Client, make_history: Any) -> None:
    make_history()
    page = html(olivia_client.get("/"))
    assert json_script(page, "spend-data")["total"]["calls"] == 0
    assert '<p class="muted" id="spend-empty">No model call or paid tool recorded today.</p>' in page
    assert tile_value(page, "spend-today") == "—" and tile_value(page, "unpriced-today") == "0"


def test_a_day_of_paid_tools_only_is_spend_with_no_model_call(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    paid = tool_call_dispatch(namespace="acme", task_id=history.task.pk, step=9, tool="enrich-api", input={},
                              agent="qualifier-1", lease_epoch=history.epoch)
    tool_call_record_result(namespace="acme", key=paid.call.pk, status="succeeded", result={}, agent="qualifier-1",
                            lease_epoch=history.epoch, cost={"amount": "0.5", "currency": "USD"})
    page = html(olivia_client.get("/"))
    data = json_script(page, "spend-data")
    assert data["total"] == {"calls": 0, "unpriced_calls": 0, "tokens": dict.fromkeys(USAGE_KEYS, 0),
                             "cost": {"USD": "0.5"}}
    assert data["by_model"]["labels"] == ["tool acme/enrich-api"] and data["by_model"]["calls"] == [1]
    assert 'id="spend-empty" hidden' in page and tile_value(page, "spend-today") == "0.50 USD"
    own = field(html(olivia_client.get(f"/tasks/{history.task.pk}/")), "spend-own")
    assert amounts(own) == {"USD": Decimal("0.5")} and "no model calls" in own and "tokens" not in own


def test_a_long_list_keeps_the_biggest_and_folds_the_rest(priced: None, make_task: Any) -> None:
    task = make_task()
    for n in range(SPEND_TOP + 3):
        model_call(task, agent=f"agent-{n:02d}", usage={"input_tokens": 1000 * (n + 1), "output_tokens": 1})
    by_agent = spend_today().by_agent
    assert len(by_agent) == SPEND_TOP
    assert [row.key for row in by_agent[:2]] == [f"acme/agent-{SPEND_TOP + 2:02d}",
                                                f"acme/agent-{SPEND_TOP + 1:02d}"]
    assert by_agent[-1].label == "4 more" and by_agent[-1].spend.calls == 4
    summary = spend_summary(by_agent[-1].scope, by_agent[-1].spend)
    assert summary.startswith("0.0") and " · 4 calls · " in summary
    assert sum(row.spend.calls for row in by_agent) == SPEND_TOP + 3


# --- a task ---------------------------------------------------------------------------------------


def test_a_root_task_shows_its_own_calls_and_its_tree_with_its_sub_agents(olivia_client: Client,
                                                                          calls: Calls) -> None:
    parent, child = calls.history.task, calls.history.child
    own = [e for e in calls.events if e.task_id == parent.pk]
    page = html(olivia_client.get(f"/tasks/{parent.pk}/"))
    own_field, tree_field = field(page, "spend-own"), field(page, "spend-tree")
    assert summed(own) == rolled_up("task", str(parent.pk))
    # The paid tool's charge is in the task's spend; the calls are its model calls.
    assert amounts(own_field) == summed(own)["cost"] and "3 model calls" in own_field
    assert "1 call with no price" in own_field
    assert "With its sub-agents" in page
    assert amounts(tree_field) == summed(calls.events)["cost"] == rolled_up("tree", str(parent.pk))["cost"]
    assert "6 model calls" in tree_field and "2 calls with no price" in tree_field
    assert f"{summed(calls.events)['tokens']['input_tokens']:,} in" in tree_field
    spend = task_spend(child)
    assert (spend.root_id, spend.is_root) == (parent.pk, False)


def test_a_sub_agents_page_shows_its_own_calls_and_its_roots_tree_labelled_so(olivia_client: Client,
                                                                              calls: Calls) -> None:
    parent, child = calls.history.task, calls.history.child
    own = [e for e in calls.events if e.task_id == child.pk]
    page = html(olivia_client.get(f"/tasks/{child.pk}/"))
    assert amounts(field(page, "spend-own")) == summed(own)["cost"] == rolled_up("task", str(child.pk))["cost"]
    tree_field = field(page, "spend-tree")
    assert "Its root's whole tree" in page
    assert amounts(tree_field) == summed(calls.events)["cost"]
    assert f'data-relation="root" href="/tasks/{parent.pk}/"' in tree_field
    # The live read renders the same header.
    header = olivia_client.get(f"/tasks/{child.pk}/live/?after_seq=0").json()["header"]
    assert amounts(field(header, "spend-tree")) == summed(calls.events)["cost"]


def test_a_task_without_model_calls_says_so_and_a_sandbox_is_no_spending(olivia_client: Client, make_task: Any,
                                                                        calls: Calls) -> None:
    page = html(olivia_client.get(f"/tasks/{make_task().pk}/"))
    assert "no model calls, no paid tools" in field(page, "spend-own")
    assert "no model calls, no paid tools" in field(page, "spend-tree")
    sandbox = Task.objects.get(sandbox=True)
    page = html(olivia_client.get(f"/tasks/{sandbox.pk}/"))
    assert "its calls are not spending" in field(page, "spend-own")
    # Its call's recorded cost is still on its row.
    assert 'data-field="call-cost"' in page


def test_each_model_call_shows_its_model_tokens_and_cost_in_its_row_and_on_the_timeline(
        olivia_client: Client, calls: Calls) -> None:
    parent = calls.history.task
    first, _, unpriced = (e for e in model_calls(calls.events) if e.task_id == parent.pk)
    page = html(olivia_client.get(f"/tasks/{parent.pk}/"))
    row = page.split(f'id="seq-{first.seq}"')[1].split("</tr>")[0]
    cost = first.payload["cost"]
    assert 'data-field="call-cost"' in row and "acme-ai/m-large" in row
    assert "10,000 (4,000 cache read) in / 2,000 (500 reasoning) out tokens" in row
    assert f'title="{cost["amount"]} USD, from the price table, version v1"' in row
    unpriced_row = page.split(f'id="seq-{unpriced.seq}"')[1].split("</tr>")[0]
    assert '<span class="unpriced" title="no price for acme-ai/never-priced">no price</span>' in unpriced_row

    timeline = json_script(page, "timeline-data")
    points = [p for p in timeline["points"] if p["kind"] == "model_call"]
    assert [p["seq"] for p in points] == [e.seq for e in model_calls(calls.events) if e.task_id == parent.pk]
    assert points[0]["label"] == (f"model call acme-ai/m-large · step 1 · 10,000 (4,000 cache read) in / 2,000 "
                                f"(500 reasoning) out tokens · {money_text(Decimal(cost['amount']), 'USD')}"
                                f" (seq {first.seq})")
    assert points[2]["label"].endswith(f"· no price (seq {unpriced.seq})")
    # A paid tool's answer: its charge on its row, and on its bar.
    (paid,) = [e for e in calls.events if e.type == et.TOOL_CALL_RESULT_RECEIVED]
    paid_row = page.split(f'id="seq-{paid.seq}"')[1].split("</tr>")[0]
    charged = '<span class="money" title="0.02 USD, as the tool reported it">0.02 USD</span>'
    assert f"enrich-api charged {charged}" in paid_row
    bars = [span["label"] for span in timeline["spans"] if span["kind"] == "tool_call"]
    assert any(text.startswith("enrich-api · step 4 · succeeded · charged 0.02 USD · ") for text in bars), bars


def test_money_is_shown_in_cents_from_one_and_two_significant_digits_below() -> None:
    assert money_text(Decimal("1234.5678"), "USD") == "1,234.57 USD"
    assert money_text(Decimal("0.5"), "USD") == "0.50 USD"
    assert money_text(Decimal("0.004234"), "EUR") == "0.0042 EUR"
    assert money_text(Decimal("0"), "USD") == "0.00 USD"
    assert money_text(Decimal("0.0200"), "USD") == "0.02 USD"
    assert money_text(Decimal("0.0050"), "USD") == "0.005 USD"
    assert money_text(Decimal("0.0585"), "USD") == "0.059 USD"


# --- agents ---------------------------------------------------------------------------------------


def test_the_agents_page_shows_each_agents_calls_tokens_and_spend_of_the_last_24_hours(
        olivia_client: Client, calls: Calls) -> None:
    services.agent_create(name="enricher-2", namespace="acme")
    page = html(olivia_client.get("/agents/"))
    for name in ("qualifier-1", "enricher-2"):
        events = [e for e in calls.events if e.agent == name]
        row = page.split(f'data-agent="acme/{name}"')[1].split("</tr>")[0]
        assert amounts(row) == summed(events)["cost"] == rolled_up("agent", f"acme/{name}")["cost"], name
        calls_cell = row.split('data-field="calls-24h">')[1].split("</td>")[0]
        assert calls_cell.startswith(f"{len(model_calls(events))}<br>")
        assert f"{summed(events)['tokens']['input_tokens']:,} in" in calls_cell
    qualifier = page.split('data-agent="acme/qualifier-1"')[1].split("</tr>")[0]
    assert "1 call with no price" in qualifier
    # The backplane's own call (no agent) is listed apart, with no price, shown as such.
    others = page.split('id="other-spend-table"')[1].split("</table>")[0]
    assert 'data-spender="acme/"' in others and "acme/backplane" in others and "1 call with no price" in others
    # Calls older than 24 h are not in the figures.
    assert agent_spend(now=timezone.now() + timedelta(hours=24)).by_key == {}


# --- queries --------------------------------------------------------------------------------------


def count_queries(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200, path
    return len(captured.captured_queries)


def test_the_panels_cost_one_query_each_whatever_the_number_of_models_and_agents(
        olivia_client: Client, calls: Calls, django_assert_max_num_queries: Any) -> None:
    parent, child = calls.history.task, calls.history.child
    paths = ["/", "/live/overview/?after_position=0", f"/tasks/{parent.pk}/", f"/tasks/{child.pk}/live/?after_seq=0",
             "/agents/"]
    before = [count_queries(olivia_client, path) for path in paths]
    for n in range(30):
        model_call(child, agent=f"agent-{n}", model="m-small" if n % 2 else f"unpriced-{n}", step=n + 10)
        services.agent_create(name=f"agent-{n}", namespace="acme")
    assert [count_queries(olivia_client, path) for path in paths] == before
    with django_assert_max_num_queries(1):
        spend_today()
    with django_assert_max_num_queries(1):
        task_spend(child)
    with django_assert_max_num_queries(1):
        agent_spend()
