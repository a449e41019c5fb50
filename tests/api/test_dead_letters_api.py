"""/api/v1/dead-letters/: reviewers only; requeue and discard are decided once and recorded."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from backplane.delivery import outbox
from backplane.delivery.models import DeadLetter, OutboxMessage
from backplane.eventlog import services
from backplane.eventlog.models import Event
from tests.api.conftest import assert_error, create_task


@pytest.fixture
def reviewer(db) -> APIClient:  # type: ignore[no-untyped-def]
    user = User.objects.create_user("rita", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="review_deadletter"))
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def dead_letter(alice) -> DeadLetter:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    message = OutboxMessage.objects.get(task_id=task["task_id"])
    OutboxMessage.objects.filter(pk=message.pk).update(status="dead", attempts=5)
    return DeadLetter.objects.create(source="outbox", reference=str(message.message_id), task_id=task["task_id"],
                                     outbox_message=message, topic=message.topic, payload=message.payload,
                                     error="broker: ConnectionRefusedError", attempts=5, created_at=timezone.now())


def test_agents_and_plain_staff_get_403(alice, dead_letter, db) -> None:  # type: ignore[no-untyped-def]
    assert_error(alice.get("/api/v1/dead-letters/"), 403, "permission_denied")
    assert_error(alice.post(f"/api/v1/dead-letters/{dead_letter.pk}/discard/", {"reason": "x"}, format="json"),
                 403, "permission_denied")
    staff = APIClient()
    staff.force_login(User.objects.create_user("sam", password="pw", is_staff=True))
    assert_error(staff.get("/api/v1/dead-letters/"), 403, "permission_denied")
    assert DeadLetter.objects.get().status == "pending"


def test_a_reviewer_lists_and_filters(reviewer, dead_letter) -> None:  # type: ignore[no-untyped-def]
    body = reviewer.get("/api/v1/dead-letters/", {"status": "pending"}).json()
    (item,) = body["results"]
    assert item["id"] == dead_letter.pk and item["source"] == "outbox" and item["status"] == "pending"
    assert set(item) == {"id", "source", "task_id", "topic", "payload", "error", "attempts", "status", "created_at",
                         "decided_by", "decided_at", "reason", "waiting_behind"}
    assert item["waiting_behind"] == 0  # made directly, holding no key
    assert reviewer.get("/api/v1/dead-letters/", {"status": "discarded"}).json()["results"] == []
    assert_error(reviewer.get("/api/v1/dead-letters/", {"status": "bogus"}), 400, "validation_error")


def test_a_dead_letter_holding_its_key_says_how_many_messages_wait_behind_it(reviewer, dead_letter) -> None:  # type: ignore[no-untyped-def]
    message = OutboxMessage.objects.get(pk=dead_letter.outbox_message_id)
    OutboxMessage.objects.filter(pk=message.pk).update(holds_key=True)  # strict: it holds its key
    with transaction.atomic():
        for n in range(3):
            outbox.outbox_enqueue(topic=message.topic, key=message.key, payload={"n": n}, headers={},
                                  now=timezone.now())
    (item,) = reviewer.get("/api/v1/dead-letters/", {"status": "pending"}).json()["results"]
    assert item["waiting_behind"] == 3
    decided = reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/requeue/", {"reason": "back"}, format="json")
    assert decided.status_code == 200 and decided.json()["waiting_behind"] == 0
    schema = reviewer.get("/api/schema/", {"format": "json"}).json()
    assert "waiting_behind" in schema["components"]["schemas"]["DeadLetterOut"]["required"]


def test_requeue_with_an_edited_payload_goes_back_to_the_outbox(reviewer, dead_letter) -> None:  # type: ignore[no-untyped-def]
    response = reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/requeue/",
                             {"reason": "broker fixed", "payload": {"edited": True}}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["decided_by"], body["reason"]) == ("requeued", "user:rita", "broker fixed")
    message = OutboxMessage.objects.get(pk=dead_letter.outbox_message_id)
    assert (message.status, message.attempts, message.payload) == ("pending", 0, {"edited": True})
    event = Event.objects.get(task_id=dead_letter.task_id, type="DeadLetterRequeued")
    assert event.payload["reason"] == "broker fixed" and event.agent == "user:rita"
    again = reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/discard/", {"reason": "oops"}, format="json")
    assert_error(again, 409, "already_decided")


def test_discard_needs_a_reason_and_is_recorded(reviewer, dead_letter) -> None:  # type: ignore[no-untyped-def]
    assert_error(reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/discard/", {}, format="json"),
                 400, "validation_error")
    assert_error(reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/discard/", {"reason": ""}, format="json"),
                 400, "validation_error")
    response = reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/discard/", {"reason": "obsolete"},
                             format="json")
    assert response.status_code == 200 and response.json()["status"] == "discarded"
    assert Event.objects.filter(task_id=dead_letter.task_id, type="DeadLetterDiscarded").count() == 1
    assert_error(reviewer.post(f"/api/v1/dead-letters/{dead_letter.pk}/requeue/", {"reason": "x"}, format="json"),
                 409, "already_decided")
    assert_error(reviewer.post("/api/v1/dead-letters/999999/discard/", {"reason": "x"}, format="json"),
                 404, "not_found")


def test_a_token_bound_to_a_reviewer_may_review(db, dead_letter) -> None:  # type: ignore[no-untyped-def]
    from backplane.eventlog.models import Agent

    user = User.objects.create_user("bot-owner", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="review_deadletter"))
    created = services.agent_create(name="review-bot", namespace="ops")
    Agent.objects.filter(pk=created.agent.pk).update(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
    assert client.get("/api/v1/dead-letters/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_deciding_at_once_decide_once(committed_db) -> None:  # type: ignore[no-untyped-def]
    import threading

    from django.db import connection

    from backplane.eventlog.errors import AlreadyDecided
    from recovery import dead_letters

    task = services.task_create(namespace="acme", kind="k", input={}, agent="a").task
    message = OutboxMessage.objects.get(task=task)
    OutboxMessage.objects.filter(pk=message.pk).update(status="dead")
    item = DeadLetter.objects.create(source="outbox", reference="r", task=task, outbox_message=message,
                                     created_at=timezone.now())
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def decide(n: int) -> None:
        try:
            barrier.wait()
            if n % 2:
                dead_letters.dead_letter_discard(dead_letter_id=item.pk, decided_by=f"user:{n}", reason="r")
            else:
                dead_letters.dead_letter_requeue(dead_letter_id=item.pk, decided_by=f"user:{n}", reason="r")
            outcomes.append("decided")
        except AlreadyDecided:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["decided"] + ["refused"] * 5
    assert Event.objects.filter(task=task, type__in=["DeadLetterRequeued", "DeadLetterDiscarded"]).count() == 1
