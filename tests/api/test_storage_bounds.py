"""Storage amplification (issue 39): an accepted request stores at most a small constant times its size.

Each test sends, on one write route, the largest request it accepts shaped to make the server store
the most (many small rows, copies of a large field), and measures what the database gained: the
octets of the text form of every row of every table (``octet_length(t::text)``: the logical size,
before TOAST compresses anything), after minus before. The ratio to the request's body must stay
under ``MAX_RATIO``, whatever route. The ratios measured are written to
``var/storage_bounds.json``.

A fork is the one request that stores more than it sends: its ``TaskStarted`` carries the source's
input (and the fork's row a copy), never the source's events (backplane/eventlog/forks.py). What it
stores is bounded by the source's input, itself at most one body; so its ratio is measured against
the request plus the source input it copies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from backplane.eventlog.event_types import prompt_sha256
from backplane.eventlog.models import ModelPrice
from tests.api.conftest import AgentClient, claim, create_task

# Row overhead: an event row carries two hashes, times, ids and its JSON; a batch of 1,000 empty
# events is the worst case of many small rows (about 28 bytes of request each).
MAX_RATIO = 24
RATIOS: dict[str, float] = {}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def write_the_ratios() -> Iterator[None]:
    yield
    if RATIOS:
        out = ROOT / "var" / "storage_bounds.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        worst = max(RATIOS, key=RATIOS.__getitem__)
        out.write_text(json.dumps({"max_ratio": MAX_RATIO, "worst": worst, "ratios": RATIOS}, indent=1) + "\n")


def stored_bytes() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        tables = [name for (name,) in cursor.fetchall()]
        total = 0
        for table in tables:
            cursor.execute(f'SELECT coalesce(sum(octet_length(t::text)), 0) FROM "{table}" t')
            total += cursor.fetchone()[0]
    return total


def body_room(fixed: dict[str, Any], *, share: float = 1.0) -> int:
    """How many characters a padding string may have so that ``fixed`` plus it stays under the body limit."""
    return int((settings.BACKPLANE_PAYLOAD_LIMIT_BYTES - len(json.dumps(fixed)) - 512) * share)


def measured(name: str, client: APIClient, path: str, body: dict[str, Any], *, status: int = 201,
             copied: int = 0) -> float:
    """Send ``body``, assert ``status``, record and return the stored bytes per request byte."""
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert len(raw) <= settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
    before = stored_bytes()
    response = client.post(path, raw, content_type="application/json")
    assert response.status_code == status, response.content[:500]
    ratio = (stored_bytes() - before) / (len(raw) + copied)
    RATIOS[name] = round(ratio, 2)
    assert ratio < MAX_RATIO, f"{name}: {ratio:.1f}x"
    return ratio


@pytest.fixture
def leased(alice: AgentClient) -> dict[str, Any]:
    task = create_task(alice, kind="k", input={})
    return {"task": task["task_id"], "epoch": claim(alice)["lease_epoch"]}


@pytest.fixture
def staff(db: None) -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_a_task_create_stores_its_input_a_bounded_number_of_times(alice: AgentClient) -> None:
    body = {"kind": "k" * 100, "input": {}, "metadata": {}}
    room = body_room(body)
    body["input"] = {"x": "y" * (room // 2)}
    body["metadata"] = {"m": "z" * (room // 2)}
    measured("tasks_create", alice, "/api/v1/tasks/", body)


def test_an_append_with_a_large_payload(alice: AgentClient, leased: dict[str, Any]) -> None:
    body: dict[str, Any] = {"type": "Noted", "payload": {}, "lease_epoch": leased["epoch"]}
    body["payload"] = {"x": "y" * body_room(body)}
    measured("events_append_large", alice, f"/api/v1/tasks/{leased['task']}/events/", body)


def test_an_append_with_1000_small_outbox_messages(alice: AgentClient, leased: dict[str, Any]) -> None:
    body = {"type": "Noted", "payload": {}, "lease_epoch": leased["epoch"],
            "outbox": [{"topic": "t", "payload": {}} for _ in range(1000)]}
    measured("events_append_outbox", alice, f"/api/v1/tasks/{leased['task']}/events/", body)


def test_a_batch_of_1000_empty_events(alice: AgentClient, leased: dict[str, Any]) -> None:
    body = {"lease_epoch": leased["epoch"], "events": [{"type": "Abc", "payload": {}} for _ in range(1000)]}
    measured("events_batch_small", alice, f"/api/v1/tasks/{leased['task']}/events/batch/", body)


def test_a_priced_model_call_stores_its_cost_beside_it(alice: AgentClient, leased: dict[str, Any]) -> None:
    now = timezone.now()
    for token_type in ("input", "output", "cache_read", "cache_write", "reasoning"):
        ModelPrice.objects.create(provider="p" * 100, model="m" * 200, token_type=token_type,
                                  per_million=Decimal("123456789012.123456"), currency="USD",
                                  valid_from=now - timedelta(days=1), version="v" * 100)
    usage = {"input_tokens": 10**6, "output_tokens": 10**6, "cache_read_input_tokens": 1,
             "cache_creation_input_tokens": 1, "reasoning_output_tokens": 1}
    body = {"type": "LLMCalled", "lease_epoch": leased["epoch"],
            "payload": {"provider": "p" * 100, "model": "m" * 200, "prompt_sha256": prompt_sha256("p"),
                        "output": {}, "usage": usage}}
    ratio = measured("llm_called_priced", alice, f"/api/v1/tasks/{leased['task']}/events/", body)
    assert ratio < 8


def test_a_tool_call_stores_its_input_in_its_event_and_record(alice: AgentClient, leased: dict[str, Any]) -> None:
    body: dict[str, Any] = {"step": 1, "tool": "t" * 200, "input": {}, "lease_epoch": leased["epoch"],
                            "compensation": {"tool": "u" * 200, "input": {}}}
    room = body_room(body)
    body["input"] = {"x": "y" * (room // 2)}
    body["compensation"]["input"] = {"x": "z" * (room // 2)}
    measured("tool_calls_dispatch", alice, f"/api/v1/tasks/{leased['task']}/tool-calls/", body)


def test_a_tool_result_stores_its_result_in_its_event_and_record(alice: AgentClient, leased: dict[str, Any]) -> None:
    dispatched = alice.post(f"/api/v1/tasks/{leased['task']}/tool-calls/",
                            {"step": 1, "tool": "crm", "input": {}, "lease_epoch": leased["epoch"]}, format="json")
    key = dispatched.json()["idempotency_key"]
    body: dict[str, Any] = {"status": "succeeded", "result": {}, "lease_epoch": leased["epoch"],
                            "cost": {"amount": "999999999999.999999999999", "currency": "USD"}}
    body["result"] = {"x": "y" * body_room(body)}
    measured("tool_calls_result", alice, f"/api/v1/tool-calls/{key}/result/", body)


def test_a_subtask_stores_its_input_in_the_child_and_both_logs(alice: AgentClient, leased: dict[str, Any]) -> None:
    body: dict[str, Any] = {"step": 1, "kind": "k" * 100, "input": {}, "lease_epoch": leased["epoch"]}
    body["input"] = {"x": "y" * body_room(body)}
    measured("subtasks", alice, f"/api/v1/tasks/{leased['task']}/subtasks/", body)


def test_a_fork_stores_the_source_input_it_copies_and_never_its_events(alice: AgentClient) -> None:
    source_input = {"x": "y" * body_room({"kind": "k", "input": {}})}
    source = create_task(alice, kind="k", input=source_input)
    for step in range(20):
        alice.post(f"/api/v1/tasks/{source['task_id']}/events/",
                   {"type": "Noted", "payload": {"pad": "p" * 10_000, "step": step}}, format="json")
    body = {"at_seq": 21, "reason": "r" * 500}
    # Measured against the request and the input it copies: the 20 large events are not copied.
    measured("task_fork", alice, f"/api/v1/tasks/{source['task_id']}/fork/", body,
             copied=len(json.dumps(source_input, separators=(",", ":"))))


def test_a_sandbox_fork_with_1000_tool_answers(alice: AgentClient) -> None:
    source = create_task(alice, kind="k", input={})
    body = {"at_seq": 1, "reason": "r", "sandbox": True, "input": {},
            "tool_answers": [{"step": i, "tool": "t", "status": "succeeded", "result": {}} for i in range(1000)]}
    measured("task_fork_sandbox_answers", alice, f"/api/v1/tasks/{source['task_id']}/fork/", body)


def test_a_cancel_with_the_longest_reason(staff: APIClient, alice: AgentClient) -> None:
    from api.fleet import REASON_MAX_CHARS

    task = create_task(alice, kind="k", input={})
    measured("task_cancel", staff, f"/api/v1/tasks/{task['task_id']}/cancel/",
             {"reason": "r" * REASON_MAX_CHARS}, status=200)


def test_a_budget_with_the_longest_key_and_reason(staff: APIClient) -> None:
    measured("budgets_set", staff, "/api/v1/budgets/",
             {"scope": "namespace", "key": "k" * 320, "period": "day", "unit": "currency", "currency": "USD",
              "limit": "999999999999999999.999999", "reason": "r" * 2000}, status=200)


def test_a_job_of_many_small_ids(staff: APIClient, alice: AgentClient) -> None:
    ids = [create_task(alice, kind="k", input={})["task_id"] for _ in range(50)]
    body = {"action": "cancel", "ids": ids, "reason": "r" * 2000}
    response = staff.post("/api/v1/jobs/", body, format="json")
    assert response.status_code in (200, 201), response.content[:300]
    measured("jobs_create", staff, "/api/v1/jobs/", body, status=response.status_code)
