"""Saved searches and the alert rules that watch them.

A saved search is a task-list filter (``backplane.eventlog.selectors.TaskFilters``) under a name
and a slug: ``/searches/<slug>/`` opens the task list with it, and a pinned one is a tile with its
live count on the overview.

An alert rule counts, over a window, the tasks its search matches whose ``updated_at`` falls in
the last ``window_seconds`` (the same filter as the task list, payload search included, plus
``updated_at`` in ``(now - window, now]``). It fires when that count is at least ``threshold`` and
resolves when it is below again. ``alerts_evaluate`` (the ``evaluate-alerts`` duty, every 30 s)
is the step that decides:

1. the count is read outside any transaction (it may scan many tasks and must hold no lock);
2. a rule whose state stays the same only records the count;
3. a rule whose state changes does so by a conditional UPDATE on the state it read (and on the
   window, threshold and ``enabled`` it counted with, and no newer evaluation); the evaluator
   whose UPDATE changed the row writes, in the same transaction, one ``AlertTransition`` and one
   outbox message on ``backplane.alerts``. Another evaluator that raced it finds the row changed
   (its UPDATE waits for the winner's commit, then matches nothing) and writes nothing, so a
   crossing is announced once however many evaluators run, and never once per evaluation.

Messages are keyed ``alert:<rule id>``: the outbox delivers one key's messages in order, so a
receiver never sees a rule's "resolved" before its "firing". Someone is paged by a webhook
subscription on ``backplane.alerts`` (backplane/delivery); delivery then retries with backoff and
ends in a dead letter like every other message (docs/operations.md, "Saved searches and alerts").
A firing rule that is deleted or disabled, or whose search is deleted, resolves with a reason,
so a page opened by it is closed too. The reads (a rule's count, the searches with their counts,
the firing rules, the recent transitions) are in recovery/selectors.py.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from backplane.delivery.outbox import outbox_enqueue
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import InvalidInput, NotFound
from backplane.eventlog.selectors import task_filters_from_json
from recovery.models import (
    ALERT_THRESHOLD_MAX,
    ALERT_WINDOW_MAX_SECONDS,
    AlertRule,
    AlertState,
    AlertTransition,
    AlertTransitionState,
    SavedSearch,
)
from recovery.selectors import alert_count

logger = logging.getLogger(__name__)

TOPIC = "backplane.alerts"
# The dashboard serves this path (dashboard/urls.py, "saved-search"); recovery names it as text
# because it never imports the dashboard. A test checks the two agree.
SEARCH_PATH = "/searches/{slug}/"
NAME_MAX = 200
SLUG_MAX = 100
_SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")


def search_path(search: SavedSearch) -> str:
    return SEARCH_PATH.format(slug=search.slug)


# --- saved searches ------------------------------------------------------------------------------


def saved_search_save(
    *, name: str, filter: Mapping[str, Any], created_by: str, slug: str = "", pinned: bool = False,
    now: datetime | None = None,
) -> SavedSearch:
    """Save a filter under a name. ``slug`` (the shareable URL's last part) is made from the name
    unless given; one already taken is refused, as are unknown filter keys and bad values."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("a saved search needs a name", {"name": "required"})
    name = name.strip()
    if len(name) > NAME_MAX:
        raise InvalidInput("the name is too long", {"name": f"at most {NAME_MAX} characters"})
    filters = task_filters_from_json(filter)
    # A name with no letter slugify keeps (all CJK, say) still gets a URL.
    slug = (slug or "").strip() or slugify(name)[:SLUG_MAX].strip("-") or f"search-{secrets.token_hex(4)}"
    if not slug or len(slug) > SLUG_MAX or not _SLUG.match(slug):
        raise InvalidInput("the search needs a URL name", {"slug": f"letters, digits, - and _; at most {SLUG_MAX}"})
    try:
        with transaction.atomic(durable=True):
            return SavedSearch.objects.create(
                name=name, slug=slug, filter=filters.as_json(), pinned=bool(pinned), created_by=created_by,
                created_at=now or timezone.now(),
            )
    except IntegrityError:
        # The unique slug, taken by another save that committed first (or long ago).
        raise InvalidInput(f"a saved search already has the URL {SEARCH_PATH.format(slug=slug)}",
                           {"slug": f"{slug!r} is taken; choose another name or slug"}) from None


def saved_search_pin(*, search_id: int, pinned: bool, by: str) -> SavedSearch:
    """Pin a search as an overview tile, or take the tile away."""
    with transaction.atomic(durable=True):
        if not SavedSearch.objects.filter(pk=search_id).update(pinned=bool(pinned)):
            raise NotFound("no such saved search", {"search_id": search_id})
        search = SavedSearch.objects.get(pk=search_id)
    logger.info("saved search %s %s by %s", search.slug, "pinned" if pinned else "unpinned", by)
    return search


def saved_search_delete(*, search_id: int, by: str, now: datetime | None = None) -> None:
    """Delete a search and its alert rules; a firing rule resolves first (one message each)."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        search = SavedSearch.objects.select_for_update().filter(pk=search_id).first()
        if search is None:
            raise NotFound("no such saved search", {"search_id": search_id})
        # Locked in id order, as every writer of rules takes them, so two deletions cannot deadlock
        # and an evaluator's conditional UPDATE waits for this decision.
        for rule in AlertRule.objects.select_for_update().filter(search=search).order_by("pk"):
            if rule.state == AlertState.FIRING:
                _transition(rule, search, state=AlertTransitionState.RESOLVED, count=rule.last_count or 0, now=now,
                            reason=f"saved search deleted by {by}")
        search.delete()
    logger.info("saved search %s deleted by %s", search.slug, by)


# --- alert rules ---------------------------------------------------------------------------------


def _positive(value: Any, field: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidInput(f"{field} must be a whole number from 1 to {maximum}", {field: f"1 to {maximum}"})
    return value


def alert_rule_set(
    *, search_id: int, window_seconds: int, threshold: int, created_by: str, enabled: bool = True,
    rule_id: int | None = None, now: datetime | None = None,
) -> AlertRule:
    """Create a rule on a search (or, with ``rule_id``, change one). A changed rule keeps its state:
    the next evaluation decides with the new numbers. Disabling a firing rule resolves it."""
    window_seconds = _positive(window_seconds, "window_seconds", ALERT_WINDOW_MAX_SECONDS)
    threshold = _positive(threshold, "threshold", ALERT_THRESHOLD_MAX)
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        # Locked as saved_search_delete locks it first: a rule is never added to a search being deleted.
        search = SavedSearch.objects.select_for_update().filter(pk=search_id).first()
        if search is None:
            raise NotFound("no such saved search", {"search_id": search_id})
        if rule_id is None:
            return AlertRule.objects.create(
                search=search, window_seconds=window_seconds, threshold=threshold, enabled=bool(enabled),
                state=AlertState.OK, state_since=now, created_by=created_by, created_at=now,
            )
        rule = AlertRule.objects.select_for_update().filter(pk=rule_id, search=search).first()
        if rule is None:
            raise NotFound("no such alert rule on this search", {"rule_id": rule_id})
        rule.window_seconds, rule.threshold, rule.enabled = window_seconds, threshold, bool(enabled)
        fields = ["window_seconds", "threshold", "enabled"]
        if not rule.enabled and rule.state == AlertState.FIRING:
            _transition(rule, search, state=AlertTransitionState.RESOLVED, count=rule.last_count or 0, now=now,
                        reason=f"rule disabled by {created_by}")
            rule.state, rule.state_since = AlertState.OK, now
            fields += ["state", "state_since"]
        rule.save(update_fields=fields)
        return rule


def alert_rule_delete(*, rule_id: int, by: str, now: datetime | None = None) -> None:
    """Delete a rule; if it is firing, it resolves first (one message), so a page it opened closes.
    Its transitions stay, as history."""
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        rule = AlertRule.objects.select_for_update().select_related("search").filter(pk=rule_id).first()
        if rule is None:
            raise NotFound("no such alert rule", {"rule_id": rule_id})
        if rule.state == AlertState.FIRING:
            _transition(rule, rule.search, state=AlertTransitionState.RESOLVED, count=rule.last_count or 0, now=now,
                        reason=f"rule deleted by {by}")
        rule.delete()
    logger.info("alert rule %s deleted by %s", rule_id, by)


# --- evaluation ----------------------------------------------------------------------------------


def alerts_evaluate(*, now: datetime | None = None) -> int:
    """Count every enabled rule and record the crossings. Returns how many rules changed state."""
    now = now or timezone.now()
    changed = 0
    for rule in AlertRule.objects.filter(enabled=True).select_related("search").order_by("pk"):
        changed += alert_rule_evaluate(rule, now=now)
    return changed


def alert_rule_evaluate(rule: AlertRule, *, now: datetime) -> bool:
    """One rule: count, then fire or resolve if the count crossed its threshold. True when this
    call changed the rule's state (and so wrote its transition and message)."""
    try:
        count = alert_count(rule, now=now)
    except InvalidInput:
        # A filter that no longer reads (edited by hand): the rule cannot count, so it keeps
        # its state; the log says why, each evaluation, until someone fixes or deletes it.
        logger.warning("alert rule %s: saved search %s has a filter that is not valid", rule.pk, rule.search.slug)
        return False
    target = AlertState.FIRING if count >= rule.threshold else AlertState.OK
    # What this evaluation counted with is still the rule, and no later evaluation has recorded.
    as_counted = AlertRule.objects.filter(
        Q(last_evaluated_at__isnull=True) | Q(last_evaluated_at__lte=now), pk=rule.pk, enabled=True,
        state=rule.state, window_seconds=rule.window_seconds, threshold=rule.threshold,
    )
    if target == rule.state:
        as_counted.update(last_count=count, last_evaluated_at=now)
        return False
    with transaction.atomic(durable=True):
        # The claim: a concurrent evaluator's UPDATE of the same row waits for this commit, then
        # finds the state changed and matches nothing, so only one of them announces the crossing.
        if not as_counted.update(state=target, state_since=now, last_count=count, last_evaluated_at=now):
            return False
        state = AlertTransitionState.FIRED if target == AlertState.FIRING else AlertTransitionState.RESOLVED
        _transition(rule, rule.search, state=state, count=count, now=now)
    return True


def _transition(
    rule: AlertRule, search: SavedSearch, *, state: AlertTransitionState, count: int, now: datetime, reason: str = "",
) -> AlertTransition:
    """Record a crossing and enqueue its one message, in the caller's transaction."""
    transition = AlertTransition.objects.create(
        rule=rule, search_name=search.name, state=state, count=count, threshold=rule.threshold,
        window_seconds=rule.window_seconds, reason=reason, at=now,
    )
    # A rule watches the whole fleet, no one namespace: its messages carry ``"namespace": null``
    # and reach only subscriptions limited to no namespace (docs/delivery.md).
    outbox_enqueue(topic=TOPIC, key=f"alert:{rule.pk}", payload=alert_message(transition, rule=rule, search=search),
                   headers={"created_at": format_timestamp(now)}, now=now, namespace=None)
    return transition


def alert_message(transition: AlertTransition, *, rule: AlertRule, search: SavedSearch) -> dict[str, Any]:
    """What a receiver gets on ``backplane.alerts``. ``state`` is "firing" or "resolved", as
    Prometheus Alertmanager's webhooks say it; ``transition_id`` tells repeats of one delivery
    (the outbox delivers at least once) from a new crossing."""
    return {
        "event": "AlertFired" if transition.state == AlertTransitionState.FIRED else "AlertResolved",
        "state": "firing" if transition.state == AlertTransitionState.FIRED else "resolved",
        "rule_id": rule.pk,
        "transition_id": transition.pk,
        "search": {"id": search.pk, "name": search.name, "slug": search.slug, "path": search_path(search)},
        "count": transition.count,
        "threshold": transition.threshold,
        "window_seconds": transition.window_seconds,
        "reason": transition.reason,
        "at": format_timestamp(transition.at),
    }
