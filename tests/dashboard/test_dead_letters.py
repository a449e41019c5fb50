"""Dead-letter review in the dashboard: who may look and who may decide, the queue, one dead
letter, decisions on one and on many, through Django's test client on the real database."""

from __future__ import annotations

import base64
import itertools
import json
import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backplane.delivery import relay
from backplane.delivery import selectors as delivery
from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.eventlog.writer import EventDraft, OutboxDraft
from recovery import bulk, dead_letters, detector
from recovery.leases import lease_claim
from recovery.models import BulkJob, BulkJobDecision, BulkJobItem
from tests.dashboard.conftest import html, reviewers_group

TEST_TOPIC = "leads.scored"
_agents = itertools.count(1)


# --- people ---------------------------------------------------------------------------------------


def make_reviewer(name: str) -> User:
    user = User.objects.create_user(name, password="correct horse battery", is_staff=True)
    user.groups.add(reviewers_group())
    return user


@pytest.fixture
def rita(db: None) -> User:
    """A reviewer: staff, in the Reviewers group."""
    return make_reviewer("rita")


@pytest.fixture
def rita_client(rita: User) -> Client:
    client = Client()
    client.force_login(rita)
    return client


# --- dead letters, made the way the product makes them ---------------------------------------------


def dead_lettered_tasks(count: int, *, kind: str | None = None) -> list[DeadLetter]:
    """Tasks whose only attempt ran out: claimed, the lease expired, and the stall detector
    parked each for review (``TaskStalled``, ``TaskDeadLettered`` and a task dead letter).
    Each call uses a kind of its own, so its agent claims exactly these tasks."""
    n = next(_agents)
    kind = kind or f"lead-triage-{n}"
    agent = services.agent_create(name=f"worker-{n}", namespace="acme", kinds=[kind]).agent
    tasks = [
        services.task_create(namespace="acme", kind=kind, input={"lead": f"lead-{n}@example.com"}, agent="planner",
                             max_attempts=1).task
        for n in range(count)
    ]
    for _ in tasks:
        assert lease_claim(agent=agent, kinds=[kind], lease_seconds=30) is not None
    # The leases run out (as the stall detector's own tests do it): the detector takes them back.
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    while detector.lease_expire_stalled(batch_size=500).expired:
        pass
    made = list(DeadLetter.objects.filter(task__in=tasks, source="task").order_by("created_at", "id"))
    assert len(made) == count
    assert set(Task.objects.filter(pk__in=[t.pk for t in tasks]).values_list("status", flat=True)) == {"dead_lettered"}
    return made


def task_id_of(item: DeadLetter | OutboxMessage) -> uuid.UUID:
    """The task ``item`` belongs to: the one a task dead letter parks, or whose event wrote a message."""
    assert item.task_id is not None, item
    return item.task_id


def failing_publisher(message: OutboxMessage, body: dict[str, Any]) -> None:
    """The broker refuses the test's topic and takes everything else."""
    if message.topic == TEST_TOPIC:
        raise relay.PublishError("broker: ConnectionRefusedError [Errno 111] Connection refused")


@pytest.fixture
def dead_outbox_messages(settings: Any, make_task: Callable[..., Task]) -> Callable[..., list[DeadLetter]]:
    """Outbox messages the relay gave up on after two failed attempts (their history kept)."""
    settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS = 2

    def make(count: int = 1) -> list[DeadLetter]:
        for n in range(count):
            task = make_task()
            services.event_append(
                namespace="acme", task_id=task.pk, agent="scorer",
                draft=EventDraft(type="LeadScored", payload={"score": 70 + n},
                                 outbox=(OutboxDraft(topic=TEST_TOPIC, payload={"lead": n, "score": 70 + n},
                                                     key=f"lead-{task.pk}"),)),
            )
        before = set(DeadLetter.objects.values_list("pk", flat=True))
        for _ in range(2):
            OutboxMessage.objects.filter(status="pending").update(next_attempt_at=timezone.now())
            relay.outbox_relay_until_idle(publish=failing_publisher, budget_seconds=10)
        made = list(DeadLetter.objects.exclude(pk__in=before).order_by("id"))
        assert len(made) == count and all(d.source == "outbox" and len(d.history) == 2 for d in made)
        return made

    return make


