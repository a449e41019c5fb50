"""The tool gateway: the backplane calls a real HTTP tool itself, answers repeats from the
record, and keeps a circuit breaker and a rate limit per tool in the database."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from api.bodies import ToolInvokeOut
from backplane.eventlog import services
from backplane.eventlog.models import Event, Task
from recovery import detector, gateway, leases
from recovery.errors import CircuitOpen
from recovery.models import Tool, ToolCall
from tests.api.conftest import assert_error, row_counts

# --- a real tool on 127.0.0.1 ------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    key: str | None
    body: Any


@dataclass
class ToolServer:
    """Paths: ``/honest`` acts once per Idempotency-Key and repeats its answer for a known key;
    ``/naive`` ignores the key and acts on every request; ``/refuses`` answers 400;
    ``/text`` answers 200 with plain text. ``failing`` makes every path answer 503 without
    acting, ``delay`` makes it think first, ``on_request`` runs before it acts."""

    base_url: str = ""
    seen: list[Seen] = field(default_factory=list)
    effects: Counter[str] = field(default_factory=Counter)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    failing: bool = False
    delay: float = 0.0
    on_request: Callable[[], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return self.base_url + path

    def calls(self, key: str | None = None) -> int:
        with self.lock:
            return sum(1 for s in self.seen if key is None or s.key == key)

    def wait_for_effect(self, key: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.effects[key] == 0:
            assert time.monotonic() < deadline, "the tool never acted"
            time.sleep(0.02)

    def handle(self, path: str, key: str | None, body: Any) -> tuple[int, bytes, str]:
        with self.lock:
            self.seen.append(Seen(path, key, body))
        if self.on_request is not None:
            self.on_request()
        if self.failing:
            return 503, b'{"error": "down for maintenance"}', "application/json"
        if self.delay:
            time.sleep(self.delay)
        with self.lock:
            if path == "/honest":
                if key not in self.answers:
                    self.effects[key or ""] += 1
                    self.answers[key or ""] = {"message_id": f"m-{len(self.answers) + 1}", "to": body.get("to")}
                return 200, json.dumps(self.answers[key or ""]).encode(), "application/json"
            if path == "/naive":
                self.effects[key or ""] += 1
                return 200, json.dumps({"charge": sum(self.effects.values())}).encode(), "application/json"
            if path == "/refuses":
                return 400, b'{"error": "no such address"}', "application/json"
            if path == "/text":
                self.effects[key or ""] += 1
                return 200, b"queued", "text/plain"
        return 404, b"", "text/plain"


@pytest.fixture
def tool_server() -> Iterator[ToolServer]:
    server_state = ToolServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, payload, content_type = server_state.handle(
                self.path, self.headers.get("Idempotency-Key"), json.loads(raw or b"null")
            )
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the gateway gave up waiting (a timeout test); the tool acted anyway

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server_state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield server_state
    httpd.shutdown()
    httpd.server_close()


# --- fixtures ----------------------------------------------------------------------------------


class AgentClient(APIClient):
    namespace: str


def agent_client(name: str, namespace: str) -> AgentClient:
    created = services.agent_create(name=name, namespace=namespace)
    client = AgentClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
    client.namespace = namespace
    return client


@pytest.fixture
def alice(db) -> AgentClient:  # type: ignore[no-untyped-def]
    return agent_client("alice", "acme")


@pytest.fixture
def mallory(db) -> AgentClient:  # type: ignore[no-untyped-def]
    return agent_client("mallory", "globex")


@pytest.fixture
def make_tool(db, tool_server: ToolServer) -> Callable[..., Tool]:  # type: ignore[no-untyped-def]
    def make(name: str = "send-email", path: str = "/honest", **fields: Any) -> Tool:
        fields.setdefault("timeout_seconds", 5)
        return Tool.objects.create(name=name, url=tool_server.url(path), **fields)

    return make


def new_task(namespace: str = "acme") -> Task:
    return services.task_create(namespace=namespace, kind="send-campaign", input={"n": 1}, agent="planner").task


def key_of(task: Task, step: int, tool: str = "send-email") -> str:
    return hashlib.sha256(f"{task.pk}:{step}:{tool}".encode()).hexdigest()


def invoke(client: APIClient, task: Task, *, tool: str = "send-email", step: int = 1, **body: Any) -> Any:
    body = {"task_id": str(task.pk), "step": step, "input": {"to": "bob@example.com"}, **body}
    return client.post(f"/api/v1/tools/{tool}/invoke/", body, format="json")


def tool_events(task: Task) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.payload) for e in Event.objects.filter(task=task, type__startswith="ToolCall").order_by("seq")]


# --- the call, the record, the cache -----------------------------------------------------------


def test_it_calls_the_tool_once_with_the_key_and_records_both_events(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool(ttl_seconds=600)
    task = new_task()
    response = invoke(alice, task, step=4)

    key = key_of(task, 4)
    assert response.status_code == 200, response.content
    assert response.json() == {"idempotency_key": key, "status": "succeeded",
                               "result": {"message_id": "m-1", "to": "bob@example.com"}, "replayed": False}
    msgspec.convert(response.json(), ToolInvokeOut)  # the answer as api/bodies.py declares it
    assert [(s.path, s.key, s.body) for s in tool_server.seen] == [("/honest", key, {"to": "bob@example.com"})]
    assert tool_events(task) == [
        ("ToolCallDispatched", {"idempotency_key": key, "step": 4, "tool": "send-email",
                                "input": {"to": "bob@example.com"}, "compensation": None}),
        ("ToolCallResultReceived", {"idempotency_key": key, "step": 4, "tool": "send-email", "status": "succeeded",
                                    "result": {"message_id": "m-1", "to": "bob@example.com"}}),
    ]
    call = ToolCall.objects.get(pk=key)
    assert call.expires_at - call.dispatched_at == timedelta(seconds=tool.ttl_seconds)
    assert Event.objects.get(task=task, type="ToolCallDispatched").agent == "alice"


def test_a_repeat_is_answered_from_the_record_without_calling_the_tool(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool()
    task = new_task()
    first = invoke(alice, task).json()
    before = row_counts()

    again = invoke(alice, task)

    assert again.status_code == 200 and again["Idempotent-Replay"] == "true"
    assert again.json() == {**first, "replayed": True}
    assert tool_server.calls() == 1 and row_counts() == before


def test_a_tool_that_ignores_idempotency_keys_still_acts_once(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool("charge-card", "/naive")
    task = new_task()
    answers = [invoke(alice, task, tool="charge-card", input={"amount": 42}).json() for _ in range(3)]

    assert tool_server.calls() == 1 and sum(tool_server.effects.values()) == 1
    assert [a["result"] for a in answers] == [{"charge": 1}] * 3
    assert [a["replayed"] for a in answers] == [False, True, True]


def test_an_answer_past_its_ttl_is_no_longer_the_cache(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool("charge-card", "/naive")
    task = new_task()
    invoke(alice, task, tool="charge-card")
    ToolCall.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = invoke(alice, task, tool="charge-card")

    assert response.status_code == 200 and response.json()["replayed"] is False
    assert response.json()["result"] == {"charge": 2}
    key = key_of(task, 1, "charge-card")
    assert tool_server.calls(key) == 2 and ToolCall.objects.get(pk=key).expires_at > timezone.now()


def test_a_4xx_is_a_failed_answer_recorded_once_and_not_a_breaker_failure(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool("send-email", "/refuses")
    task = new_task()
    response = invoke(alice, task)
    assert response.status_code == 200
    assert response.json()["status"] == "failed"
    assert response.json()["result"] == {"status_code": 400, "body": {"error": "no such address"}}
    assert invoke(alice, task).json()["replayed"] is True
    tool.refresh_from_db()
    assert tool_server.calls() == 1 and tool.consecutive_failures == 0


def test_a_body_that_is_not_a_json_object_is_wrapped(alice, make_tool) -> None:  # type: ignore[no-untyped-def]
    make_tool("enqueue", "/text")
    response = invoke(alice, new_task(), tool="enqueue")
    assert response.json()["result"] == {"value": "queued"}


def test_the_same_step_with_another_input_is_422_and_the_tool_is_not_called(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool()
    task = new_task()
    invoke(alice, task)
    before = row_counts()
    assert_error(invoke(alice, task, input={"to": "carol@example.com"}), 422, "idempotency_mismatch")
    assert tool_server.calls() == 1 and row_counts() == before


# --- the in-flight zone ------------------------------------------------------------------------


def test_a_call_dispatched_but_never_answered_is_sent_again_with_the_same_key(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    """The agent recorded the call and crashed before its answer; the gateway re-sends the
    same key and an honest tool acts once."""
    make_tool()
    task = new_task()
    dispatched = alice.post(f"/api/v1/tasks/{task.pk}/tool-calls/",
                            {"step": 1, "tool": "send-email", "input": {"to": "bob@example.com"}}, format="json")
    assert dispatched.status_code == 201
    key = dispatched.json()["idempotency_key"]

    response = invoke(alice, task)

    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert [s.key for s in tool_server.seen] == [key]
    assert [t for t, _ in tool_events(task)] == ["ToolCallDispatched", "ToolCallResultReceived"]


def test_a_timeout_leaves_the_call_in_flight_and_the_retry_sends_the_same_key(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool(timeout_seconds=1)
    task = new_task()
    key = key_of(task, 1)
    tool_server.delay = 1.5

    assert_error(invoke(alice, task), 502, "tool_unavailable")
    assert ToolCall.objects.get(pk=key).status == "dispatched"
    assert [t for t, _ in tool_events(task)] == ["ToolCallDispatched"]
    tool.refresh_from_db()
    assert tool.consecutive_failures == 1 and tool.breaker_state == "closed"

    tool_server.wait_for_effect(key)  # the tool acted; only its answer was lost
    tool_server.delay = 0
    response = invoke(alice, task)

    assert response.status_code == 200 and response.json()["result"]["message_id"] == "m-1"
    assert tool_server.calls(key) == 2 and tool_server.effects[key] == 1
    assert [t for t, _ in tool_events(task)] == ["ToolCallDispatched", "ToolCallResultReceived"]
    tool.refresh_from_db()
    assert tool.consecutive_failures == 0


# --- the circuit breaker -----------------------------------------------------------------------


def test_three_5xx_open_the_breaker_and_then_the_tool_is_not_called(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool()
    task = new_task()
    tool_server.failing = True
    for step in (1, 2, 3):
        error = assert_error(invoke(alice, task, step=step), 502, "tool_unavailable")
        assert error["details"]["status_code"] == 503
    tool.refresh_from_db()
    assert (tool.breaker_state, tool.consecutive_failures) == ("open", 3)
    assert "HTTP 503" in tool.last_error

    before = row_counts()
    refused = invoke(alice, task, step=4)
    error = assert_error(refused, 503, "circuit_open")
    assert 1 <= int(refused["Retry-After"]) <= 30
    assert error["details"]["retry_after"] == int(refused["Retry-After"])
    assert tool_server.calls() == 3 and row_counts() == before
    # Failed calls stay in flight and record no result.
    assert set(ToolCall.objects.values_list("status", flat=True)) == {"dispatched"}
    assert not Event.objects.filter(task=task, type="ToolCallResultReceived").exists()


def test_an_answer_on_record_is_still_served_while_the_breaker_is_open(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool()
    task = new_task()
    invoke(alice, task, step=1)
    Tool.objects.filter(pk=tool.pk).update(breaker_state="open", opened_at=timezone.now(), consecutive_failures=3)

    response = invoke(alice, task, step=1)

    assert response.status_code == 200 and response.json()["replayed"] is True
    assert_error(invoke(alice, task, step=2), 503, "circuit_open")
    assert tool_server.calls() == 1


def open_breaker(tool: Tool, *, cooled_down: bool) -> None:
    opened_at = timezone.now() - timedelta(seconds=31 if cooled_down else 0)
    Tool.objects.filter(pk=tool.pk).update(breaker_state="open", opened_at=opened_at, consecutive_failures=3)


def test_a_failed_trial_opens_the_breaker_again(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool()
    task = new_task()
    open_breaker(tool, cooled_down=True)
    tool_server.failing = True

    assert_error(invoke(alice, task, step=1), 502, "tool_unavailable")

    tool.refresh_from_db()
    assert tool.breaker_state == "open" and tool.consecutive_failures == 4
    assert timezone.now() - tool.opened_at < timedelta(seconds=5)
    assert_error(invoke(alice, task, step=2), 503, "circuit_open")
    assert tool_server.calls() == 1


def test_a_trial_refused_by_the_rate_limit_hands_the_trial_on(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool(rate_limit_per_minute=1)
    task = new_task()
    open_breaker(tool, cooled_down=True)
    if timezone.now().second >= 57:  # a new window would let the call through
        time.sleep(61 - timezone.now().second)
    Tool.objects.filter(pk=tool.pk).update(rate_window_start=timezone.now().replace(second=0, microsecond=0),
                                           rate_window_count=1)

    assert_error(invoke(alice, task), 429, "rate_limited")
    tool.refresh_from_db()
    assert tool.breaker_state == "open" and tool_server.calls() == 0  # not stuck half-open

    Tool.objects.filter(pk=tool.pk).update(rate_window_count=0)
    assert invoke(alice, task).status_code == 200
    tool.refresh_from_db()
    assert (tool.breaker_state, tool.consecutive_failures) == ("closed", 0)


def test_a_trial_that_never_reported_is_given_up_and_another_call_is_the_trial(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = make_tool()  # timeout 5 s, cool-down 30 s: a trial is given up after 35 s
    task = new_task()

    def trial_out_since(seconds: int) -> None:
        started = timezone.now() - timedelta(seconds=seconds)
        Tool.objects.filter(pk=tool.pk).update(breaker_state="half_open", opened_at=started - timedelta(minutes=1),
                                               trial_started_at=started, consecutive_failures=3)

    trial_out_since(20)
    refused = invoke(alice, task)
    assert_error(refused, 503, "circuit_open")
    assert 1 <= int(refused["Retry-After"]) <= 30 and tool_server.calls() == 0

    trial_out_since(36)
    assert invoke(alice, task).status_code == 200
    tool.refresh_from_db()
    assert (tool.breaker_state, tool.consecutive_failures, tool.trial_started_at) == ("closed", 0, None)
    assert tool_server.calls() == 1


def run_in_threads(count: int, work: Callable[[int], Any]) -> list[Any]:
    results: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def runner(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            results[index] = exc
        finally:
            connection.close()  # each thread has its own connection; give it back

    threads = [threading.Thread(target=runner, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


@pytest.mark.django_db(transaction=True)
def test_half_open_lets_exactly_one_call_through(committed_db, tool_server) -> None:  # type: ignore[no-untyped-def]
    tool = Tool.objects.create(name="send-email", url=tool_server.url("/honest"), timeout_seconds=5)
    task = new_task()
    open_breaker(tool, cooled_down=True)
    tool_server.delay = 0.3  # the trial is still out while the others arrive

    def work(index: int) -> Any:
        return gateway.tool_invoke(namespace="acme", task_id=task.pk, step=index, tool_name="send-email",
                                   input={"to": f"user{index}@example.com"}, agent="alice", lease_epoch=None)

    results = run_in_threads(8, work)

    through = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, CircuitOpen)]
    assert len(through) == 1 and len(refused) == 7, results
    assert all(r.retry_after is not None and r.retry_after >= 1 for r in refused)
    assert tool_server.calls() == 1 and ToolCall.objects.count() == 1
    tool.refresh_from_db()
    assert (tool.breaker_state, tool.consecutive_failures, tool.opened_at) == ("closed", 0, None)


# --- the rate limit ----------------------------------------------------------------------------


def test_calls_beyond_the_rate_limit_get_429_with_retry_after(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool(rate_limit_per_minute=2)
    task = new_task()
    if timezone.now().second >= 57:  # keep the three calls in one window
        time.sleep(61 - timezone.now().second)
    assert invoke(alice, task, step=1).status_code == 200
    assert invoke(alice, task, step=2).status_code == 200

    before = row_counts()
    limited = invoke(alice, task, step=3)

    error = assert_error(limited, 429, "rate_limited")
    assert 1 <= int(limited["Retry-After"]) <= 60 and error["details"]["retry_after"] == int(limited["Retry-After"])
    assert tool_server.calls() == 2 and row_counts() == before
    # A cached answer does not call the tool, so the limit does not apply to it.
    assert invoke(alice, task, step=1).json()["replayed"] is True


@pytest.mark.django_db(transaction=True)
def test_the_rate_limit_holds_under_concurrent_calls(committed_db, tool_server) -> None:  # type: ignore[no-untyped-def]
    Tool.objects.create(name="send-email", url=tool_server.url("/honest"), timeout_seconds=5, rate_limit_per_minute=3)
    task = new_task()
    if timezone.now().second >= 57:  # keep the calls in one window
        time.sleep(61 - timezone.now().second)

    def work(index: int) -> Any:
        return gateway.tool_invoke(namespace="acme", task_id=task.pk, step=index, tool_name="send-email",
                                   input={}, agent="alice", lease_epoch=None)

    results = run_in_threads(10, work)

    assert sum(not isinstance(r, BaseException) for r in results) == 3, results
    assert sum(type(r).__name__ == "RateLimited" for r in results) == 7
    assert tool_server.calls() == 3


# --- who may invoke what -----------------------------------------------------------------------


def test_an_unknown_or_inactive_tool_is_404(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool("retired", is_active=False)
    task = new_task()
    before = row_counts()
    assert_error(invoke(alice, task, tool="nope"), 404, "not_found")
    assert_error(invoke(alice, task, tool="retired"), 404, "not_found")
    assert tool_server.calls() == 0 and row_counts() == before


def test_another_namespaces_task_is_404(alice, mallory, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool()
    task = new_task("acme")
    before = row_counts()
    assert_error(invoke(mallory, task), 404, "not_found")
    assert tool_server.calls() == 0 and row_counts() == before


def test_a_stale_lease_epoch_is_409(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool()
    task = new_task()
    claim = alice.post("/api/v1/leases/", {}, format="json").json()
    before = row_counts()
    assert_error(invoke(alice, task, lease_epoch=claim["lease_epoch"] + 1), 409, "stale_lease")
    assert_error(invoke(alice, task), 409, "stale_lease")
    assert tool_server.calls() == 0 and row_counts() == before
    assert invoke(alice, task, lease_epoch=claim["lease_epoch"]).status_code == 200


def test_bad_bodies_are_400(alice, make_tool, tool_server) -> None:  # type: ignore[no-untyped-def]
    make_tool()
    task = new_task()
    before = row_counts()
    body: dict[str, Any]
    for body in ({"step": -1}, {"step": "1"}, {"input": []}, {"task_id": "not-a-uuid"}, {"lease_epoch": "1"}):
        assert_error(invoke(alice, task, **body), 400, "validation_error")
    assert tool_server.calls() == 0 and row_counts() == before


@pytest.mark.django_db(transaction=True)
def test_an_answer_is_recorded_even_when_the_lease_moved_on_during_the_call(committed_db, tool_server) -> None:  # type: ignore[no-untyped-def]
    """After the call, before the commit: the holder's lease expired while the tool worked.
    The answer is still recorded, so the next holder gets it instead of a second call."""
    Tool.objects.create(name="send-email", url=tool_server.url("/naive"), timeout_seconds=5)
    worker = services.agent_create(name="worker", namespace="acme").agent
    task = new_task()
    first = leases.lease_claim(agent=worker, kinds=None, lease_seconds=30)
    assert first is not None

    def lease_expires() -> None:
        Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
        detector.lease_expire_stalled()
        connection.close()

    tool_server.on_request = lease_expires
    answer = gateway.tool_invoke(namespace="acme", task_id=task.pk, step=1, tool_name="send-email", input={},
                                 agent="worker", lease_epoch=first.lease_epoch)
    tool_server.on_request = None
    assert answer.call.status == "succeeded"

    second = leases.lease_claim(agent=worker, kinds=None, lease_seconds=30)
    assert second is not None and second.lease_epoch > first.lease_epoch
    replay = gateway.tool_invoke(namespace="acme", task_id=task.pk, step=1, tool_name="send-email", input={},
                                 agent="worker", lease_epoch=second.lease_epoch)
    assert replay.replayed is True and replay.call.result == {"charge": 1}
    assert tool_server.calls() == 1


# --- the admin ---------------------------------------------------------------------------------


def test_tools_are_registered_in_the_admin_and_tool_calls_are_read_only(make_tool, alice) -> None:  # type: ignore[no-untyped-def]
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    tool = make_tool()
    invoke(alice, new_task())
    call = ToolCall.objects.get()
    open_breaker(tool, cooled_down=False)

    assert staff.get("/admin/recovery/tool/").status_code == 200
    assert staff.get(f"/admin/recovery/tool/{tool.pk}/change/").status_code == 200
    assert staff.get("/admin/recovery/toolcall/").status_code == 200
    assert staff.get("/admin/recovery/toolcall/add/").status_code == 403
    assert staff.post(f"/admin/recovery/toolcall/{call.pk}/delete/", {"post": "yes"}).status_code == 403

    staff.post("/admin/recovery/tool/", {"action": "reset_breakers", "_selected_action": [tool.pk]})
    tool.refresh_from_db()
    assert (tool.breaker_state, tool.consecutive_failures) == ("closed", 0)


# --- forks and sandboxes -----------------------------------------------------------------------


def fork_of(client: APIClient, task: Task, **body: Any) -> Task:
    response = client.post(f"/api/v1/tasks/{task.pk}/fork/", {"reason": "again", **body}, format="json")
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["task_id"])


def test_a_fork_sends_an_in_flight_step_with_the_sources_key_and_the_tool_acts_once(
    alice: AgentClient, make_tool: Callable[..., Tool], tool_server: ToolServer
) -> None:
    """The source's agent dispatched through the proxy, the tool acted, the answer was never
    recorded; a fork's gateway call of that step sends the source's key, and an honest tool
    answers from its own record."""
    make_tool()
    source = new_task()
    dispatched = alice.post(f"/api/v1/tasks/{source.pk}/tool-calls/",
                            {"step": 1, "tool": "send-email", "input": {"to": "bob@example.com"}}, format="json")
    source_key = dispatched.json()["idempotency_key"]
    tool_server.handle("/honest", source_key, {"to": "bob@example.com"})  # it reached the tool; nobody heard
    fork = fork_of(alice, source, at_seq=2)

    response = invoke(alice, fork)

    assert response.status_code == 200, response.content
    assert response.json()["result"] == {"message_id": "m-1", "to": "bob@example.com"}
    assert [s.key for s in tool_server.seen] == [source_key, source_key] and tool_server.effects[source_key] == 1
    # The fork's log has the answer, naming the effect the source started; the source is untouched.
    assert [t for t, _ in tool_events(fork)] == ["ToolCallResultReceived"]
    assert tool_events(fork)[0][1]["effect_key"] == source_key
    assert [t for t, _ in tool_events(source)] == ["ToolCallDispatched"]


def test_a_sandbox_never_calls_a_tool(
    alice: AgentClient, make_tool: Callable[..., Tool], tool_server: ToolServer
) -> None:
    make_tool()
    make_tool(name="crm-lookup")
    source = new_task()
    assert invoke(alice, source, step=1).status_code == 200
    assert tool_server.calls() == 1
    sandbox = fork_of(alice, source, at_seq=1, sandbox=True)
    before = row_counts()

    refused = invoke(alice, sandbox, tool="crm-lookup", step=2)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "sandbox_refused"
    assert row_counts() == before

    answered = invoke(alice, sandbox, step=1)
    assert answered.status_code == 200 and answered.json()["replayed"] is True
    assert answered.json()["result"] == {"message_id": "m-1", "to": "bob@example.com"}
    assert tool_server.calls() == 1  # neither call reached the tool
    assert [t for t, _ in tool_events(sandbox)] == ["ToolCallDispatched", "ToolCallResultReceived"]


def test_a_call_waiting_for_approval_spends_no_rate_limit_slot(alice: APIClient, make_tool: Callable[..., Tool],
                                                               tool_server: ToolServer) -> None:
    """Each invoke of a gated call until its decision answers 202 without taking a slot of the
    tool's per-minute limit; once approved, the call takes its one slot and the tool acts once."""
    from recovery import approvals
    from tests.support.roles import staff_user

    approver = staff_user("ana", "Approvers")
    approvals.tool_policy_set(tool="send-email", approver_group="Approvers", set_by="user:olivia", reason="all mail")
    tool = make_tool(rate_limit_per_minute=1)
    task = new_task()
    if timezone.now().second >= 55:  # keep the calls in one window
        time.sleep(61 - timezone.now().second)
    waiting = [invoke(alice, task) for _ in range(3)]
    assert {w.status_code for w in waiting} == {202} and len({w.json()["approval_id"] for w in waiting}) == 1
    tool.refresh_from_db()
    assert tool.rate_window_count == 0 and tool_server.calls() == 0
    approvals.approval_decide(approval_id=waiting[0].json()["approval_id"], user=approver, verdict="approve",
                              reason="read it")
    made = invoke(alice, task)
    assert made.status_code == 200 and made.json()["status"] == "succeeded" and tool_server.calls() == 1
