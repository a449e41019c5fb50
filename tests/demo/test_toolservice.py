"""The demo's tools behave like real idempotent APIs, and its agents are Django-free.

The tool service is the demo's ground truth for "no side effect twice", so it is tested on its
own: one ledger row per key however many calls and however concurrent, a replay answers the
stored response, failures that happen before acting write nothing, and the relay's signed
compensation webhook is checked before anything runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from backplane.eventlog.models import Task
from backplane_client.signing import sign
from demo.fleet import demo_prune_own_records
from demo.models import LedgerEntry, Observation
from demo.toolservice import BOUNCING_DOMAIN, Faults, ToolWorld, make_server
from tests.backplane.runtime.product import ROOT

SECRET = "demo-test-secret"


class Recorded:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __call__(self, key: str, status: str, result: dict[str, Any]) -> None:
        self.calls.append((key, status, result))


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
def tools(committed_db: None, recorded: Recorded) -> Iterator[str]:
    world = ToolWorld(Faults(transient_rate=0.0, decline_rate=0.0, revert_failure_rate=0.0, latency_ms=(30, 30)),
                      record_compensation=recorded)
    server = make_server(world, webhook_secret_of=lambda: SECRET)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def post(url: str, body: dict[str, Any], key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return httpx.post(url, json=body, headers=headers, timeout=10)


def test_it_acts_once_per_key_even_when_the_same_key_arrives_at_once(tools: str) -> None:
    task_id = str(uuid.uuid4())
    body = {"to": "a@example.com", "template": "welcome", "task_id": task_id, "lead_id": "L-7"}
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: answers.append(post(f"{tools}/tools/email-send", body, "k-1")))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["message_id"] for a in answers}) == 1
    entry = LedgerEntry.objects.get()
    assert (entry.tool, entry.idempotency_key, entry.replays) == ("email-send", "k-1", 7)
    assert sum(1 for a in answers if a.json().get("replayed")) == 7


def test_it_refuses_a_call_without_an_idempotency_key(tools: str) -> None:
    assert post(f"{tools}/tools/crm-write", {"lead_id": "L-1"}, None).status_code == 400
    assert not LedgerEntry.objects.exists()


def test_a_mail_domain_that_bounces_fails_before_acting(tools: str) -> None:
    answer = post(f"{tools}/tools/email-send", {"to": f"x@{BOUNCING_DOMAIN}"}, "k-2")
    assert answer.status_code == 503
    assert not LedgerEntry.objects.exists()


def test_transient_failures_write_nothing_and_the_retry_with_the_same_key_acts(committed_db: None) -> None:
    world = ToolWorld(Faults(transient_rate=1.0, latency_ms=(0, 0)), record_compensation=Recorded())
    first = world.call("web-enrich", "k-3", {"company": "Initech"})
    assert first.status == 503 and not LedgerEntry.objects.exists()
    second = world.call("web-enrich", "k-3", {"company": "Initech"})
    assert second.status == 200 and LedgerEntry.objects.count() == 1


def test_a_revert_refused_once_is_not_recorded_so_a_requeue_succeeds(committed_db: None) -> None:
    world = ToolWorld(Faults(revert_failure_rate=1.0, latency_ms=(0, 0)), record_compensation=Recorded())
    refused = world.call("crm-revert", "c-9", {"lead_id": "L-3"})
    assert refused.status == 409 and not LedgerEntry.objects.exists()
    assert world.call("crm-revert", "c-9", {"lead_id": "L-3"}).status == 200
    assert LedgerEntry.objects.get().subject == "crm-revert:L-3"


def test_a_compensation_of_another_fleet_is_left_alone(committed_db: None) -> None:
    recorded = Recorded()
    world = ToolWorld(Faults(latency_ms=(0, 0)), record_compensation=recorded, owns_compensation=lambda key: False)
    answer = world.compensate({"payload": {"task_id": str(uuid.uuid4()), "compensation_key": "c-2",
                                           "tool": "email-recall", "input": {"lead_id": "L-1"}}})
    assert answer.status == 200 and not recorded.calls and not LedgerEntry.objects.exists()


def test_a_declined_card_is_a_recorded_answer_replayed_as_such(committed_db: None) -> None:
    world = ToolWorld(Faults(decline_rate=1.0, transient_rate=0.0, latency_ms=(0, 0)), record_compensation=Recorded())
    first = world.call("payments-charge", "k-4", {"lead_id": "L-9", "amount_cents": 4900})
    again = world.call("payments-charge", "k-4", {"lead_id": "L-9", "amount_cents": 4900})
    assert (first.status, first.body["error"]) == (402, "card_declined")
    assert (again.status, again.body["replayed"]) == (402, True)
    assert LedgerEntry.objects.get().replays == 1


def test_a_compensation_webhook_must_be_signed_and_runs_once(tools: str, recorded: Recorded) -> None:
    task_id = str(uuid.uuid4())
    message = {"message_id": str(uuid.uuid4()), "topic": "backplane.compensations.payments-refund",
               "payload": {"task_id": task_id, "compensation_key": "c-1", "tool": "payments-refund", "step": 7,
                           "input": {"lead_id": "L-5"}}}
    raw = json.dumps(message).encode()
    forged = httpx.post(f"{tools}/compensations", content=raw, timeout=10,
                        headers={"Backplane-Signature": sign("wrong", raw), "Content-Type": "application/json"})
    assert forged.status_code == 401 and not recorded.calls and not LedgerEntry.objects.exists()
    for _ in range(2):  # at least once: the relay may deliver it again
        answer = httpx.post(f"{tools}/compensations", content=raw, timeout=10,
                            headers={"Backplane-Signature": sign(SECRET, raw), "Content-Type": "application/json"})
        assert answer.status_code == 200
    assert [c[:2] for c in recorded.calls] == [("c-1", "succeeded"), ("c-1", "succeeded")]
    # The subject is the business identity, worked out by the tool: one refund per lead.
    assert LedgerEntry.objects.get().subject == "payments-refund:L-5"


def test_it_records_what_agents_report(tools: str) -> None:
    task_id = str(uuid.uuid4())
    answer = httpx.post(f"{tools}/observations", timeout=10, json={
        "kind": "crash", "task_id": task_id, "agent": "demo-orchestrator-1", "zone": 2, "step": 6,
        "tool": "email-send", "lease_epoch": 1})
    assert answer.status_code == 201
    assert Observation.objects.get().zone == 2


def test_the_agent_process_imports_no_django() -> None:
    code = ("import sys, demo.agent; leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'django', 'backplane', 'recovery', 'dashboard'}); print(leaked)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_demo_forgets_the_effects_of_pruned_tasks_only_once_they_are_old(
        committed_db: None, make_task: Callable[..., Task]) -> None:
    live = make_task()
    old = timezone.now() - timedelta(hours=2)
    for task_id, at in ((live.pk, old), (uuid.uuid4(), old), (uuid.uuid4(), timezone.now())):
        LedgerEntry.objects.create(tool="crm-write", idempotency_key=str(uuid.uuid4()), subject="s", task_id=task_id,
                                   status_code=200, created_at=at)
    assert demo_prune_own_records(older_than=timedelta(hours=1)) == 1
    assert LedgerEntry.objects.count() == 2 and LedgerEntry.objects.filter(task_id=live.pk).exists()
