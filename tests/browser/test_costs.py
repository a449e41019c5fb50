"""Spend in the browser: the overview's cost panel (today's cost and tokens by model or paid tool
and by agent, the calls with no price shown as such), a sub-agent's page with its own cost and
its root's tree, each model call's hover on the timeline, and the agents page's last 24 h."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from backplane.eventlog import event_types as et
from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import Event, ModelPrice
from dashboard.text import money_text
from tests.browser.conftest import (
    SCREENSHOT_DIR,
    ApiAgent,
    assert_not_reloaded,
    mark_document,
    scrolled_to_top,
    wait_live,
)
from tests.browser.fleet import claim_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
PROMPT = [{"role": "user", "content": "Qualify this lead and say why."}]
# Per million tokens, as a contract's rates might read.
RATES = {"claude-large": {"input": "3", "output": "15", "cache_read": "0.3", "reasoning": "15"},
         "claude-small": {"input": "0.8", "output": "4"}}


@dataclass
class Story:
    root_id: str
    child_id: str
    child_calls: list[int]  # the seqs of the sub-agent's model calls
    qualifier: ApiAgent
    epoch: int  # the qualifier's lease of the root task


def model_call(agent: ApiAgent, task_id: str, epoch: int, *, step: int, model: str, usage: dict[str, int],
               **extra: Any) -> int:
    payload = {"step": step, "model": model, "provider": "anthropic", "prompt": PROMPT,
               "prompt_sha256": prompt_sha256(PROMPT), "output": {"text": f"step {step}"}, "usage": usage, **extra}
    return int(agent.append(task_id, et.LLM_CALLED, payload, lease_epoch=epoch)["seq"])


@pytest.fixture
def story(make_agent: Callable[..., ApiAgent]) -> Story:
    """A qualifier that calls two priced models and one the table does not know, and a sub-agent
    (an enricher) that calls a model and once reports the provider's own cost."""
    for model, rates in RATES.items():
        for token_type, per_million in rates.items():
            ModelPrice.objects.create(provider="anthropic", model=model, token_type=token_type,
                                      per_million=Decimal(per_million), currency="USD", version="2026-01",
                                      valid_from=timezone.now() - timedelta(days=30))
    qualifier, enricher = make_agent("qualifier-1"), make_agent("enricher-2")
    root = qualifier.create_task("lead-qualification", {"lead": "ada@example.com"})
    epoch = claim_task(qualifier, root)
    model_call(qualifier, root["task_id"], epoch, step=1, model="claude-large",
               usage={"input_tokens": 42_000, "cache_read_input_tokens": 30_000, "output_tokens": 3_100,
                      "reasoning_output_tokens": 1_200})
    for step in (2, 3):
        model_call(qualifier, root["task_id"], epoch, step=step, model="claude-small",
                   usage={"input_tokens": 8_000 * step, "output_tokens": 900})
    model_call(qualifier, root["task_id"], epoch, step=4, model="in-house-finetune",
               usage={"input_tokens": 5_000, "output_tokens": 400})
    # A paid tool, whose answer says what it charged.
    lookup = qualifier.tool_call(root["task_id"], step=5, tool="company-lookup", lease_epoch=epoch)
    qualifier.call("POST", f"/api/v1/tool-calls/{lookup['idempotency_key']}/result/", 201,
                   json={"status": "succeeded", "result": {"employees": 120}, "lease_epoch": epoch,
                         "cost": {"amount": "0.0250", "currency": "USD"}})
    child = qualifier.subtask(root["task_id"], step=6, kind="enrichment", lease_epoch=epoch,
                              input={"domain": "example.com"})
    child_id = child["task"]["task_id"]
    child_epoch = claim_task(enricher, child["task"])
    child_calls = [
        model_call(enricher, child_id, child_epoch, step=1, model="claude-large",
                   usage={"input_tokens": 12_000, "output_tokens": 1_500}),
        model_call(enricher, child_id, child_epoch, step=2, model="claude-small",
                   usage={"input_tokens": 6_000, "output_tokens": 700}, cost={"amount": "0.0091", "currency": "USD"}),
        model_call(enricher, child_id, child_epoch, step=3, model="in-house-finetune",
                   usage={"input_tokens": 2_000, "output_tokens": 150}),
    ]
    return Story(root_id=root["task_id"], child_id=child_id, child_calls=child_calls, qualifier=qualifier,
                 epoch=epoch)