def pending_ids(page: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr data-id="(\d+)" data-state="pending"', page)]


def row_ids(page: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr data-id="(\d+)"', page)]


def csrf_client(user: User) -> tuple[Client, str]:
    """A client that enforces CSRF like a browser, with the token a page gave it."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/dead-letters/")
    return client, client.cookies["csrftoken"].value


# --- who may look, who may decide -------------------------------------------------------------------


def test_anonymous_visitors_log_in_and_non_staff_users_are_refused(client: Client, victor: User) -> None:
    item = DeadLetter.objects.create(source="audit_export", reference="segment 3", created_at=timezone.now())
    for path in ("/dead-letters/", f"/dead-letters/{item.pk}/"):
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/login/?next=")
    client.force_login(victor)
    assert client.get("/dead-letters/").status_code == 403
    assert client.get(f"/dead-letters/{item.pk}/").status_code == 403
    assert client.post(f"/dead-letters/{item.pk}/discard/", {"reason": "x"}).status_code == 403
    assert DeadLetter.objects.get().status == "pending"


def test_a_viewer_sees_everything_but_no_decision_controls(olivia_client: Client) -> None:
    (item,) = dead_lettered_tasks(1)
    queue = html(olivia_client.get("/dead-letters/"))
    assert pending_ids(queue) == [item.pk]
    assert 'id="bulk-form"' not in queue and 'name="ids"' not in queue and 'id="viewer-note"' in queue
    page = html(olivia_client.get(f"/dead-letters/{item.pk}/"))
    assert 'id="requeue-effect"' in page and "goes back to pending" in page
    for control in ('id="requeue-form"', 'id="discard-form"', 'id="edit-form"', "/requeue/", "/discard/"):
        assert control not in page
    assert 'id="viewer-note"' in page


def test_a_forged_decision_from_a_viewers_session_gets_403_and_changes_nothing(olivia: User) -> None:
    (item,) = dead_lettered_tasks(1)
    client, token = csrf_client(olivia)
    attempts: dict[str, dict[str, Any]] = {
        f"/dead-letters/{item.pk}/requeue/": {"reason": "forged"},
        f"/dead-letters/{item.pk}/discard/": {"reason": "forged", "compensate": "on"},
        "/dead-letters/bulk/": {"action": "dead_letter_requeue", "reason": "forged", "ids": [item.pk]},
    }
    for path, data in attempts.items():
        response = client.post(path, {**data, "csrfmiddlewaretoken": token})
        assert response.status_code == 403, path
        assert "review_deadletter" in html(response) and "nothing was changed" in html(response)
        as_json = client.post(path, {**data, "csrfmiddlewaretoken": token}, HTTP_ACCEPT="application/json")
        assert as_json.status_code == 403 and as_json.json()["error"]["code"] == "permission_denied"
    item.refresh_from_db()
    task = Task.objects.get(pk=task_id_of(item))
    assert (item.status, item.decided_by, task.status) == ("pending", None, "dead_lettered")
    assert not Event.objects.filter(task=task, type__in=["DeadLetterRequeued", "DeadLetterDiscarded"]).exists()
    assert job_rows() == (0, 0, 0)


def test_csrf_stays_on_for_decisions(rita: User) -> None:
    (item,) = dead_lettered_tasks(1)
    client = Client(enforce_csrf_checks=True)
    client.force_login(rita)
    assert client.post(f"/dead-letters/{item.pk}/requeue/", {"reason": "no token"}).status_code == 403
    assert DeadLetter.objects.get(pk=item.pk).status == "pending"


def test_a_superuser_may_decide(client: Client, db: None) -> None:
    client.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    (item,) = dead_lettered_tasks(1)
    assert 'id="requeue-form"' in html(client.get(f"/dead-letters/{item.pk}/"))
    assert client.post(f"/dead-letters/{item.pk}/requeue/", {"reason": "retry"}).status_code == 302
    assert DeadLetter.objects.get(pk=item.pk).decided_by == "user:root"


# --- one decision ---------------------------------------------------------------------------------


def test_a_reviewer_requeues_a_task_dead_letter_and_the_task_runs_again(rita_client: Client) -> None:
    item, other = dead_lettered_tasks(2)
    page = html(rita_client.get(f"/dead-letters/{item.pk}/"))
    assert 'id="requeue-form"' in page and 'id="discard-form"' in page and "compensate" in page
    assert 'id="edit-form"' not in page  # a task is requeued as it is
    assert f'href="/tasks/{item.task_id}/#timeline"' in page

    response = rita_client.post(f"/dead-letters/{item.pk}/requeue/", {"reason": "worker pool is back"}, follow=True)
    assert response.redirect_chain == [(f"/dead-letters/{item.pk}/", 302)]
    assert "requeued as it was" in html(response) and 'id="decision-record"' in html(response)
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.reason) == ("requeued", "user:rita", "worker pool is back")
    task = Task.objects.get(pk=task_id_of(item))
    assert (task.status, task.attempts) == ("pending", 0)
    (event,) = Event.objects.filter(task=task, type="DeadLetterRequeued")
    assert (event.agent, event.payload["reason"], event.payload["dead_letter_id"]) == (
        "user:rita", "worker pool is back", item.pk)

    assert pending_ids(html(rita_client.get("/dead-letters/?status=pending"))) == [other.pk]
    task_page = html(rita_client.get(f"/tasks/{task.pk}/"))
    assert 'data-type="DeadLetterRequeued"' in task_page and "worker pool is back" in task_page
    # The task is claimable again: the next agent gets it.
    agent = services.agent_create(name="worker-again", namespace="acme", kinds=[task.kind]).agent
    claim = lease_claim(agent=agent, kinds=None, lease_seconds=30)
    assert claim is not None and claim.task.pk == task.pk
    # Its attempts start afresh, but the claim is a recovery: the attempts before it failed.
    assert claim.recovered is True
    assert Event.objects.get(task=task, seq=claim.task.last_seq).payload["recovered"] is True


def test_a_decision_needs_a_reason(rita_client: Client) -> None:
    (item,) = dead_lettered_tasks(1)
    for path in (f"/dead-letters/{item.pk}/requeue/", f"/dead-letters/{item.pk}/discard/"):
        response = rita_client.post(path, {"reason": "   "})
        assert response.status_code == 400 and "Write a reason" in html(response)
    assert DeadLetter.objects.get(pk=item.pk).status == "pending"
    assert Task.objects.get(pk=task_id_of(item)).status == "dead_lettered"


def test_edit_and_requeue_with_invalid_json_is_refused_by_the_server(rita_client: Client,
                                                                     dead_outbox_messages: Any) -> None:
    (item,) = dead_outbox_messages()
    message_before = OutboxMessage.objects.get(pk=item.outbox_message_id).payload
    page = html(rita_client.get(f"/dead-letters/{item.pk}/"))
    assert 'id="edit-form"' in page and 'id="edit-diff"' in page and 'id="json-status"' in page
    for text, error in (
        ('{"lead": 0, "score": 99', "Not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"score": NaN}', "NaN is not a JSON value"),
        ("", "The edited payload is empty"),
    ):
        response = rita_client.post(f"/dead-letters/{item.pk}/requeue/", {"payload": text, "reason": "fix score"})
        assert response.status_code == 400, text
        assert error in html(response), text
        # The page comes back with what was typed, to fix it.
        if text:
            assert html(response).count("fix score") >= 1
    item.refresh_from_db()
    assert (item.status, item.payload, item.original_payload) == ("pending", {"lead": 0, "score": 70}, None)
    message = OutboxMessage.objects.get(pk=item.outbox_message_id)
    assert (message.status, message.payload) == ("dead", message_before)
    as_json = rita_client.post(f"/dead-letters/{item.pk}/requeue/", {"payload": "{", "reason": "x"},
                               HTTP_ACCEPT="application/json")
    assert as_json.status_code == 400 and as_json.json()["error"]["code"] == "validation_error"


def test_edit_and_requeue_keeps_the_original_on_record(rita_client: Client, dead_outbox_messages: Any) -> None:
    (item,) = dead_outbox_messages()
    edited = {"lead": 0, "score": 71, "note": "rescored"}
    response = rita_client.post(f"/dead-letters/{item.pk}/requeue/",
                                {"payload": json.dumps(edited, indent=2), "reason": "score was off by one"})
    assert response.status_code == 302
    item.refresh_from_db()
    assert (item.status, item.payload, item.original_payload) == ("requeued", edited, {"lead": 0, "score": 70})
    message = OutboxMessage.objects.get(pk=item.outbox_message_id)
    assert (message.status, message.attempts, message.payload) == ("pending", 0, edited)
    event = Event.objects.get(task_id=item.task_id, type="DeadLetterRequeued")
    assert event.payload["payload"] == edited and event.payload["original_payload"] == {"lead": 0, "score": 70}
    page = html(rita_client.get(f"/dead-letters/{item.pk}/"))
    assert 'id="original-payload"' in page and 'id="decided-diff"' in page and "with an edited payload" in page
    # The relay sends the edited message now.
    relay.outbox_relay_until_idle(publish=lambda message, body: None, budget_seconds=5)
    assert OutboxMessage.objects.get(pk=item.outbox_message_id).status == "delivered"


def test_a_task_dead_letter_cannot_be_edited_even_by_a_forged_post(rita_client: Client) -> None:
    (item,) = dead_lettered_tasks(1)
    response = rita_client.post(f"/dead-letters/{item.pk}/requeue/", {"payload": '{"x": 1}', "reason": "edit"})
    assert response.status_code == 400 and "a task is requeued as it is" in html(response)
    item.refresh_from_db()
    assert item.status == "pending" and Task.objects.get(pk=task_id_of(item)).status == "dead_lettered"


def test_discard_records_the_reason_and_compensate_fails_the_task(rita_client: Client) -> None:
    kept, compensated = dead_lettered_tasks(2)
    assert rita_client.post(f"/dead-letters/{kept.pk}/discard/", {"reason": "lead is gone"}).status_code == 302
    assert rita_client.post(f"/dead-letters/{compensated.pk}/discard/",
                            {"reason": "undo it", "compensate": "on"}).status_code == 302
    assert Task.objects.get(pk=task_id_of(kept)).status == "dead_lettered"
    assert Task.objects.get(pk=task_id_of(compensated)).status in ("failed", "compensated", "compensating")
    for item, compensate in ((kept, False), (compensated, True)):
        item.refresh_from_db()
        assert (item.status, item.decided_by) == ("discarded", "user:rita")
        event = Event.objects.get(task_id=task_id_of(item), type="DeadLetterDiscarded")
        assert event.payload["compensate"] is compensate


def test_a_decision_that_lost_the_race_says_who_won_and_changes_nothing(rita_client: Client) -> None:
    (item,) = dead_lettered_tasks(1)
    page = html(rita_client.get(f"/dead-letters/{item.pk}/"))  # rita looks at the pending dead letter...
    assert 'id="discard-form"' in page
    # ...while someone else requeues it.
    dead_letters.dead_letter_requeue(dead_letter_id=item.pk, decided_by="user:sam", reason="mine")
    response = rita_client.post(f"/dead-letters/{item.pk}/discard/", {"reason": "obsolete"}, follow=True)
    assert "Already decided by user:sam (requeued); your decision changed nothing." in html(response)
    item.refresh_from_db()
    assert (item.status, item.decided_by, item.reason) == ("requeued", "user:sam", "mine")
    assert Event.objects.filter(task_id=task_id_of(item), type__startswith="DeadLetter").count() == 1
    as_json = rita_client.post(f"/dead-letters/{item.pk}/requeue/", {"reason": "x"}, HTTP_ACCEPT="application/json")
    assert as_json.status_code == 409 and as_json.json()["error"]["details"]["decided_by"] == "user:sam"


# --- the queue -----------------------------------------------------------------------------------------


def test_the_queue_lists_pending_oldest_first_then_decided_newest_first(olivia_client: Client) -> None:
    now = timezone.now()

    def made(minutes_ago: int, status: str = "pending") -> int:
        return DeadLetter.objects.create(source="audit_export", reference=f"segment {minutes_ago}", status=status,
                                         created_at=now - timedelta(minutes=minutes_ago),
                                         decided_by=None if status == "pending" else "user:sam",
                                         decided_at=None if status == "pending" else now).pk

    young, decided_old, old, decided_young = made(1), made(50, "discarded"), made(30), made(2, "requeued")
    page = html(olivia_client.get("/dead-letters/"))
    assert row_ids(page) == [old, young, decided_young, decided_old]
    assert "by user:sam" in page


def test_the_queue_filters(olivia_client: Client, dead_outbox_messages: Any) -> None:
    tasks = dead_lettered_tasks(2, kind="enrichment")
    (outbox,) = dead_outbox_messages()
    old = DeadLetter.objects.create(source="audit_export", reference="segment 9", error="S3: AccessDenied",
                                    created_at=timezone.now() - timedelta(hours=3))
    dead_letters.dead_letter_discard(dead_letter_id=tasks[1].pk, decided_by="user:sam", reason="gone")

    def listed(query: str) -> set[int]:
        response = olivia_client.get(f"/dead-letters/?{query}")
        assert response.status_code == 200, query
        return set(row_ids(html(response)))

    everything = {tasks[0].pk, tasks[1].pk, outbox.pk, old.pk}
    assert listed("") == everything
    assert listed("status=pending") == everything - {tasks[1].pk}
    assert listed("status=decided") == listed("status=discarded") == {tasks[1].pk}
    assert listed("source=outbox") == {outbox.pk}
    assert listed("topic=leads.sc") == {outbox.pk}
    assert listed("kind=enrichment") == {tasks[0].pk, tasks[1].pk}
    assert listed("error=accessdenied") == {old.pk}
    assert listed("error=CONNECTIONREFUSED") == {outbox.pk}
    assert listed("older_than=2&older_unit=hours") == {old.pk}
    assert listed("older_than=90&older_unit=minutes&source=task") == set()
    an_hour_ago = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert listed(f"created_after={an_hour_ago}&tz=0") == everything - {old.pk}
    assert listed(f"created_before={an_hour_ago}&tz=0") == {old.pk}
    assert olivia_client.get("/dead-letters/?status=bogus").status_code == 400


def test_keyset_pages_show_every_dead_letter_once_in_queue_order(db: None) -> None:
    now = timezone.now()
    DeadLetter.objects.bulk_create(
        DeadLetter(source="audit_export", reference=f"r{n}", created_at=now - timedelta(seconds=n % 7),
                   status="pending" if n % 3 else "requeued")
        for n in range(120)
    )
    seen: list[DeadLetter] = []
    cursor = None
    pages = 0
    while True:
        page = delivery.dead_letter_queue_page(delivery.DeadLetterFilters(), cursor=cursor, limit=25)
        seen += page.items
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert pages == 5 and len(seen) == 120 and len({d.pk for d in seen}) == 120
    pending = [d for d in seen if d.status == "pending"]
    assert seen[: len(pending)] == pending
    assert [(d.created_at, d.pk) for d in pending] == sorted((d.created_at, d.pk) for d in pending)
    decided = [d.pk for d in seen[len(pending):]]
    assert decided == sorted(decided, reverse=True)
    with pytest.raises(delivery.BadDeadLetterCursor):
        delivery.dead_letter_queue_page(delivery.DeadLetterFilters(), cursor="not-a-cursor")
    # Hostile cursors: too long to be ours, and an id past a bigint (a SQL error, were it used).
    for raw in (b"d||" + b"9" * 5000, b"d||9223372036854775808", b"d||\xd9\xa3"):
        with pytest.raises(delivery.BadDeadLetterCursor):
            delivery.dead_letter_queue_page(delivery.DeadLetterFilters(),
                                            cursor=base64.urlsafe_b64encode(raw).decode())


def test_the_first_page_refetch_shows_new_dead_letters(rita_client: Client) -> None:
    first = dead_lettered_tasks(1)
    response = rita_client.get("/dead-letters/?status=pending&partial=rows")
    assert response.status_code == 200 and set(row_ids(response.json()["rows"])) == {first[0].pk}
    second = dead_lettered_tasks(1)
    rows = rita_client.get("/dead-letters/?status=pending&partial=rows").json()["rows"]
    assert row_ids(rows) == [first[0].pk, second[0].pk]
    assert f'name="ids" value="{second[0].pk}"' in rows  # the same row template, checkboxes for a reviewer
    page = html(rita_client.get("/dead-letters/?status=pending"))
    assert 'data-live="first-page"' in page and 'data-query="status=pending"' in page
    assert 'data-live=""' in html(rita_client.get(f"/dead-letters/?cursor={_cursor_after(first[0])}"))


def _cursor_after(item: DeadLetter) -> str:
    return delivery._encode_queue_cursor(item)


# --- one dead letter's page -------------------------------------------------------------------------


def test_the_page_shows_the_payload_error_and_attempt_history(olivia_client: Client, dead_outbox_messages: Any) -> None:
    (outbox,) = dead_outbox_messages()
    page = html(olivia_client.get(f"/dead-letters/{outbox.pk}/"))
    assert "Connection refused" in page and "&quot;score&quot;: 70" in page
    assert page.count("<tr><td class=\"num\">") >= 2  # both failed attempts
    assert "sent again to leads.scored from attempt 0" in page

    (task_letter,) = dead_lettered_tasks(1)
    page = html(olivia_client.get(f"/dead-letters/{task_letter.pk}/"))
    assert 'data-type="TaskStalled"' in page and 'data-type="TaskDeadLettered"' in page
    assert 'data-type="TaskClaimed"' in page and "attempt 1 of 1" in page
    stalled = Event.objects.get(task_id=task_id_of(task_letter), type="TaskStalled")
    assert f'href="/tasks/{task_letter.task_id}/#seq-{stalled.seq}"' in page
    assert olivia_client.get("/dead-letters/999999/").status_code == 404


def test_a_dead_letter_holding_its_key_shows_how_many_messages_wait_behind_it(olivia_client: Client,
                                                                             dead_outbox_messages: Any) -> None:
    (outbox,) = dead_outbox_messages()  # strict ordering (the default): it holds its key
    message = OutboxMessage.objects.get(pk=outbox.outbox_message_id)
    for score in (71, 72):
        services.event_append(namespace="acme", task_id=task_id_of(message), agent="scorer", draft=EventDraft(
            type="LeadScored", payload={"score": score},
            outbox=(OutboxDraft(topic=TEST_TOPIC, payload={"score": score}, key=message.key),)))
    relay.outbox_relay_until_idle(publish=lambda m, body: None, budget_seconds=5)  # the endpoint is back
    assert OutboxMessage.objects.filter(key=message.key, status="pending").count() == 2
    page = html(olivia_client.get(f"/dead-letters/{outbox.pk}/"))
    assert 'id="waiting-behind"><strong>2</strong> later messages' in page
    assert "2 waiting behind" in html(olivia_client.get("/dead-letters/"))


# --- many at once: a draft job ------------------------------------------------------------------------


def draft_job(client: Client, **data: Any) -> BulkJob:
    """The queue's bulk bar: a draft job, and its page (where the dry run is shown) next."""
    response = client.post("/dead-letters/bulk/", data)
    assert response.status_code == 302, html(response)
    job = BulkJob.objects.latest("pk")
    assert response["Location"] == f"/jobs/{job.pk}/"
    return job


def run_to_the_end(job: BulkJob) -> BulkJob:
    """What the worker does: chunks until nothing is pending (the Celery task loops the same step)."""
    while bulk.bulk_job_step(job.pk):
        pass
    job.refresh_from_db()
    return job


def job_rows() -> tuple[int, int, int]:
    return BulkJob.objects.count(), BulkJobItem.objects.count(), BulkJobDecision.objects.count()


def test_a_bulk_requeue_of_50_with_one_decided_meanwhile_ends_49_done_and_1_skipped(rita_client: Client) -> None:
    items = dead_lettered_tasks(50)
    job = draft_job(rita_client, action="dead_letter_requeue", reason="pool restored", all_matching="on",
                    query="status=pending&source=task")
    assert (job.status, job.total, job.created_by, job.reason) == ("draft", 50, "user:rita", "pool restored")
    assert job.selection == {"filter": {"source": "task"}}
    page = html(rita_client.get(f"/jobs/{job.pk}/"))
    assert "dry run: nothing has been done yet" in page and "<strong>50</strong> requeue" in page
    assert all(f">{item.pk}</a>" in page for item in items)
    assert all(d.status == "pending" for d in DeadLetter.objects.all())  # a dry run decides nothing
    # Between the dry run and the start, someone else discards one.
    dead_letters.dead_letter_discard(dead_letter_id=items[17].pk, decided_by="user:sam", reason="duplicate lead")

    started = rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash})
    assert started.status_code == 302
    job = run_to_the_end(job)
    assert (job.status, job.done, job.skipped, job.failed) == ("finished", 49, 1, 0)
    skipped = job.items.get(status="skipped")
    assert skipped.target == str(items[17].pk) and "already discarded" in skipped.detail
    assert "already discarded" in html(rita_client.get(f"/jobs/{job.pk}/"))
    assert DeadLetter.objects.filter(status="requeued", decided_by="user:rita").count() == 49
    assert Task.objects.filter(status="pending").count() == 49
    assert Event.objects.filter(type="DeadLetterRequeued").count() == 49
    assert Event.objects.filter(type="DeadLetterDiscarded", agent="user:sam").count() == 1


