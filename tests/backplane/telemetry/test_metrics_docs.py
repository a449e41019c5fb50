"""The alert rules and the Grafana dashboard in docs/ match the product's /metrics.

- ``promtool check rules`` (Debian's prometheus package, fetched by ``make promtool``, which
  ``make test`` runs first) accepts docs/prometheus/alerts.yml; without promtool the test fails;
- every alert has its runbook line in docs/operations.md;
- docs/grafana/backplane.json loads, and every metric its panels' queries name is on a live
  scrape of /metrics, taken after real activity so counters and histograms have their series.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from django.test import Client

from backplane.delivery import relay
from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from recovery import gateway, leases, tool_calls
from recovery.models import Tool
from tests.backplane.telemetry.conftest import LocalTool
from tests.backplane.telemetry.metrics_scrape import scrape

REPO = Path(__file__).resolve().parents[3]
ALERTS = REPO / "docs" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "docs" / "grafana" / "backplane.json"
OPERATIONS = REPO / "docs" / "operations.md"
# The product's metrics all start so (its own, and django-prometheus' HTTP ones).
METRIC_NAME = re.compile(r"\b(?:backplane|django)_[a-z0-9_]+\b")


def promtool() -> str:
    found = shutil.which("promtool") or shutil.which("promtool", path=str(Path(sys.executable).parent))
    assert found, "promtool is missing: `make promtool` fetches it (`make test` does first)"
    return found


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def test_promtool_accepts_the_alert_rules() -> None:
    checked = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout + checked.stderr


def test_every_alert_has_a_runbook_line_in_the_operations_guide() -> None:
    runbook = OPERATIONS.read_text().split("## Metrics and alerts", 1)
    assert len(runbook) == 2, "docs/operations.md has no 'Metrics and alerts' section"
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in runbook[1], f"no runbook line for {rule['alert']}"
        assert rule["annotations"]["runbook"].startswith("docs/operations.md"), rule["alert"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' panels included."""
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel.get("title", "?"), target["expr"]) for panel in panels(dashboard["panels"])
            for target in panel.get("targets", [])]


def some_of_everything(tool: LocalTool) -> None:
    """What an hour of a small fleet does: tasks, claims, steps, a custom event, a replay, tool
    calls by hand and through the gateway, a compensation declared, deliveries, HTTP requests."""
    agent = services.agent_create(name="alice", namespace="acme").agent
    task = services.task_create(namespace="acme", kind="lead-qualification", input={"lead": "bob"}).task
    claim = leases.lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None and claim.task.pk == task.pk
    for draft in (EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),
                  EventDraft(type="LeadScored", payload={"score": 7}, idempotency_key="score"),
                  EventDraft(type="LeadScored", payload={"score": 7}, idempotency_key="score")):
        services.event_append(namespace="acme", task_id=task.pk, agent="alice", draft=draft,
                              lease_epoch=claim.lease_epoch)
    call = tool_calls.tool_call_dispatch(namespace="acme", task_id=task.pk, step=2, tool="crm-update", input={},
                                         agent="alice", lease_epoch=claim.lease_epoch,
                                         compensation={"tool": "crm-revert", "input": {}})
    tool_calls.tool_call_record_result(namespace="acme", key=call.call.pk, status="succeeded", result={},
                                       agent="alice", lease_epoch=claim.lease_epoch)
    Tool.objects.create(name="send-email", url=tool.url, timeout_seconds=5)
    gateway.tool_invoke(namespace="acme", task_id=task.pk, step=3, tool_name="send-email", input={"to": "bob"},
                        agent="alice", lease_epoch=claim.lease_epoch)
    relay.outbox_relay_once(publish=lambda message, envelope: None)


def test_every_dashboard_query_names_a_metric_on_a_live_scrape(committed_db: None, client: Client,
                                                               local_tool: LocalTool) -> None:
    some_of_everything(local_tool)
    client.get("/readyz/traffic")
    names = scrape(client).names
    queries = dashboard_queries()
    assert len(queries) >= 20
    for title, expr in queries:
        named = METRIC_NAME.findall(expr)
        assert named, f"panel {title!r}: {expr!r} names no metric"
        missing = sorted(set(named) - names)
        assert not missing, f"panel {title!r}: {missing} not on /metrics"


def test_every_alert_names_a_metric_on_a_live_scrape(committed_db: None, client: Client, local_tool: LocalTool) -> None:
    some_of_everything(local_tool)
    names = scrape(client).names
    for rule in alert_rules():
        missing = sorted(set(METRIC_NAME.findall(rule["expr"])) - names)
        assert not missing, f"alert {rule['alert']}: {missing} not on /metrics"