def recorded(**filters: Any) -> dict[str, Any]:
    """What the log's model calls and paid tools' answers add up to, summed from their events."""
    events = list(Event.objects.filter(task__sandbox=False, payload__has_key="cost", **filters)
                  .filter(type__in=[et.LLM_CALLED, et.TOOL_CALL_RESULT_RECEIVED]))
    calls = [e for e in events if e.type == et.LLM_CALLED]
    cost: dict[str, Decimal] = defaultdict(Decimal)
    for event in events:
        if event.payload["cost"]["amount"] is not None:
            cost[event.payload["cost"]["currency"]] += Decimal(event.payload["cost"]["amount"])
    return {"calls": len(calls), "unpriced": sum(e.payload["cost"]["amount"] is None for e in calls),
            "cost": dict(cost), "input": sum(e.payload["usage"]["input_tokens"] for e in calls),
            "output": sum(e.payload["usage"]["output_tokens"] for e in calls)}


def plotted(page: Page, element_id: str) -> list[dict[str, Any]]:
    return page.evaluate(f"""() => (document.getElementById('{element_id}').data || []).map(t => ({{
        name: t.name, type: t.type, y: Array.from(t.y || []), x: Array.from(t.x || []),
        text: t.text ? Array.from(t.text) : null}}))""")


def test_the_overview_shows_todays_cost_and_tokens_by_model_and_agent(
        logged_in_page: Page, story: Story, screenshot: Screenshot) -> None:
    page = logged_in_page
    page.goto("/")
    wait_live(page)
    panel = page.locator("#spend-panel")
    expect(panel).to_be_visible()
    everything = recorded()
    assert everything["calls"] == 7 and everything["unpriced"] == 2
    (usd,) = everything["cost"].values()
    expect(panel.locator("[data-tile=spend-today] .tile-value")).to_have_text(money_text(usd, "USD"))
    expect(panel.locator("[data-tile=calls-today] .tile-value")).to_have_text("7")
    expect(panel.locator("[data-tile=unpriced-today] .tile-value")).to_have_text("2")
    expect(panel.locator("[data-tile=spend-today] .tile-sub")).to_have_text("+ 2 calls with no price")
    expect(panel.locator("[data-tile=unpriced-today] .tile-sub")).to_contain_text("cost unknown, not zero")
    expect(panel.locator("[data-tile=tokens-today] .tile-value")).to_have_text(
        f"{everything['input'] + everything['output']:,}")
    expect(panel.locator("#spend-empty")).to_be_hidden()

    by_model = plotted(page, "spend-by-model")
    (usd_bars,) = [t for t in by_model if t["name"] == "USD"]
    large = recorded(payload__model="claude-large")["cost"]["USD"]
    index = usd_bars["y"].index("anthropic/claude-large")
    assert Decimal(str(usd_bars["x"][index])) == large and usd_bars["text"][index] == money_text(large, "USD")
    # The model nobody priced: no bar (its cost is unknown), a marked point that says so.
    tool = usd_bars["y"].index("tool acme/company-lookup")
    assert usd_bars["text"][tool] == "0.025 USD"
    (unpriced,) = [t for t in by_model if t["name"] == "no price"]
    assert unpriced["y"] == ["anthropic/in-house-finetune"] and unpriced["text"] == ["2 calls with no price"]
    assert usd_bars["x"][usd_bars["y"].index("anthropic/in-house-finetune")] == 0
    by_agent = plotted(page, "spend-by-agent")
    assert {y for t in by_agent for y in t["y"]} == {"acme/qualifier-1", "acme/enricher-2"}
    (agent_usd,) = [t for t in by_agent if t["name"] == "USD"]
    for name in ("qualifier-1", "enricher-2"):
        spent = recorded(agent=name)["cost"]["USD"]
        assert Decimal(str(agent_usd["x"][agent_usd["y"].index(f"acme/{name}")])) == spent, name

    scrolled_to_top(page)
    screenshot(page, "costs-overview")
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(SCREENSHOT_DIR / "costs-overview-panel.png"))

    # An agent with priced calls and one with no price: the words follow its cost.
    qualifier = agent_usd["y"].index("acme/qualifier-1")
    assert agent_usd["text"][qualifier].endswith("+ 1 call with no price</span>")

    # Tokens: stacked by part (no call wrote to a cache: that part is left out), the parts of
    # each model adding up to its tokens in and out.
    page.locator("#spend-measure button[data-measure=tokens]").click()
    expect(page.locator("#spend-measure button.on")).to_have_text("tokens")
    stacked = plotted(page, "spend-by-model")
    assert [t["name"] for t in stacked] == ["uncached input", "cache read", "output", "reasoning"]
    row = stacked[0]["y"].index("anthropic/claude-large")
    large_tokens = recorded(payload__model="claude-large")
    assert sum(t["x"][row] for t in stacked) == large_tokens["input"] + large_tokens["output"]
    assert stacked[1]["x"][row] == 30_000 and stacked[3]["x"][row] == 1_200
    panel.screenshot(path=str(SCREENSHOT_DIR / "costs-overview-tokens.png"))

    # A call recorded while the page is open: the panel follows, without a reload.
    mark_document(page)
    model_call(story.qualifier, story.root_id, story.epoch, step=7, model="claude-small",
               usage={"input_tokens": 1_000, "output_tokens": 100})
    expect(panel.locator("[data-tile=calls-today] .tile-value")).to_have_text("8")
    (usd,) = recorded()["cost"].values()
    expect(panel.locator("[data-tile=spend-today] .tile-value")).to_have_text(money_text(usd, "USD"))
    assert_not_reloaded(page)