def test_a_dry_run_of_checked_rows_shows_what_will_be_skipped(rita_client: Client) -> None:
    first, second, third = dead_lettered_tasks(3)
    dead_letters.dead_letter_requeue(dead_letter_id=second.pk, decided_by="user:sam", reason="done by hand")
    job = draft_job(rita_client, action="dead_letter_discard", reason="stale", ids=[third.pk, first.pk, second.pk])
    assert job.selection == {"ids": [third.pk, first.pk, second.pk]}
    assert list(job.items.order_by("index").values_list("target", "planned")) == [
        (str(third.pk), "discard"), (str(first.pk), "discard"), (str(second.pk), "skip: already requeued")]
    page = html(rita_client.get(f"/jobs/{job.pk}/"))
    assert "<strong>2</strong> discard" in page and "<strong>1</strong> will be skipped: already requeued" in page
    assert DeadLetter.objects.filter(status="discarded").count() == 0


def test_bad_bulk_input_is_refused_and_plans_nothing(rita_client: Client, settings: Any) -> None:
    (item,) = dead_lettered_tasks(1)
    before = job_rows()
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"action": "dead_letter_discard", "reason": "x"}, "Select some dead letters"),
        ({"action": "dead_letter_requeue", "ids": [item.pk]}, "Write a reason"),
        ({"action": "requeue_everything", "reason": "x", "ids": [item.pk]}, "Select a valid choice"),
        ({"action": "dead_letter_requeue", "reason": "x", "ids": ["seven"]}, "named by their numbers"),
        ({"action": "dead_letter_requeue", "reason": "x", "all_matching": "on", "query": "older_than=-1"},
         "filter is not valid"),
        ({"action": "dead_letter_requeue", "reason": "x", "all_matching": "on", "query": "status=requeued"},
         "no pending dead letters"),
        ({"action": "dead_letter_requeue", "reason": "x", "all_matching": "on", "query": "topic=no-such-topic"},
         "the selection matches nothing"),
    ]
    for data, says in refusals:
        response = rita_client.post("/dead-letters/bulk/", {**data, "query": data.get("query", "")})
        assert response.status_code == 400, data
        assert "Nothing was decided" in html(response) and says in html(response), (data, html(response))
    as_json = rita_client.post("/dead-letters/bulk/", {"action": "dead_letter_requeue", "ids": [item.pk]},
                               HTTP_ACCEPT="application/json")
    assert as_json.status_code == 400 and as_json.json()["error"]["code"] == "validation_error"
    settings.BACKPLANE_BULK_MAX_ITEMS = 2
    dead_lettered_tasks(2)
    over = rita_client.post("/dead-letters/bulk/", {"action": "dead_letter_requeue", "reason": "x",
                                                    "all_matching": "on", "query": ""})
    assert over.status_code == 400 and "more than 2 items; narrow the filter" in html(over)
    assert job_rows() == before
    assert set(DeadLetter.objects.values_list("status", flat=True)) == {"pending"}


