"""The Approvals page in the browser: a gated payment waits with its exact arguments, their hash
and the reasoning that led to it; a second request appears live; an approver grants one with a
reason, the agent's next dispatch makes the call, and the decision is listed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import AbstractUser
from playwright.sync_api import Page, expect

from recovery import approvals
from recovery.models import ApprovalRequest
from tests.browser.conftest import ApiAgent, scrolled_to_top, wait_live
from tests.browser.fleet import claim_task
from tests.support.roles import role_group

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Screenshot = Callable[[Page, str], Path]
LIVE_SECONDS = 5_000


Json = dict[str, Any]


def gated_payment(agent: ApiAgent, *, invoice: str, amount: int) -> tuple[Json, Json, Json]:
    """A payment task whose agent reasons, then dispatches a payment the policy gates: the 202."""
    task = agent.create_task("payment", {"invoice": invoice})
    epoch = claim_task(agent, task)
    agent.append(task["task_id"], "ReasoningStepCompleted",
                 {"step": 1, "thought": f"{invoice} matches purchase order 91; the payee's IBAN is on file"},
                 lease_epoch=epoch)
    body = {"step": 2, "tool": "payments.transfer", "input": {"invoice": invoice, "amount": amount, "currency": "EUR"},
            "lease_epoch": epoch, "reason": f"pay {invoice} before its due date"}
    waiting = agent.call("POST", f"/api/v1/tasks/{task['task_id']}/tool-calls/", 202, json=body)
    return task, body, waiting


def test_an_approver_sees_the_exact_call_and_grants_it(logged_in_page: Page, staff_user: AbstractUser,
                                                       make_agent: Callable[..., ApiAgent],
                                                       screenshot: Screenshot) -> None:
    staff_user.groups.add(role_group("Approvers"))
    approvals.tool_policy_set(tool="payments.transfer", condition="amount > 1000", field_types={"amount": "number"},
                              approver_group="Approvers", set_by="user:olivia", reason="the finance team's rule")
    payer = make_agent("payer")
    task, body, waiting = gated_payment(payer, invoice="INV-7", amount=5000)

    page = logged_in_page
    page.goto("/approvals/")
    wait_live(page)
    card = page.locator(f"section.approval[data-id='{waiting['approval_id']}']")
    expect(card.locator("[data-field=arguments]")).to_have_text('{"amount":5000,"currency":"EUR","invoice":"INV-7"}')
    expect(card.locator("[data-field=hash]")).to_have_text(waiting["argument_sha256"])
    expect(card.locator("[data-field=reason]")).to_have_text("pay INV-7 before its due date")
    expect(card).to_contain_text("INV-7 matches purchase order 91")
    expect(card.locator("[data-field=policy]")).to_contain_text("amount > 1000")

    # Another request, written while the page is open, appears without a reload.
    _, _, second = gated_payment(make_agent("payer-2"), invoice="INV-8", amount=12000)
    expect(page.locator(f"section.approval[data-id='{second['approval_id']}']")).to_be_visible(timeout=LIVE_SECONDS)
    screenshot(scrolled_to_top(page), "approvals")

    card.locator("input[name=reason]").fill("checked INV-7 against order 91")
    with page.expect_navigation():
        card.get_by_role("button", name="Approve").click()
    expect(page.locator("#messages")).to_contain_text("Granted: payments.transfer at step 2")
    expect(page.locator(f"section.approval[data-id='{waiting['approval_id']}']")).to_have_count(0)
    expect(page.locator("#approvals-decided")).to_contain_text("granted")
    screenshot(scrolled_to_top(page), "approvals-granted")

    made = payer.call("POST", f"/api/v1/tasks/{task['task_id']}/tool-calls/", 201, json=body)
    assert made["status"] == "dispatched"
    assert ApprovalRequest.objects.get(pk=waiting["approval_id"]).decisions.get().decided_by == \
        f"user:{staff_user.username}"


def test_a_signal_waited_for_appears_live_and_an_operator_sends_it(logged_in_page: Page, staff_user: AbstractUser,
                                                                    make_agent: Callable[..., ApiAgent],
                                                                    screenshot: Screenshot) -> None:
    from recovery.models import TaskSignal

    page = logged_in_page
    page.goto("/approvals/")
    wait_live(page)
    expect(page.locator("#signals-waiting")).to_contain_text("No task waits for a signal.")

    renderer = make_agent("renderer")
    task = renderer.create_task("render", {"scene": "lobby"})
    epoch = claim_task(renderer, task)
    waiting = renderer.call("POST", f"/api/v1/tasks/{task['task_id']}/signals/render-done/wait/", 201,
                            json={"timeout_seconds": 3600, "lease_epoch": epoch})
    assert waiting["callback_url"].endswith("/") and "/api/v1/signal-callbacks/" in waiting["callback_url"]
    row = page.locator(f"tr[data-signal='{task['task_id']}/render-done']")
    expect(row).to_be_visible(timeout=LIVE_SECONDS)
    expect(row).to_contain_text("renderer")
    row.locator("input[name=payload]").fill('{"frames": 240}')
    screenshot(scrolled_to_top(page), "approvals-signal-waiting")

    with page.expect_navigation():
        row.get_by_role("button", name="Send").click()
    expect(page.locator("#messages")).to_contain_text(f"Sent: render-done to task {task['task_id']}.")
    expect(page.locator(f"tr[data-signal='{task['task_id']}/render-done']")).to_have_count(0)
    signal = TaskSignal.objects.get(task_id=task["task_id"], name="render-done")
    assert (signal.status, signal.payload, signal.sent_by) == (
        "received", {"frames": 240}, f"user:{staff_user.username}")

    # The same wait's callback URL, on the real server: no credentials, this one signal only.
    proof = renderer.call("POST", f"/api/v1/tasks/{task['task_id']}/signals/proof-ready/wait/", 201,
                          json={"timeout_seconds": 600, "lease_epoch": epoch})
    expect(page.locator(f"tr[data-signal='{task['task_id']}/proof-ready']")).to_be_visible(timeout=LIVE_SECONDS)
    sent = httpx.post(proof["callback_url"], json={"payload": {"proof": "ok"}}, timeout=10)
    assert sent.status_code == 201 and sent.json()["sent_by"] == "callback:renderer"
    expect(page.locator(f"tr[data-signal='{task['task_id']}/proof-ready']")).to_have_count(0, timeout=LIVE_SECONDS)
