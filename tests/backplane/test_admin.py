"""The admin: every model registered, events strictly read-only, searchable."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from backplane.delivery.models import DeadLetter
from backplane.eventlog.models import Agent, Event, Task


@pytest.fixture
def staff_client(db: None) -> Client:
    client = Client()
    # force_login: the login check (django-axes) needs a request, which Client.login() does not pass.
    client.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    return client


def test_every_backplane_model_is_registered() -> None:
    for model in (Agent, Task, Event):
        assert admin.site.is_registered(model)


def test_events_cannot_be_added_changed_or_deleted(staff_client: Client, make_task: Callable[..., Task]) -> None:
    task = make_task()
    event = Event.objects.get(task=task)
    assert staff_client.get("/admin/backplane/event/add/").status_code == 403
    change_page = staff_client.get(f"/admin/backplane/event/{event.pk}/change/")
    assert change_page.status_code == 200 and b'name="_save"' not in change_page.content
    assert staff_client.post(f"/admin/backplane/event/{event.pk}/change/", {"type": "Forged"}).status_code == 403
    assert staff_client.post(f"/admin/backplane/event/{event.pk}/delete/", {"post": "yes"}).status_code == 403
    assert Event.objects.get(pk=event.pk).type == "TaskStarted"


@pytest.mark.parametrize("term", ["task", "TaskStarted", "key-42"])
def test_events_are_searchable_by_task_type_and_idempotency_key(staff_client: Client, make_task: Callable[..., Task],
                                                                term: str) -> None:
    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    task = make_task()
    other = make_task()
    services.event_append(namespace="acme", task_id=task.pk, agent="a",
                          draft=EventDraft(type="Noted", payload={}, idempotency_key="key-42"))
    query = str(task.pk) if term == "task" else term
    page = staff_client.get("/admin/backplane/event/", {"q": query})
    assert page.status_code == 200
    listed = {e.pk for e in page.context["cl"].result_list}
    expected = {
        "task": set(Event.objects.filter(task=task).values_list("pk", flat=True)),
        "TaskStarted": set(Event.objects.filter(type="TaskStarted").values_list("pk", flat=True)),
        "key-42": set(Event.objects.filter(idempotency_key="key-42").values_list("pk", flat=True)),
    }[term]
    assert listed == expected and other.pk is not None


def shown_tokens(page: bytes) -> list[str]:
    return re.findall(r'<code class="token">([^<]+)</code>', page.decode())


def test_adding_an_agent_shows_its_token_once_on_its_own_page(staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/backplane/agent/add/",
        {"name": "qualifier-9", "namespace": "acme", "kinds": "lead-qualification", "is_active": "on"},
    )
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    [token] = shown_tokens(response.content)
    agent = Agent.objects.get(name="qualifier-9")
    assert agent.token_matches(token) and agent.kinds == ["lead-qualification"]
    # Not in a message (stored in a cookie or the session until shown) nor on any later page.
    assert not list(get_messages(response.wsgi_request))
    assert token not in str(response.cookies)
    assert token not in staff_client.get("/admin/backplane/agent/").content.decode()


def test_rotating_tokens_shows_them_once_and_needs_the_change_permission(staff_client: Client) -> None:
    from django.contrib.auth.models import Permission

    from backplane.eventlog import services

    first = services.agent_create(name="a1", namespace="acme")
    second = services.agent_create(name="a2", namespace="acme")
    ids = [first.agent.pk, second.agent.pk]
    response = staff_client.post("/admin/backplane/agent/",
                                 {"action": "rotate_tokens", "_selected_action": ids})
    rows = dict(re.findall(r'<td>([^<]+)</td><td><code class="token">([^<]+)</code>', response.content.decode()))
    assert len(rows) == 2 and "no-store" in response["Cache-Control"]
    for agent_id in ids:
        agent = Agent.objects.get(pk=agent_id)
        assert agent.token_matches(rows[str(agent)])
    assert not Agent.objects.get(pk=first.agent.pk).token_matches(first.token)

    viewer = User.objects.create_user("vera", password="pw-for-tests-only", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_agent"))
    client = Client()
    client.force_login(viewer)
    before = Agent.objects.get(pk=second.agent.pk).token_hash
    response = client.post("/admin/backplane/agent/", {"action": "rotate_tokens", "_selected_action": ids})
    assert not shown_tokens(response.content)
    assert Agent.objects.get(pk=second.agent.pk).token_hash == before


def test_tasks_are_read_only_too(staff_client: Client, make_task: Callable[..., Task]) -> None:
    task = make_task()
    assert staff_client.get("/admin/backplane/task/").status_code == 200
    assert staff_client.post(f"/admin/backplane/task/{task.pk}/delete/", {"post": "yes"}).status_code == 403


# --- dead letters: "requeue selected" and "discard selected" -----------------------------------------


def _reviewer_client(name: str, *, review: bool = True) -> Client:
    from django.contrib.auth.models import Group, Permission

    user = User.objects.create_user(name, password="pw-for-tests-only", is_staff=True)
    if review:
        # The group migration 0012 makes (an earlier transactional test's flush removes it).
        group, _ = Group.objects.get_or_create(name="Reviewers")
        group.permissions.add(Permission.objects.get(codename="review_deadletter"),
                              Permission.objects.get(codename="view_backplane"))
        user.groups.add(group)
    else:
        user.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client = Client()
    client.force_login(user)
    return client


def _dead_lettered(count: int) -> list[DeadLetter]:
    from tests.dashboard.test_dead_letters import dead_lettered_tasks

    return dead_lettered_tasks(count)


def _run_to_the_end(client: Client, job_id: int) -> Any:
    """Start the draft job as its page does, and settle it as the worker does."""
    from recovery import bulk
    from recovery.models import BulkJob

    job = BulkJob.objects.get(pk=job_id)
    assert client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash}).status_code == 302
    while bulk.bulk_job_step(job.pk):
        pass
    job.refresh_from_db()
    return job


def _job_rows() -> tuple[int, int]:
    from recovery.models import BulkJob, BulkJobItem

    return BulkJob.objects.count(), BulkJobItem.objects.count()


def test_a_reviewer_requeues_selected_dead_letters_as_a_job_after_giving_a_reason(db: None) -> None:
    from recovery.models import BulkJob

    client = _reviewer_client("rita")
    items = _dead_lettered(3)
    listing = client.get("/admin/backplane/deadletter/")
    assert listing.status_code == 200 and b"requeue_selected" in listing.content
    selected = {"action": "requeue_selected", "_selected_action": [items[0].pk, items[1].pk]}
    asked = client.post("/admin/backplane/deadletter/", selected)
    assert asked.status_code == 200 and b'name="reason"' in asked.content and b"2 selected" in asked.content
    assert b"draft" in asked.content and b"job" in asked.content
    no_reason = client.post("/admin/backplane/deadletter/", {**selected, "confirm": "yes", "reason": " "})
    assert no_reason.status_code == 200 and b"Write a reason" in no_reason.content
    assert _job_rows() == (0, 0)
    drafted = client.post("/admin/backplane/deadletter/", {**selected, "confirm": "yes", "reason": "pool is back"})
    job = BulkJob.objects.get()
    assert drafted.status_code == 302 and drafted["Location"] == f"/jobs/{job.pk}/"
    assert (job.action, job.status, job.created_by, job.reason) == (
        "dead_letter_requeue", "draft", "user:rita", "pool is back")
    assert sorted(job.selection["ids"]) == [items[0].pk, items[1].pk]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "<strong>2</strong> requeue" in page and 'id="job-start"' in page
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"pending"}  # the dry run decides nothing

    assert _run_to_the_end(client, job.pk).done == 2
    assert list(DeadLetter.objects.order_by("id").values_list("status", "decided_by", "reason")) == [
        ("requeued", "user:rita", "pool is back"), ("requeued", "user:rita", "pool is back"), ("pending", None, "")]
    assert Event.objects.filter(type="DeadLetterRequeued").count() == 2
    assert Task.objects.filter(pk__in=[items[0].task_id, items[1].task_id], status="pending").count() == 2


def test_a_discard_job_from_the_admin_skips_what_someone_else_decided_meanwhile(db: None) -> None:
    from recovery import dead_letters
    from recovery.models import BulkJob

    client = _reviewer_client("rita")
    first, second = _dead_lettered(2)
    client.post("/admin/backplane/deadletter/", {
        "action": "discard_selected", "_selected_action": [first.pk, second.pk], "confirm": "yes", "reason": "stale",
    })
    job = BulkJob.objects.get()
    assert job.action == "dead_letter_discard" and job.total == 2
    dead_letters.dead_letter_requeue(dead_letter_id=second.pk, decided_by="user:sam", reason="mine")
    job = _run_to_the_end(client, job.pk)
    assert (job.done, job.skipped, job.failed) == (1, 1, 0)
    assert "already requeued" in job.items.get(target=str(second.pk)).detail
    assert DeadLetter.objects.get(pk=first.pk).status == "discarded"
    assert DeadLetter.objects.get(pk=second.pk).decided_by == "user:sam"
    assert Event.objects.filter(task__dead_letters=second, type__startswith="DeadLetter").count() == 1


def test_the_admin_actions_need_the_review_permission(db: None) -> None:
    (item,) = _dead_lettered(1)
    viewer = _reviewer_client("vera", review=False)  # may look at the list, may not decide
    listing = viewer.get("/admin/backplane/deadletter/")
    assert listing.status_code == 200 and b"requeue_selected" not in listing.content
    for action in ("requeue_selected", "discard_selected"):
        forged = viewer.post("/admin/backplane/deadletter/", {
            "action": action, "_selected_action": [item.pk], "confirm": "yes", "reason": "forged"}, follow=True)
        # The action is not offered to this user: the list comes back, nothing decided.
        assert forged.status_code == 200 and not [str(m) for m in forged.context["messages"]]
    plain = Client()
    plain.force_login(User.objects.create_user("pat", password="pw-for-tests-only", is_staff=True))
    assert plain.get("/admin/backplane/deadletter/").status_code == 403
    assert plain.post("/admin/backplane/deadletter/", {"action": "requeue_selected", "_selected_action": [item.pk],
                                                       "confirm": "yes", "reason": "forged"}).status_code == 403
    assert DeadLetter.objects.get(pk=item.pk).status == "pending"
    assert not Event.objects.filter(type__startswith="DeadLetter").exists()
    assert _job_rows() == (0, 0)


def test_all_dead_letters_the_admin_list_shows_go_into_one_job(db: None) -> None:
    from recovery import dead_letters
    from recovery.models import BulkJob

    client = _reviewer_client("rita")
    items = _dead_lettered(3)
    dead_letters.dead_letter_requeue(dead_letter_id=items[0].pk, decided_by="user:sam", reason="mine")
    url = "/admin/backplane/deadletter/?status__exact=pending"
    across = {"action": "discard_selected", "select_across": "1", "_selected_action": [items[1].pk]}
    asked = client.post(url, across)
    assert asked.status_code == 200 and b"2 selected" in asked.content
    client.post(url, {**across, "confirm": "yes", "reason": "all stale"})
    job = BulkJob.objects.get()
    assert job.selection == {"ids": [items[1].pk, items[2].pk]}
    assert _run_to_the_end(client, job.pk).done == 2
    assert DeadLetter.objects.get(pk=items[0].pk).status == "requeued"
    assert set(DeadLetter.objects.filter(pk__in=[items[1].pk, items[2].pk]).values_list("status", flat=True)) == {
        "discarded"}


def test_an_over_large_selection_in_the_admin_plans_nothing(db: None, settings: Any) -> None:
    client = _reviewer_client("rita")
    items = _dead_lettered(3)
    settings.BACKPLANE_BULK_MAX_ITEMS = 2
    refused = client.post("/admin/backplane/deadletter/", {
        "action": "requeue_selected", "_selected_action": [d.pk for d in items], "confirm": "yes", "reason": "r"},
        follow=True)
    assert any("more than 2 items" in str(m) for m in refused.context["messages"])
    assert _job_rows() == (0, 0) and set(DeadLetter.objects.values_list("status", flat=True)) == {"pending"}


def test_a_webhook_subscription_sets_its_delivery_and_retries_in_the_admin(staff_client: Client) -> None:
    from backplane.delivery.models import WebhookSubscription
    from backplane.delivery.policy import webhook_policy

    form = staff_client.get("/admin/backplane/webhooksubscription/add/").content.decode()
    for field in ("ordering", "timeout_seconds", "max_concurrency", "max_attempts", "retry_base_seconds",
                  "retry_max_delay_seconds"):
        assert f'name="{field}"' in form
    response = staff_client.post("/admin/backplane/webhooksubscription/add/", {
        "name": "crm", "topic_pattern": "leads.#", "url": "https://crm.example.com/hook", "secret": "s",
        "is_active": "on", "ordering": "best_effort", "timeout_seconds": "10", "max_concurrency": "4",
        "max_attempts": "", "retry_base_seconds": "30", "retry_max_delay_seconds": "",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    policy = webhook_policy(WebhookSubscription.objects.get(name="crm"))
    assert (policy.ordering, policy.timeout_seconds, policy.concurrency) == ("best_effort", 10, 4)
    assert policy.retry.base_seconds == 30 and policy.retry.max_attempts == 35  # empty: the setting
    bad = staff_client.post("/admin/backplane/webhooksubscription/add/", {
        "name": "bad", "topic_pattern": "#", "url": "https://x.example.com/", "secret": "s", "ordering": "strict",
        "timeout_seconds": "0", "max_concurrency": "99",
    })
    assert bad.status_code == 200 and not WebhookSubscription.objects.filter(name="bad").exists()