def test_a_job_runs_only_the_list_its_dry_run_showed_and_is_started_once(rita_client: Client) -> None:
    first, second = dead_lettered_tasks(2)
    job = draft_job(rita_client, action="dead_letter_requeue", reason="r", all_matching="on", query="source=task")
    # A dead letter that arrives after the dry run matches the filter but is not in the job.
    (later,) = dead_lettered_tasks(1)
    stale = rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": "0" * 64})
    assert stale.status_code == 409 and BulkJob.objects.get(pk=job.pk).status == "draft"
    assert rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash}).status_code == 302
    twice = rita_client.post(f"/jobs/{job.pk}/start/", {"selection_hash": job.selection_hash})
    assert twice.status_code == 409 and "a running job cannot be started" in html(twice)
    job = run_to_the_end(job)
    assert sorted(job.items.values_list("target", flat=True)) == sorted([str(first.pk), str(second.pk)])
    assert (job.done, job.skipped, job.failed) == (2, 0, 0)
    assert DeadLetter.objects.get(pk=later.pk).status == "pending"
    assert list(job.decisions.order_by("at", "pk").values_list("action", flat=True)) == ["create", "start", "finish"]


# --- queries -------------------------------------------------------------------------------------------

# The session and the user are two of them; a reviewer's permissions (their own and their groups') two more,
# and their staff scope (a page over every namespace refuses a scoped user) one more.
# The dry run (a draft job) writes the job, its items in one INSERT … SELECT, their hash, the
# counts and the "create" decision, in a savepoint and a transaction: the same for any size.
BOUNDS = {"queue": 7, "queue-filtered": 7, "queue-rows": 7, "task-letter": 7, "outbox-letter": 7, "dry-run": 12}


