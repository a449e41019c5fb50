"""Every changelist of the product's admin (backplane/admin.py, recovery/admin.py) fits a 1280 px
window with real-looking rows: neither the page nor its results box (which Django's CSS lets
scroll on its own) scrolls sideways. Screenshots: var/screenshots/admin-*.png."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import Page

from backplane.delivery.models import DeadLetter, WebhookSubscription
from backplane.eventlog import services
from backplane.eventlog.models import Agent, BreakerTransition, CostRollup, ModelPrice, Task
from backplane.integrity.models import AuditSegment, IntegrityAlert, VerificationRun, VerifiedHead
from recovery.models import (
    AlertRule,
    AlertTransition,
    BulkJob,
    BulkJobDecision,
    Pause,
    RetentionRule,
    SavedSearch,
    StaffScope,
    Tool,
    ToolCall,
    ToolPolicy,
)
from tests.browser.conftest import password_hash

WIDTH = 1280
ADMIN_USERNAME = "root"
ADMIN_PASSWORD = "slate-otter-compass-88"

pytestmark = pytest.mark.browser


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fill() -> None:
    """A few rows in every model, with the long values real rows have (UUIDs, hashes, URLs)."""
    now = timezone.now()
    agents = [services.agent_create(name=f"lead-qualifier-{n}", namespace="acme-marketing-eu",
                                    kinds=["lead-qualification", "lead-enrichment"]).agent for n in range(3)]
    tasks = [services.task_create(namespace="acme-marketing-eu", kind="lead-qualification", agent="planner",
                                  input={"lead": f"lead-{n}@example.com"}).task for n in range(3)]
    for n, task in enumerate(tasks):
        BreakerTransition.objects.create(agent=agents[n], from_state="closed", to_state="open",
                                         reason="three consecutive failures: lease expired while running",
                                         task_id=task.pk, decided_by="user:operator", at=now)
        ToolCall.objects.create(idempotency_key=_hex(f"{task.pk}:1:send-email"), task=task, step=1,
                                tool="send-email-transactional", input={}, dispatched_at=now,
                                completed_at=now, status="succeeded", expires_at=now + timedelta(days=1))
        DeadLetter.objects.create(source="outbox", reference=f"outbox:{task.pk}", task=task,
                                  topic="task.lead-qualification.completed", created_at=now, attempts=35,
                                  error="webhook answered HTTP 503", decided_by="user:operator-with-a-long-name")
        VerifiedHead.objects.create(task=task, verified_seq=1, verified_hash=_hex(f"head {n}"), verified_at=now)
    run = VerificationRun.objects.create(mode="incremental", started_at=now, finished_at=now, tasks_checked=1200,
                                         events_checked=98000, failures=1)
    IntegrityAlert.objects.create(run=run, task=tasks[0], first_invalid_seq=7, created_at=now,
                                  problem="event 7's prev_hash does not match event 6's hash " + _hex("x"),
                                  acknowledged_by="user:operator-with-a-long-name", acknowledged_at=now)
    for n in range(3):
        WebhookSubscription.objects.create(name=f"crm-sync-{n}", topic_pattern="task.lead-qualification.*",
                                           url=f"https://hooks.example-crm-integration.com/backplane/v2/{_hex(str(n))}",
                                           secret="s" * 40)
        AuditSegment.objects.create(number=n + 1, first_leaf=n * 100_000, tree_size=(n + 1) * 100_000,
                                    root_hash=_hex(f"root {n}"), segment_sha256=_hex(f"segment {n}"),
                                    manifest_sha256=_hex(f"manifest {n}"), exported_at=now,
                                    destination=f"s3://acme-backplane-audit-archive/backplane-audit/segment-{n:08d}/")
        Tool.objects.create(name=f"send-email-transactional-{n}", namespace="acme-marketing-eu" if n else "",
                            url=f"https://tools.example-integrations.com/email/send/{_hex(str(n))[:24]}",
                            breaker_state="open", consecutive_failures=3, opened_at=now,
                            last_error="tool send-email did not answer: ConnectTimeout")
        ModelPrice.objects.create(provider="anthropic-bedrock-eu-central", model=f"claude-large-2026-11-preview-{n}",
                                  token_type="cache_write", per_million=Decimal("3.750000"), currency="USD",
                                  valid_from=now, version=f"contract-2026-11-acme-marketing-eu-{n}")
        CostRollup.objects.create(scope="agent", key=f"acme-marketing-eu/lead-qualifier-{n}", hour=now, shard=n,
                                  currency="USD", calls=1_250_000, input_tokens=9_876_543_210,
                                  output_tokens=1_234_567_890, cost=Decimal("123456.789012345678"))
        RetentionRule.objects.create(namespace="acme-marketing-eu", kind="lead-qualification" if n else "",
                                     keep_seconds=30 * 24 * 3600, tasks_pruned=1_250_000, events_pruned=98_000_000,
                                     last_pruned_at=now)
        Pause.objects.create(namespace="acme-marketing-eu", kind="lead-qualification" if n else "",
                             reason="the CRM enrichment tool rejects every lookup since the 14:05 deploy; rollback "
                                    "in progress", paused_by="user:operator-with-a-long-name", paused_at=now,
                             resumed_by="user:operator-with-a-long-name" if n == 2 else "",
                             resumed_at=now if n == 2 else None)
    approvers, _ = Group.objects.get_or_create(name="Approvers")
    for n in range(3):
        ToolPolicy.objects.create(
            tool=f"payments.transfer-international-{n}", namespace="acme-marketing-eu" if n else "", version=n + 1,
            is_current=n == 2, condition='amount > 10000 and currency == "EUR" or payee.country not in ["DE", "FR"]',
            field_types={"amount": "number", "currency": "string", "payee.country": "string"},
            approver_group=approvers, set_by="user:operator-with-a-long-name", created_at=now,
            reason="the finance team's rule from the December review, after the audit of international payments")
    for n in range(3):
        search = SavedSearch.objects.create(
            name=f"Lead qualification stalled after the CRM enrichment deploy {n}", pinned=n != 1,
            slug=f"lead-qualification-stalled-after-the-crm-enrichment-deploy-{n}",
            created_by="user:operator-with-a-long-name",
            filter={"namespace": "acme-marketing-eu", "kind": "lead-qualification", "q": "crm-enrichment timeout"},
            created_at=now)
        rule = AlertRule.objects.create(search=search, window_seconds=3600, threshold=1_000, state="firing",
                                        state_since=now, last_count=1_250, last_evaluated_at=now,
                                        created_by="user:operator-with-a-long-name", created_at=now)
        AlertTransition.objects.create(rule=rule, search_name=search.name, state="resolved", count=999,
                                       threshold=1_000, window_seconds=3600, at=now,
                                       reason="rule disabled by user:operator-with-a-long-name")
    for n in range(3):
        job = BulkJob.objects.create(
            action="fork_from_failure" if n else "dead_letter_discard", status="running",
            selection={"filter": {"namespace": "acme-marketing-eu", "kind": "lead-qualification",
                                  "q": "crm-enrichment timeout"}},
            selection_hash=_hex(f"job {n}"), reason="deploy 412 of the CRM enrichment tool failed them; fixed in 413",
            created_by="user:operator-with-a-long-name", created_at=now, total=200_000, done=123_456,
            skipped=65_432, failed=1_234, started_at=now)
        BulkJobDecision.objects.create(job=job, action="create", decided_by="user:operator-with-a-long-name",
                                       reason=job.reason, at=now)
    for n in range(3):
        person = get_user_model().objects.create(username=f"operator-with-a-long-name-{n}", is_staff=True)
        StaffScope.objects.create(user=person, namespace=f"acme-marketing-eu-{n}")
    assert Task.objects.count() == 3 and Agent.objects.count() == 3


def _changelists() -> list[str]:
    return sorted(f"/admin/{model._meta.app_label}/{model._meta.model_name}/" for model in admin.site._registry
                  if model._meta.app_label in {"backplane", "recovery"})


def test_every_changelist_fits_1280_px(page: Page, screenshot: Callable[[Page, str], Path]) -> None:
    get_user_model().objects.create(username=ADMIN_USERNAME, password=password_hash(ADMIN_PASSWORD),
                                    is_staff=True, is_superuser=True)
    _fill()
    page.set_viewport_size({"width": WIDTH, "height": 900})
    page.goto("/admin/login/")
    page.fill("input[name=username]", ADMIN_USERNAME)
    page.fill("input[name=password]", ADMIN_PASSWORD)
    with page.expect_navigation():
        page.click("input[type=submit]")

    widths = {}
    for url in _changelists():
        response = page.goto(url)
        assert response is not None and response.status == 200, url
        assert page.locator("#result_list tbody tr").count() >= 1, f"{url} shows no rows"
        # The page itself, and the results box, which Django lets scroll sideways on its own.
        widths[url] = page.evaluate("""() => {
            const results = document.querySelector('#changelist .results');
            return Math.max(document.documentElement.scrollWidth,
                            document.documentElement.clientWidth + results.scrollWidth - results.clientWidth);
        }""")
        screenshot(page, url.strip("/").replace("/", "-"))
    too_wide = {url: width for url, width in widths.items() if width > WIDTH}
    assert len(widths) == 23 and not too_wide, too_wide