def test_a_sub_agents_page_shows_its_cost_its_roots_tree_and_each_calls_hover(
        logged_in_page: Page, story: Story, screenshot: Screenshot) -> None:
    page = logged_in_page
    page.goto(f"/tasks/{story.child_id}/")
    wait_live(page)
    own, tree = recorded(task_id=story.child_id), recorded()
    header = page.locator("#task-header")
    own_field = header.locator("[data-field=spend-own]")
    expect(own_field).to_contain_text("Spend, this task")
    expect(own_field).to_contain_text(f"{money_text(own['cost']['USD'], 'USD')} + 1 call with no price · 3 model calls")
    tree_field = header.locator("[data-field=spend-tree]")
    expect(tree_field).to_contain_text("Its root's whole tree")
    expect(tree_field).to_contain_text(
        f"{money_text(tree['cost']['USD'], 'USD')} + 2 calls with no price · 7 model calls")
    expect(tree_field.locator("a[data-relation=root]")).to_have_attribute("href", f"/tasks/{story.root_id}/")

    # Each call's row: its model, tokens and cost, or that it has no price.
    first, reported, unpriced = (page.locator(f"#seq-{seq} [data-field=call-cost]") for seq in story.child_calls)
    expect(first).to_contain_text("anthropic/claude-large · 12,000 in / 1,500 out tokens")
    expect(reported).to_contain_text("0.0091 USD")
    expect(reported.locator(".money")).to_have_attribute("title", "0.0091 USD, as the provider reported it")
    expect(unpriced.locator(".unpriced")).to_have_text("no price")

    # The timeline's model calls, and the hover of the first.
    points = page.evaluate("""() => {
        const el = document.getElementById('timeline');
        const n = el.data.findIndex(t => t.meta && t.meta.kind === 'model_call');
        return {curve: n, seqs: n < 0 ? [] : Array.from(el.data[n].customdata)};
    }""")
    assert points["seqs"] == story.child_calls
    page.evaluate(f"() => Plotly.Fx.hover('timeline', [{{curveNumber: {points['curve']}, pointNumber: 0}}])")
    hover = page.locator("#timeline .hoverlayer .hovertext")
    expect(hover).to_contain_text("model call anthropic/claude-large")
    expect(hover).to_contain_text("12,000 in / 1,500 out tokens")
    cost = Decimal(Event.objects.get(task_id=story.child_id, seq=story.child_calls[0]).payload["cost"]["amount"])
    expect(hover).to_contain_text(money_text(cost, "USD"))
    page.locator("#timeline").screenshot(path=str(SCREENSHOT_DIR / "costs-task-timeline-hover.png"))
    scrolled_to_top(page)
    screenshot(page, "costs-task")

    # The root's own page: its own calls, and the tree with its sub-agents.
    page.goto(f"/tasks/{story.root_id}/")
    root_own = recorded(task_id=story.root_id)
    expect(page.locator("[data-field=spend-own]")).to_contain_text(
        f"{money_text(root_own['cost']['USD'], 'USD')} + 1 call with no price · 4 model calls")
    expect(page.locator("[data-field=spend-tree]")).to_contain_text("With its sub-agents")
    expect(page.locator("[data-field=spend-tree]")).to_contain_text(money_text(tree["cost"]["USD"], "USD"))
    page.locator("#task-header").screenshot(path=str(SCREENSHOT_DIR / "costs-task-root-header.png"))


def test_the_agents_page_shows_each_agents_spend_of_the_last_24_hours(
        logged_in_page: Page, story: Story, screenshot: Screenshot) -> None:
    page = logged_in_page
    page.goto("/agents/")
    for name in ("qualifier-1", "enricher-2"):
        spent = recorded(agent=name)
        row = page.locator(f"#agent-table tr[data-agent='acme/{name}']")
        expect(row.locator("[data-field=spend-24h]")).to_contain_text(money_text(spent["cost"]["USD"], "USD"))
        expect(row.locator("[data-field=spend-24h]")).to_contain_text("1 call with no price")
        tokens = f"{spent['input']:,} in / {spent['output']:,} out"
        expect(row.locator("[data-field=calls-24h]")).to_contain_text(tokens)
    screenshot(scrolled_to_top(page), "costs-agents")
