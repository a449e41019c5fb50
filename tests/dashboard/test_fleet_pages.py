"""The agents-and-tools page and the outbox page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.models import Agent, BreakerTransition
from recovery.breakers import breaker_record_failure
from recovery.models import Tool, ToolCall
from tests.dashboard.conftest import History, html, reviewers_group


def open_breaker(agent: Agent) -> None:
    with transaction.atomic():
        breaker_record_failure(namespace=agent.namespace, agent_name=agent.name, reason="task failed",
                               task_id=None, now=timezone.now(), failures=3)


def reviewer_client(olivia: User) -> Client:
    olivia.groups.add(reviewers_group())
    client = Client()
    client.force_login(User.objects.get(pk=olivia.pk))
    return client


def test_it_shows_each_agent_with_last_seen_leases_failures_and_breaker(olivia_client: Client, alice: Any,
                                                                        make_history: Any) -> None:
    history: History = make_history(agent_name="closer-7")
    assert alice.get("/api/v1/tasks/").status_code == 200  # alice's token authenticates: she is seen
    closer = Agent.objects.get(name="closer-7")
    open_breaker(closer)
    page = html(olivia_client.get("/agents/"))
    assert 'data-agent="acme/alice"' in page and 'data-agent="acme/closer-7"' in page
    alice_row = page.split('data-agent="acme/alice"')[1].split("</tr>")[0]
    assert "never" not in alice_row  # last seen just now
    closer_row = page.split('data-agent="acme/closer-7"')[1].split("</tr>")[0]
    assert ">1</a>" in closer_row  # one lease held (the history's task)
    assert 'data-field="breaker">open<' in closer_row and "task failed" in closer_row
    assert "Close breaker" not in page  # olivia is a viewer
    assert history.task.lease_holder == "closer-7"


def test_last_seen_is_written_at_most_every_30_seconds(alice: Any) -> None:
    with CaptureQueriesContext(connection) as first:
        alice.get("/api/v1/tasks/")
    with CaptureQueriesContext(connection) as second:
        alice.get("/api/v1/tasks/")
    updates = [q for q in first.captured_queries if q["sql"].startswith("UPDATE backplane_agent")]
    assert len(updates) == 1
    assert not [q for q in second.captured_queries if q["sql"].startswith("UPDATE backplane_agent")]


def test_a_reviewer_closes_a_breaker_with_a_reason_a_viewer_cannot(olivia: User, olivia_client: Client,
                                                                   make_agent: Any) -> None:
    make_agent("flaky", "acme")
    agent = Agent.objects.get(name="flaky")
    open_breaker(agent)
    assert olivia_client.post(f"/agents/{agent.pk}/reset-breaker/", {"reason": "fixed"}).status_code == 403
    agent.refresh_from_db()
    assert agent.breaker_state == "open"
    reviewer = reviewer_client(olivia)
    assert reviewer.post(f"/agents/{agent.pk}/reset-breaker/", {"reason": ""}).status_code == 302
    agent.refresh_from_db()
    assert agent.breaker_state == "open"  # no reason, no reset
    assert reviewer.post(f"/agents/{agent.pk}/reset-breaker/", {"reason": "model endpoint fixed"}).status_code == 302
    agent.refresh_from_db()
    assert agent.breaker_state == "closed"
    last = BreakerTransition.objects.filter(agent=agent).order_by("-at", "-pk").first()
    assert last is not None and last.to_state == "closed"
    assert last.reason == "reset by an operator: model endpoint fixed" and last.decided_by == "user:olivia"


def test_tools_show_breaker_rate_limit_and_latency(olivia_client: Client, make_history: Any) -> None:
    history: History = make_history()
    Tool.objects.create(name="crm_lookup", url="https://tools.example.com/crm", rate_limit_per_minute=60)
    now = timezone.now()
    ToolCall.objects.filter(tool="crm_lookup").update(dispatched_at=now - timedelta(milliseconds=250),
                                                       completed_at=now)
    page = html(olivia_client.get("/agents/"))
    row = page.split('data-tool="crm_lookup"')[1].split("</tr>")[0]
    assert "60/min" in row and "250 / 250 ms" in row
    assert history.done_key


def test_the_outbox_page_shows_backlog_failures_and_lag(olivia_client: Client, make_history: Any) -> None:
    make_history()
    now = timezone.now()
    OutboxMessage.objects.filter(pk=OutboxMessage.objects.earliest("pk").pk).update(
        attempts=2, last_error="connection refused by broker", next_attempt_at=now + timedelta(seconds=30))
    OutboxMessage.objects.filter(pk=OutboxMessage.objects.latest("pk").pk).update(
        status="delivered", delivered_at=now)
    page = html(olivia_client.get("/outbox/"))
    assert 'data-destination="broker"' in page
    assert "connection refused by broker" in page
    assert 'id="lag-data"' in page
    pending = OutboxMessage.objects.filter(status="pending").count()
    assert f'data-tile="waiting"><div class="tile-label">Waiting for a first attempt</div><div class="tile-value">' \
           f"{pending - 1}<" in page


def test_both_pages_run_the_same_queries_for_more_rows(olivia_client: Client, make_agent: Any,
                                                       make_history: Any) -> None:
    make_history()

    def count(path: str) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert olivia_client.get(path).status_code == 200
        return len(captured.captured_queries)

    few = {path: count(path) for path in ("/agents/", "/outbox/")}
    for n in range(30):
        agent = services.agent_create(name=f"a{n}", namespace="acme").agent
        open_breaker(agent)
        Tool.objects.create(name=f"tool-{n}", url="https://tools.example.com/x")
    many = {path: count(path) for path in ("/agents/", "/outbox/")}
    # The agents page: the session and its user, the agents' figures (recovery.selectors), the tools'
    # and the agents' model spend of the last 24 h; the user's staff scope (recovery.models.StaffScope).
    assert many == few and few["/agents/"] <= 12 and few["/outbox/"] <= 11


def test_two_namespaces_tools_of_one_name_keep_their_own_figures(olivia_client: Client, make_task: Any) -> None:
    """Calls count for the tool that serves the task's namespace: its own, else the global one."""
    from recovery.selectors import tools_overview

    shared = Tool.objects.create(name="crm", url="https://tools.example.com/crm")
    acme_own = Tool.objects.create(name="crm", namespace="acme", url="https://acme.example.com/crm")
    now = timezone.now()
    for namespace, calls in (("acme", 3), ("globex", 2)):
        task = make_task(namespace=namespace)
        for step in range(calls):
            ToolCall.objects.create(idempotency_key=f"{namespace}-{step}", task=task, step=step, tool="crm", input={},
                                    status="succeeded", result={}, dispatched_at=now - timedelta(seconds=1),
                                    completed_at=now, expires_at=now + timedelta(hours=1))
    figures = {row.tool.pk: row.calls_last_hour for row in tools_overview(now=now)}
    assert figures == {acme_own.pk: 3, shared.pk: 2}
    page = html(olivia_client.get("/agents/"))
    assert page.count('data-tool="crm"') == 2
    assert 'data-tool="crm" data-namespace="acme"' in page and 'data-tool="crm" data-namespace=""' in page
