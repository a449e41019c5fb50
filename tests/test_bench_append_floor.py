"""bench/append_floor.py, the floor ``make bench`` sets beside the product's appends (issue 40):
it must really send the product's statements, so its rate bounds the product's. Over ASGI on a
committed database: an append and a batch are answered 201 and land as the product would store
them (numbered on the task's head, chained, the projection moved), and what the product refuses
before any statement (no token, an unknown one, another namespace's task) it refuses too."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from backplane.runtime.async_pool import async_pool_close

pytestmark = pytest.mark.usefixtures("committed_db")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    # It imports ingress_apps beside it, as uvicorn's --app-dir bench lets it.
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_append_floor", REPO / "bench" / "append_floor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # msgspec resolves the bodies' annotations in the module's namespace
    spec.loader.exec_module(module)
    return module


def post(floor: ModuleType, requests: list[tuple[str, str, Any]]) -> list[httpx.Response]:
    """``(path, token, body)`` each posted in turn, on a loop whose pool is closed after."""
    async def calls() -> list[httpx.Response]:
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=floor.app), base_url="http://floor") as http:
                return [await http.post(path, content=json.dumps(body), headers={
                    "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
                    for path, token, body in requests]
        finally:
            await async_pool_close()

    return asyncio.run(calls())


def test_the_floor_writes_appends_and_batches_as_the_product_stores_them(floor: ModuleType) -> None:
    token = services.agent_create(name="floor", namespace="bench").token
    task = services.task_create(namespace="bench", kind="floor", agent="floor", input={}).task
    other = services.task_create(namespace="elsewhere", kind="floor", agent="x", input={}).task
    events = f"/api/v1/tasks/{task.pk}/events/"
    batch = {"events": [{"type": "Noted", "payload": {"i": i}} for i in range(3)]}
    one, many, unknown, foreign, bad = post(floor, [
        (events, token, {"type": "Noted", "payload": {"note": "load"}}),
        (f"{events}batch/", token, batch),
        (events, "not-a-token", {"type": "Noted", "payload": {}}),
        (f"/api/v1/tasks/{other.pk}/events/", token, {"type": "Noted", "payload": {}}),
        (events, token, {"type": "Noted", "payload": {}, "extra": 1}),
    ])
    assert (one.status_code, many.status_code) == (201, 201), (one.text, many.text)
    assert (unknown.status_code, foreign.status_code, bad.status_code) == (401, 404, 400)
    assert one.json()["seq"] == 2 and [e["seq"] for e in many.json()] == [3, 4, 5]

    stored = list(Event.objects.filter(task=task).order_by("seq"))
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    assert all(later.prev_hash == earlier.hash for earlier, later in zip(stored, stored[1:], strict=False))
    assert [e.payload for e in stored[1:]] == [{"note": "load"}, {"i": 0}, {"i": 1}, {"i": 2}]
    assert {e.agent for e in stored[1:]} == {"floor"}
    task = Task.objects.get(pk=task.pk)
    assert (task.last_seq, task.head_hash, task.lamport) == (5, stored[-1].hash, stored[-1].lamport)
    assert Event.objects.filter(task=other).count() == 1


def test_the_floor_refuses_what_is_not_an_append(floor: ModuleType) -> None:
    token = services.agent_create(name="floor", namespace="bench").token
    (missing, wrong) = post(floor, [
        (f"/api/v1/tasks/{uuid.uuid4()}/events/", token, {"type": "Noted", "payload": {}}),
        ("/api/v1/tasks/not-a-uuid/events/", token, {"type": "Noted", "payload": {}}),
    ])
    assert (missing.status_code, wrong.status_code) == (404, 404)