def queries_per_page(client: Client, task_letter: DeadLetter, outbox_letter: DeadLetter) -> dict[str, int]:
    counted = {}
    requests: dict[str, Callable[[], Any]] = {
        "queue": lambda: client.get("/dead-letters/"),
        "queue-filtered": lambda: client.get("/dead-letters/?status=pending&error=refused&older_than=1"),
        "queue-rows": lambda: client.get("/dead-letters/?partial=rows"),
        "task-letter": lambda: client.get(f"/dead-letters/{task_letter.pk}/"),
        "outbox-letter": lambda: client.get(f"/dead-letters/{outbox_letter.pk}/"),
        "dry-run": lambda: client.post("/dead-letters/bulk/", {"action": "dead_letter_requeue", "reason": "r",
                                                               "all_matching": "on", "query": "source=outbox"}),
    }
    for name, request in requests.items():
        with CaptureQueriesContext(connection) as captured:
            assert request().status_code == (302 if name == "dry-run" else 200), name
        counted[name] = len(captured.captured_queries)
    return counted


def grow(tasks: list[Task], count: int) -> None:
    """Many dead letters at once (the relay's and the detector's rows, written directly)."""
    now = timezone.now()
    DeadLetter.objects.bulk_create(
        DeadLetter(source="outbox" if n % 2 else "task", reference=f"r{n}", task=tasks[n % len(tasks)],
                   topic=TEST_TOPIC, payload={"n": n}, error="broker: Connection refused", attempts=5,
                   created_at=now - timedelta(seconds=n), status="pending" if n % 4 else "requeued")
        for n in range(count)
    )


@pytest.mark.slow
def test_no_dead_letter_page_runs_more_queries_for_more_rows(rita_client: Client, dead_outbox_messages: Any,
                                                             make_task: Any) -> None:
    (task_letter,) = dead_lettered_tasks(1)
    (outbox_letter,) = dead_outbox_messages()
    tasks = [make_task() for _ in range(5)]
    grow(tasks, 10)
    small = queries_per_page(rita_client, task_letter, outbox_letter)
    grow(tasks, 990)
    large = queries_per_page(rita_client, task_letter, outbox_letter)
    # The queue reads its decided part only when the pending part does not fill the page.
    for name, bound in BOUNDS.items():
        assert large[name] <= small[name] <= bound, (name, small[name], large[name])
