"""Personal values on the HTTP front (api/agent_front.py): sealed on the event loop's connection
exactly as Django's stack seals them, so a write made on one stack is replayed by the other, and
the refusals answer alike and change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.models import Event
from backplane.privacy.models import DataSubject
from backplane.privacy.services import subject_erase
from tests.api.conftest import row_counts
from tests.api.test_agent_front import AsyncReads, both_write, reads, stored_event  # noqa: F401 - the fixture

pytestmark = pytest.mark.usefixtures("committed_db")

EMAIL = "grace.hopper@example.com"


def marked(key: str, value: Any = EMAIL) -> bytes:
    payload = {"email": {"$personal": {"subject": "lead:7", "value": value}}, "score": 91}
    return json.dumps({"type": "LeadQualified", "idempotency_key": key, "payload": payload}).encode()


def test_a_marked_append_on_the_loop_is_sealed_as_django_seals_it(reads: AsyncReads) -> None:  # noqa: F811
    token = services.agent_create(name="writer", namespace="acme").token
    task = services.task_create(namespace="acme", kind="lead", agent="writer", input={}).task
    path = f"/api/v1/tasks/{task.pk}/events/"
    sent = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    written = reads.request("POST", path, sent, base_url="http://testserver", content=marked("front-1"))
    assert written.status_code == 201, written.text
    assert written.json() == stored_event(str(task.pk), 2) and EMAIL not in written.text
    # Written by the front, replayed by both; and the same request written by Django's stack
    # seals to the same envelope (the subject's key, made once, by whichever came first).
    assert both_write(reads, "POST", path, token=token, body=marked("front-1")).json() == written.json()
    by_django = Client().post(path, marked("django-1"), content_type="application/json",
                              headers={"Authorization": sent["Authorization"]})
    assert by_django.status_code == 201
    assert by_django.json()["payload"] == written.json()["payload"]
    assert DataSubject.objects.filter(namespace="acme", subject="lead:7").count() == 1

    subject_erase(namespace="acme", subject="lead:7", reason="asked", erased_by="user:priya")
    before = row_counts()
    refused = both_write(reads, "POST", path, token=token, body=marked("front-2", "new@example.com"))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "subject_erased"
    malformed = json.dumps({"type": "LeadQualified", "payload": {"email": {"$personal": {"value": 1}}}}).encode()
    assert both_write(reads, "POST", path, token=token, body=malformed).status_code == 400
    assert row_counts() == before and Event.objects.filter(task=task).count() == 3
