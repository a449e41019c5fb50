"""Saved searches and alert rules (recovery/alerts.py): crossings fire and resolve once each, with
one outbox message per crossing, however many evaluations or evaluators see them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from backplane.celery import app as celery_app
from backplane.delivery.models import OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.models import Task
from backplane.eventlog.selectors import TaskFilters, tasks_filtered
from backplane.eventlog.writer import EventDraft
from backplane.runtime import duties
from recovery import alerts, selectors
from recovery import tasks as recovery_tasks
from recovery.models import ALERT_WINDOW_MAX_SECONDS, AlertRule, AlertState, AlertTransition, SavedSearch
from tests.backplane.eventlog.test_concurrent_appends import run_in_threads

BY = "user:alice"


def alert_messages() -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(topic=alerts.TOPIC, destination="broker").order_by("id"))


def search_of(filter: dict[str, Any] | None = None, *, name: str = "Acme leads") -> SavedSearch:
    return alerts.saved_search_save(name=name, filter=filter or {"namespace": "acme"}, created_by=BY)


def rule_on(search: SavedSearch, *, threshold: int = 3, window_seconds: int = 300) -> AlertRule:
    return alerts.alert_rule_set(search_id=search.pk, window_seconds=window_seconds, threshold=threshold,
                                 created_by=BY)


def evaluate_at(seconds_from_now: float = 0) -> int:
    return alerts.alerts_evaluate(now=timezone.now() + timedelta(seconds=seconds_from_now))


# --- crossings -----------------------------------------------------------------------------------


def test_it_fires_once_when_the_count_reaches_the_threshold(make_task: Callable[..., Task]) -> None:
    rule = rule_on(search_of(), threshold=3)
    make_task(), make_task()
    assert evaluate_at() == 0
    rule.refresh_from_db()
    assert (rule.state, rule.last_count) == (AlertState.OK, 2)
    assert alert_messages() == []

    make_task()
    assert evaluate_at() == 1
    rule.refresh_from_db()
    assert (rule.state, rule.last_count) == (AlertState.FIRING, 3)
    (transition,) = AlertTransition.objects.all()
    assert (transition.rule_id, transition.state, transition.count, transition.threshold) == (rule.pk, "fired", 3, 3)
    (message,) = alert_messages()
    assert message.key == f"alert:{rule.pk}"
    assert message.payload == {
        "event": "AlertFired", "state": "firing", "rule_id": rule.pk, "transition_id": transition.pk,
        "search": {"id": rule.search_id, "name": "Acme leads", "slug": "acme-leads", "path": "/searches/acme-leads/"},
        "count": 3, "threshold": 3, "window_seconds": 300, "reason": "", "at": message.payload["at"],
    }


def test_it_does_not_notify_again_while_the_count_stays_above(make_task: Callable[..., Task]) -> None:
    rule = rule_on(search_of(), threshold=1)
    make_task()
    assert evaluate_at() == 1
    since = AlertRule.objects.get(pk=rule.pk).state_since
    make_task()
    assert [evaluate_at(seconds) for seconds in (1, 2, 3)] == [0, 0, 0]
    rule.refresh_from_db()
    assert (rule.state, rule.state_since, rule.last_count) == (AlertState.FIRING, since, 2)
    assert AlertTransition.objects.count() == 1 and len(alert_messages()) == 1


def complete(task: Task) -> None:
    services.event_append(namespace=task.namespace, task_id=task.pk, agent="worker",
                          draft=EventDraft(type="TaskCompleted", payload={"output": {}}))


def test_it_resolves_once_when_the_count_drops_below_and_fires_again_on_a_new_crossing(
    make_task: Callable[..., Task],
) -> None:
    rule = rule_on(search_of({"namespace": "acme", "status": "pending"}), threshold=2)
    first, _ = make_task(), make_task()
    assert evaluate_at(1) == 1
    complete(first)  # leaves the search: one pending task left
    assert evaluate_at(2) == 1
    assert evaluate_at(3) == 0
    rule.refresh_from_db()
    assert (rule.state, rule.last_count) == (AlertState.OK, 1)
    make_task()  # a new crossing: a new notification
    assert evaluate_at(4) == 1
    assert [t.state for t in AlertTransition.objects.order_by("at", "pk")] == ["fired", "resolved", "fired"]
    messages = alert_messages()
    assert [m.payload["state"] for m in messages] == ["firing", "resolved", "firing"]
    assert [m.payload["count"] for m in messages] == [2, 1, 2]
    assert {m.key for m in messages} == {f"alert:{rule.pk}"}
    # Strict per-key order: the outbox delivers one key's rows in id order.
    assert [m.payload["transition_id"] for m in messages] == list(
        AlertTransition.objects.order_by("at", "pk").values_list("pk", flat=True))


def test_it_resolves_when_the_window_moves_past_the_updates(make_task: Callable[..., Task]) -> None:
    rule = rule_on(search_of(), threshold=2, window_seconds=60)
    make_task(), make_task()
    assert evaluate_at() == 1
    # Two minutes later nothing was updated in the last minute.
    assert evaluate_at(120) == 1
    rule.refresh_from_db()
    assert (rule.state, rule.last_count) == (AlertState.OK, 0)
    assert [m.payload["state"] for m in alert_messages()] == ["firing", "resolved"]


def test_a_webhook_subscription_on_the_alerts_topic_gets_each_crossing(make_task: Callable[..., Task]) -> None:
    from backplane.delivery.models import WebhookSubscription

    hook = WebhookSubscription.objects.create(name="pager", url="https://pager.example/hook",
                                              topic_pattern="backplane.alerts", secret="s" * 32)
    rule_on(search_of(), threshold=1)
    make_task()
    evaluate_at()
    (row,) = OutboxMessage.objects.filter(topic=alerts.TOPIC, subscription=hook)
    assert row.payload["state"] == "firing"


def test_a_disabled_rule_is_not_evaluated_and_disabling_a_firing_rule_resolves_it(
    make_task: Callable[..., Task],
) -> None:
    search = search_of()
    rule = rule_on(search, threshold=1)
    make_task()
    evaluate_at()
    alerts.alert_rule_set(search_id=search.pk, rule_id=rule.pk, window_seconds=300, threshold=1, enabled=False,
                          created_by=BY)
    rule.refresh_from_db()
    assert rule.state == AlertState.OK
    assert [m.payload["state"] for m in alert_messages()] == ["firing", "resolved"]
    assert alert_messages()[-1].payload["reason"] == f"rule disabled by {BY}"
    assert evaluate_at(1) == 0 and len(alert_messages()) == 2


def test_deleting_a_firing_rule_or_its_search_resolves_it_and_keeps_the_history(
    make_task: Callable[..., Task],
) -> None:
    search = search_of()
    first, second = rule_on(search, threshold=1), rule_on(search, threshold=1, window_seconds=600)
    make_task()
    assert evaluate_at() == 2
    alerts.alert_rule_delete(rule_id=first.pk, by=BY)
    alerts.saved_search_delete(search_id=search.pk, by=BY)
    assert not AlertRule.objects.exists() and not SavedSearch.objects.exists()
    resolved = [m.payload for m in alert_messages() if m.payload["state"] == "resolved"]
    assert [(p["rule_id"], p["reason"]) for p in resolved] == [
        (first.pk, f"rule deleted by {BY}"), (second.pk, f"saved search deleted by {BY}")]
    assert AlertTransition.objects.count() == 4
    assert set(AlertTransition.objects.values_list("rule", flat=True)) == {None}


def test_a_saved_search_with_a_payload_search_counts_like_the_task_list(make_task: Callable[..., Task]) -> None:
    make_task(input={"lead": "bob@example.com", "note": "wants a refund"})
    make_task(input={"lead": "carol@example.com", "note": "wants a refund"})
    make_task(input={"lead": "dave@example.com", "note": "happy"})
    make_task(namespace="globex", input={"note": "wants a refund"})
    filters = TaskFilters(q="wants a refund", namespace="acme")
    search = alerts.saved_search_save(name="Refunds", filter=filters.as_json(), created_by=BY)
    assert tasks_filtered(filters).count() == 2  # what the task list shows
    assert [c.count for c in selectors.saved_search_counts([search])] == [2]
    rule = rule_on(search, threshold=2)
    assert selectors.alert_count(rule, now=timezone.now()) == 2
    assert evaluate_at() == 1


def test_counts_of_many_searches_take_one_query(
    make_task: Callable[..., Task], django_assert_num_queries: Any,
) -> None:
    make_task(), make_task(kind="other")
    searches = [search_of({"namespace": "acme"}, name="All"), search_of({"kind": "other"}, name="Other"),
                search_of({"q": "alice@example.com"}, name="Alice"), search_of({"status": "completed"}, name="Done")]
    with django_assert_num_queries(1):
        counts = selectors.saved_search_counts(searches)
    assert [c.count for c in counts] == [2, 1, 2, 0]


# --- concurrent evaluators -----------------------------------------------------------------------


def test_concurrent_evaluators_announce_a_crossing_once(committed_db: None) -> None:
    search = search_of()
    rule = rule_on(search, threshold=2)
    for _ in range(2):
        services.task_create(namespace="acme", kind="k", input={}, agent="planner")
    # Every evaluator read the rule as "ok" before any of them decided: the race at its widest.
    seen = AlertRule.objects.select_related("search").get(pk=rule.pk)
    now = timezone.now()
    changed: list[bool] = []

    def evaluate(index: int) -> None:
        changed.append(alerts.alert_rule_evaluate(copy.deepcopy(seen), now=now))

    assert run_in_threads(8, evaluate) == []
    assert sorted(changed) == [False] * 7 + [True]
    assert AlertTransition.objects.count() == 1
    assert len(alert_messages()) == 1
    assert AlertRule.objects.get(pk=rule.pk).state == AlertState.FIRING


def test_concurrent_full_evaluations_fire_once(committed_db: None) -> None:
    rule_on(search_of(), threshold=1)
    services.task_create(namespace="acme", kind="k", input={}, agent="planner")
    now = timezone.now()
    results: list[int] = []
    assert run_in_threads(6, lambda index: results.append(alerts.alerts_evaluate(now=now))) == []
    assert sum(results) == 1 and len(alert_messages()) == 1


# --- bad input changes nothing -------------------------------------------------------------------


def nothing_written() -> tuple[int, int, int, int]:
    return (SavedSearch.objects.count(), AlertRule.objects.count(), AlertTransition.objects.count(),
            OutboxMessage.objects.filter(topic=alerts.TOPIC).count())


@pytest.mark.parametrize(("filter", "field"), [
    ({"colour": "red"}, "filter"),
    ({"status": "sleeping"}, "filter.status"),
    ({"created_after": "yesterday"}, "filter.created_after"),
    ({"recovering": "yes"}, "filter.recovering"),
    (["status", "failed"], "filter"),
])
def test_a_search_with_a_bad_filter_is_refused(db: None, filter: Any, field: str) -> None:
    before = nothing_written()
    with pytest.raises(InvalidInput) as refused:
        alerts.saved_search_save(name="Bad", filter=filter, created_by=BY)
    assert field in refused.value.details
    assert nothing_written() == before


def test_a_duplicate_slug_or_a_blank_name_is_refused(db: None) -> None:
    search_of(name="Stalls")
    before = nothing_written()
    with pytest.raises(InvalidInput) as refused:
        alerts.saved_search_save(name="stalls!", filter={}, created_by=BY)
    assert "slug" in refused.value.details and "/searches/stalls/" in refused.value.message
    with pytest.raises(InvalidInput):
        alerts.saved_search_save(name="Other", slug="stalls", filter={}, created_by=BY)
    with pytest.raises(InvalidInput):
        alerts.saved_search_save(name="   ", filter={}, created_by=BY)
    with pytest.raises(InvalidInput):
        alerts.saved_search_save(name="Bad slug", slug="not a slug/", filter={}, created_by=BY)
    assert nothing_written() == before


def test_a_name_with_nothing_to_slugify_still_gets_a_url(db: None) -> None:
    search = alerts.saved_search_save(name="退款", filter={}, created_by=BY)
    assert search.slug.startswith("search-") and search.name == "退款"


@pytest.mark.parametrize(("window", "threshold", "field"), [
    (0, 5, "window_seconds"), (-60, 5, "window_seconds"), (60, 0, "threshold"), (60, -1, "threshold"),
    (True, 5, "window_seconds"), (60, "5", "threshold"), (ALERT_WINDOW_MAX_SECONDS + 1, 5, "window_seconds"),
])
def test_a_rule_with_a_bad_window_or_threshold_is_refused(db: None, window: Any, threshold: Any, field: str) -> None:
    search = search_of()
    before = nothing_written()
    with pytest.raises(InvalidInput) as refused:
        alerts.alert_rule_set(search_id=search.pk, window_seconds=window, threshold=threshold, created_by=BY)
    assert field in refused.value.details
    assert nothing_written() == before


def test_unknown_searches_and_rules_are_not_found(db: None) -> None:
    before = nothing_written()
    for call in (lambda: alerts.alert_rule_set(search_id=999, window_seconds=60, threshold=1, created_by=BY),
                 lambda: alerts.alert_rule_delete(rule_id=999, by=BY),
                 lambda: alerts.saved_search_pin(search_id=999, pinned=True, by=BY),
                 lambda: alerts.saved_search_delete(search_id=999, by=BY)):
        with pytest.raises(NotFound):
            call()
    assert nothing_written() == before


def test_a_search_whose_stored_filter_went_bad_is_not_counted(make_task: Callable[..., Task]) -> None:
    search = search_of()
    rule = rule_on(search, threshold=1)
    make_task()
    SavedSearch.objects.filter(pk=search.pk).update(filter={"colour": "red"})
    search.refresh_from_db()
    assert [c.count for c in selectors.saved_search_counts([search])] == [None]
    assert evaluate_at() == 0
    assert AlertRule.objects.get(pk=rule.pk).last_evaluated_at is None


# --- wiring --------------------------------------------------------------------------------------


def test_the_search_path_is_the_dashboards() -> None:
    assert reverse("dashboard:saved-search", args=["x-y"]) == alerts.SEARCH_PATH.format(slug="x-y")


def test_the_evaluation_is_a_watched_duty_every_30_seconds(make_task: Callable[..., Task]) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["evaluate-alerts"]
    assert entry["task"] == "recovery.tasks.evaluate_alerts"
    assert entry["options"] == {"expires": 30}
    assert duties.scheduled_duties()["evaluate-alerts"] == 30.0
    rule_on(search_of(), threshold=1)
    make_task()
    assert "recovery.tasks.evaluate_alerts" in celery_app.tasks
    assert recovery_tasks.evaluate_alerts.apply().get() == 1


def test_an_administrator_adds_and_changes_a_rule_in_the_admin(admin_client: Any) -> None:
    """The admin saves through alert_rule_set, whose transaction is its own (durable), not
    nested in the admin's."""
    search = search_of()
    added = admin_client.post("/admin/recovery/alertrule/add/", {"search": search.pk, "threshold": 4,
                                                                 "window_seconds": 600, "enabled": "on"})
    assert added.status_code == 302, added.content[-1500:]
    rule = AlertRule.objects.get(search=search)
    assert (rule.threshold, rule.window_seconds, rule.created_by) == (4, 600, "user:admin")
    changed = admin_client.post(f"/admin/recovery/alertrule/{rule.pk}/change/", {"threshold": 5,
                                                                                "window_seconds": 600})
    assert changed.status_code == 302, changed.content[-1500:]
    rule.refresh_from_db()
    assert (rule.threshold, rule.enabled) == (5, False)
