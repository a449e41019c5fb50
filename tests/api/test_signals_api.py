"""Signals over the API: the lease holder waits, an operator or an agent of the namespace sends,
the agent's read waits on the HTTP front; every refusal is the contract's error."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from api.bodies import SignalOut, SignalWaitOut
from api.signals import CALLBACK_SENDS_PER_MINUTE
from backplane.eventlog import services
from recovery import leases, signals
from tests.api.conftest import AgentClient, assert_error, claim, create_task
from tests.api.test_agent_front import AsyncReads, both
from tests.api.test_bodies import conforms
from tests.support.roles import staff_user


def session(name: str, *roles: str) -> APIClient:
    client = APIClient()
    client.force_login(staff_user(name, *roles))
    return client


@pytest.mark.django_db
def test_a_task_waits_and_an_operator_sends(alice: AgentClient, mallory: AgentClient) -> None:
    task = create_task(alice)
    epoch = claim(alice, task_id=task["task_id"])["lease_epoch"]
    signal = f"/api/v1/tasks/{task['task_id']}/signals/invoice-paid/"
    assert_error(alice.get(signal), 404, "not_found")
    waiting = alice.post(f"{signal}wait/", {"timeout_seconds": 3600, "lease_epoch": epoch}, format="json")
    assert waiting.status_code == 201 and conforms(waiting, SignalWaitOut)["status"] == "waiting"
    assert alice.post(f"{signal}wait/", {"timeout_seconds": 3600, "lease_epoch": epoch},
                      format="json").status_code == 200
    assert_error(mallory.post(signal, {"payload": {}}, format="json"), 404, "not_found")
    assert_error(session("vera", "Viewers").post(signal, {"payload": {}}, format="json"), 403, "permission_denied")

    sent = session("olivia", "Operators").post(signal, {"payload": {"paid_at": "2026-12-06"}}, format="json")
    assert sent.status_code == 201 and conforms(sent, SignalOut)["sent_by"] == "user:olivia"
    read = alice.get(signal).json()
    assert (read["status"], read["payload"]) == ("received", {"paid_at": "2026-12-06"})
    assert_error(alice.post(signal, {"payload": {"paid_at": "later"}}, format="json"), 409, "already_decided")


@pytest.mark.django_db
def test_bad_bodies_and_names_are_400(alice: AgentClient) -> None:
    task = create_task(alice)
    epoch = claim(alice, task_id=task["task_id"])["lease_epoch"]
    base = f"/api/v1/tasks/{task['task_id']}/signals/"
    assert_error(alice.post(f"{base}x/wait/", {"timeout_seconds": 0, "lease_epoch": epoch}, format="json"),
                 400, "validation_error")
    assert_error(alice.post(f"{base}x/wait/", {"lease_epoch": epoch}, format="json"), 400, "validation_error")
    assert_error(alice.post(f"{base}x/", {"payload": []}, format="json"), 400, "validation_error")
    assert_error(alice.post(f"{base}-x/", {"payload": {}}, format="json"), 400, "validation_error")
    assert_error(alice.get(f"{base}x/?wait=31"), 400, "validation_error")


@pytest.fixture
def reads() -> Iterator[AsyncReads]:
    served = AsyncReads()
    try:
        yield served
    finally:
        served.close()


@pytest.mark.usefixtures("committed_db")
def test_an_agent_waiting_on_the_front_hears_of_the_signal_at_once(reads: AsyncReads) -> None:
    created = services.agent_create(name="waiter", namespace="acme")
    services.task_create(namespace="acme", kind="k", input={}, agent="planner")
    lease = leases.lease_claim(agent=created.agent, kinds=None, lease_seconds=30)
    assert lease is not None
    path = f"/api/v1/tasks/{lease.task.pk}/signals/go/"
    headers = {"Authorization": f"Bearer {created.token}", "Host": "testserver"}
    began = reads.request("POST", f"{path}wait/", {**headers, "Content-Type": "application/json"},
                          base_url="https://testserver", content=b'{"timeout_seconds": 600, "lease_epoch": %d}'
                          % lease.lease_epoch)
    assert began.status_code == 201 and began.json()["callback_url"].startswith(
        "https://testserver/api/v1/signal-callbacks/")
    started = time.monotonic()
    assert reads.request("GET", f"{path}?wait=1", headers, base_url="http://testserver").json()["status"] == "waiting"
    assert 1.0 <= time.monotonic() - started < 3.0
    both(reads, "GET", f"{path}?wait=31", token=created.token)

    def send_soon() -> None:
        time.sleep(0.5)
        try:
            signals.signal_send(namespace="acme", task_id=lease.task.pk, name="go", payload={"ok": True},
                                sent_by="user:ops")
        finally:
            connection.close()

    sender = threading.Thread(target=send_soon)
    started = time.monotonic()
    sender.start()
    answer: dict[str, Any] = reads.request("GET", f"{path}?wait=20", headers, base_url="http://testserver").json()
    sender.join()
    assert answer["status"] == "received" and time.monotonic() - started < 3.0


@pytest.mark.django_db
def test_an_agent_limited_to_kinds_signals_only_tasks_of_them(alice: AgentClient, make_agent: Any) -> None:
    from backplane.eventlog.models import Event
    from recovery.models import TaskSignal

    task = create_task(alice, kind="lead-qualification")
    narrow = make_agent("narrow", "acme", kinds=("outreach",))
    before = Event.objects.count()
    error = assert_error(narrow.post(f"/api/v1/tasks/{task['task_id']}/signals/go/", {"payload": {}},
                                     format="json"), 403, "permission_denied")
    assert error["details"] == {"kind": "lead-qualification"}
    assert Event.objects.count() == before and not TaskSignal.objects.exists()
    assert alice.post(f"/api/v1/tasks/{task['task_id']}/signals/go/", {"payload": {}},
                      format="json").status_code == 201


@pytest.mark.django_db
def test_a_callback_url_sends_its_one_signal_and_nothing_else(alice: AgentClient) -> None:
    task = create_task(alice)
    epoch = claim(alice, task_id=task["task_id"])["lease_epoch"]
    base = f"/api/v1/tasks/{task['task_id']}/signals/"
    waiting = alice.post(f"{base}render-done/wait/", {"timeout_seconds": 3600, "lease_epoch": epoch},
                         format="json").json()
    other = alice.post(f"{base}other/wait/", {"timeout_seconds": 3600, "lease_epoch": epoch}, format="json").json()
    callback = waiting["callback_url"]
    assert callback.startswith("http://testserver/api/v1/signal-callbacks/") and callback != other["callback_url"]
    path = callback.removeprefix("http://testserver")
    events = services_events(task["task_id"])

    anybody = APIClient()  # no credentials at all: the token is the credential
    # Refusals first, each changing nothing: a forged or altered token, a bad body.
    token = path.split("/")[-2]
    forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    assert_error(anybody.post(f"/api/v1/signal-callbacks/{forged}/", {"payload": {}}, format="json"),
                 404, "not_found")
    assert_error(anybody.post("/api/v1/signal-callbacks/x/", {"payload": {}}, format="json"), 404, "not_found")
    assert_error(anybody.post(path, {"payload": []}, format="json"), 400, "validation_error")
    assert_error(anybody.post(path, b"{", content_type="application/json"), 400, "validation_error")
    assert services_events(task["task_id"]) == events

    sent = anybody.post(path, {"payload": {"frames": 240}}, format="json")
    assert sent.status_code == 201 and conforms(sent, SignalOut)["sent_by"] == "callback:alice"
    assert anybody.post(path, {"payload": {"frames": 240}}, format="json").status_code == 200
    assert_error(anybody.post(path, {"payload": {"frames": 1}}, format="json"), 409, "already_decided")
    assert alice.get(f"{base}other/").json()["status"] == "waiting"  # the other signal: untouched
    assert services_events(task["task_id"]) == [*events, "SignalReceived"]

    # A token works for its own signal only, and is counted per signal: 10 sends a minute.
    other_path = other["callback_url"].removeprefix("http://testserver")
    if 60 - time.time() % 60 < 5:  # the count is per minute: keep the eleven sends inside one
        time.sleep(60 - time.time() % 60 + 0.1)
    assert anybody.post(other_path, {"payload": {}}, format="json").status_code == 201
    for _ in range(CALLBACK_SENDS_PER_MINUTE - 1):
        assert anybody.post(other_path, {"payload": {}}, format="json").status_code == 200
    limited = anybody.post(other_path, {"payload": {}}, format="json")
    assert_error(limited, 429, "rate_limited")
    assert 0 < int(limited.headers["Retry-After"]) <= 60
    # The first signal's own count is its own (3 sends so far).
    assert anybody.post(path, {"payload": {"frames": 240}}, format="json").status_code == 200


def services_events(task_id: str) -> list[str]:
    from backplane.eventlog.models import Event

    return list(Event.objects.filter(task_id=task_id).order_by("seq").values_list("type", flat=True))
