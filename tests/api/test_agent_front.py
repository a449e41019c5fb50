"""An agent's requests to the agent routes, served by the HTTP front (api/agent_front.py): each
answer is compared with what Django's stack answers to the same request (status, body, headers).

The front's answers come from its agent routes alone, behind a default that answers 418: an
answer that is not a teapot was given by the routes under test, not by Django. Data is committed,
since the async pool's connections, and the threads' that run the writes, are not the test's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from django.db import connections
from django.test import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.responses import Response
from starlette.routing import Router
from starlette.types import Receive, Scope, Send

from api import agent_front
from api.base import json_bytes
from api.middleware import too_large_error
from api.serializers import task_as_api_dict
from backplane.eventlog import services
from backplane.eventlog.async_services import HandOff
from backplane.eventlog.chain import event_as_api_dict
from backplane.eventlog.models import Event
from backplane.eventlog.selectors import TASK_ROW_SQL
from backplane.eventlog.writer import EventDraft
from backplane.runtime.async_pool import APPLICATION_NAME, async_pool, async_pool_close, pooled_connection
from backplane.runtime.database_gate import PROBE_INTERVAL, gate
from backplane.telemetry import tracing
from backplane.telemetry.http import RESPONSES

pytestmark = pytest.mark.usefixtures("committed_db")

# What the two stacks must agree on, beside the status and the body (the Date and the server's
# own headers come from uvicorn, not from either stack).
COMPARED_HEADERS = ("content-type", "content-length", "allow", "www-authenticate", "retry-after", "x-frame-options",
                    "x-content-type-options", "referrer-policy", "cross-origin-opener-policy",
                    "strict-transport-security")


async def teapot(scope: Scope, receive: Receive, send: Send) -> None:
    await Response(b"not an agent read", status_code=418)(scope, receive, send)


class AsyncReads:
    """The agent routes over ASGI, on an event loop of this test's (the pool lives in it), their
    writes on threads of a pool of the test's, as the web process runs them on its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="front-test")
        self.app = Router(routes=agent_front.agent_routes(self.threads), default=teapot, redirect_slashes=False)

    def request(self, method: str, path: str, headers: dict[str, str], *, base_url: str,
                content: bytes | Iterator[bytes] | None = None) -> httpx.Response:
        async def call() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            body: Any = content
            if content is not None and not isinstance(content, bytes):
                chunks = list(content)

                async def stream() -> Any:  # no length declared: sent chunked
                    for chunk in chunks:
                        yield chunk

                body = stream()
            async with httpx.AsyncClient(transport=transport, base_url=base_url) as http:
                return await http.request(method, path, headers=headers, content=body)

        return self.loop.run_until_complete(call())

    def close(self) -> None:
        self.loop.run_until_complete(async_pool_close())
        self.loop.close()
        # The threads' Django connections are closed after each request (obsolete at once here).
        self.threads.shutdown(wait=True)


@pytest.fixture
def reads() -> Iterator[AsyncReads]:
    served = AsyncReads()
    try:
        yield served
    finally:
        served.close()


@pytest.fixture
def agent() -> dict[str, Any]:
    created = services.agent_create(name="reader", namespace="acme")
    task = services.task_create(namespace="acme", kind="lead-qualification", agent="reader", input={"lead": "ü"}).task
    for step in range(5):
        services.event_append(namespace="acme", task_id=task.pk, agent="reader",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": step, "t": "\u2028"}))
    return {"token": created.token, "task_id": str(task.pk)}


def both(reads: AsyncReads, method: str, path: str, *, token: str, host: str = "testserver",
         scheme: str = "http", headers: dict[str, str] | None = None) -> httpx.Response:
    """The request through the agent routes and through Django; asserts they agree; the first."""
    sent = {"Authorization": f"Bearer {token}", "Host": host, **(headers or {})}
    served = reads.request(method, path, sent, base_url=f"{scheme}://{host}")
    assert served.status_code != 418, f"{method} {path} was not taken by the agent routes"
    django = Client().generic(method, path, secure=scheme == "https", headers=sent)
    assert (served.status_code, served.content) == (django.status_code, django.content), (method, path)
    for name in COMPARED_HEADERS:
        # Django's test client leaves out the length of an answer its middleware gave; the server
        # would send it chunked. Every other header is compared, present or absent.
        if name == "content-length" and name not in django.headers:
            continue
        assert served.headers.get(name) == django.headers.get(name), (name, method, path)
    return served


def test_a_task_and_its_events_are_answered_as_django_answers_them(reads: AsyncReads, agent: dict[str, Any]) -> None:
    task = f"/api/v1/tasks/{agent['task_id']}/"
    read = both(reads, "GET", task, token=agent["token"])
    assert read.status_code == 200 and read.json()["last_seq"] == 6
    assert b"\\u2028" not in read.content  # the input has none; the events do (below)
    head = both(reads, "HEAD", task, token=agent["token"])
    assert head.content == b"" and head.headers["allow"] == "GET, HEAD, OPTIONS"

    page = both(reads, "GET", f"{task}events/?limit=2&after_seq=1", token=agent["token"])
    assert [e["seq"] for e in page.json()["results"]] == [2, 3] and page.json()["next_after_seq"] == 3
    assert b"\\u2028" in page.content
    last = both(reads, "GET", f"{task}events/?after_seq=3", token=agent["token"])
    assert [e["seq"] for e in last.json()["results"]] == [4, 5, 6] and last.json()["next_after_seq"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=x", "after_seq=-1", "after_seq=1e3",
                                   "limit=%00"])
def test_a_bad_query_is_the_same_400(reads: AsyncReads, agent: dict[str, Any], query: str) -> None:
    answer = both(reads, "GET", f"/api/v1/tasks/{agent['task_id']}/events/?{query}", token=agent["token"])
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "validation_error"


def test_a_task_of_another_namespace_or_none_is_the_same_404(reads: AsyncReads, agent: dict[str, Any]) -> None:
    other = services.task_create(namespace="globex", kind="lead-qualification", agent="x", input={}).task
    for task_id in (other.pk, uuid.uuid4()):
        for path in (f"/api/v1/tasks/{task_id}/", f"/api/v1/tasks/{task_id}/events/"):
            answer = both(reads, "GET", path, token=agent["token"])
            assert answer.status_code == 404 and answer.json()["error"]["details"] == {"task_id": str(task_id)}


@pytest.mark.parametrize(("accept", "query", "status"), [
    ("text/html", "", 406), ("application/xml, text/*;q=0.5", "", 406), ("application/json", "", 200),
    ("text/html, */*;q=0.1", "", 200), ("application/*", "", 200), ("*/*", "?format=json", 200),
    ("*/*", "?format=xml", 404)])
def test_what_json_cannot_satisfy_is_refused_alike_before_the_token_is_read(
    reads: AsyncReads, agent: dict[str, Any], accept: str, query: str, status: int
) -> None:
    for token in (agent["token"], "not-a-token"):  # a stranger is told 406 too, as DRF tells it
        answer = both(reads, "GET", f"/api/v1/tasks/{agent['task_id']}/{query}", token=token,
                      headers={"Accept": accept})
        assert answer.status_code == (401 if token == "not-a-token" and status == 200 else status)
    if status == 406:
        assert answer.json()["error"]["code"] == "not_acceptable"


@pytest.mark.parametrize("token", ["not-a-token", "two words"])
def test_a_bad_token_is_the_same_401(reads: AsyncReads, agent: dict[str, Any], token: str) -> None:
    answer = both(reads, "GET", f"/api/v1/tasks/{agent['task_id']}/", token=token)
    assert answer.status_code == 401 and answer.headers["www-authenticate"] == 'Bearer realm="api"'


def test_past_the_rate_limit_it_is_the_same_429(reads: AsyncReads, agent: dict[str, Any], settings: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from api import throttling

    settings.BACKPLANE_RATE_LIMIT = "2/h"
    # One clock for the window and its wait on both stacks: Retry-After counts whole seconds, and
    # the two requests of a comparison may straddle a second's end.
    now = time.time()
    monkeypatch.setattr(throttling, "time", SimpleNamespace(time=lambda: now))
    path = f"/api/v1/tasks/{agent['task_id']}/"
    both(reads, "GET", path, token=agent["token"])  # the first two of the hour: 200 on either stack
    answer = both(reads, "GET", path, token=agent["token"])
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) > 0


def test_a_host_not_allowed_and_plain_http_where_https_is_required_are_refused_alike(
        reads: AsyncReads, agent: dict[str, Any], settings: Any) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/"
    assert both(reads, "GET", path, token=agent["token"], host="evil.example").status_code == 400
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    refused = both(reads, "GET", path, token=agent["token"])
    assert refused.status_code == 403 and refused.json()["error"]["details"]["url"].startswith("https://")
    served = both(reads, "GET", path, token=agent["token"], scheme="https")
    assert served.status_code == 200 and served.headers["strict-transport-security"].startswith("max-age=3600")


def test_while_the_gate_is_down_it_is_the_same_503(reads: AsyncReads, agent: dict[str, Any]) -> None:
    gate.mark_down("the test closed it")  # just marked: no probe is due for PROBE_INTERVAL
    answer = both(reads, "GET", f"/api/v1/tasks/{agent['task_id']}/", token=agent["token"])
    assert answer.status_code == 503 and answer.json()["error"]["details"] == {"problem": "the test closed it"}


def test_a_database_it_cannot_reach_is_503_and_closes_the_gate(reads: AsyncReads, agent: dict[str, Any]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    settings_dict = connections["default"].settings_dict
    real = settings_dict["HOST"], settings_dict["PORT"]
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", str(closed_port)
    try:
        answer = reads.request("GET", f"/api/v1/tasks/{agent['task_id']}/",
                               {"Authorization": f"Bearer {agent['token']}"}, base_url="http://testserver")
    finally:
        settings_dict["HOST"], settings_dict["PORT"] = real
    assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
    assert answer.json()["error"]["code"] == "unavailable"
    assert gate.is_marked_down


def test_each_read_is_counted_under_its_route(reads: AsyncReads, agent: dict[str, Any]) -> None:
    counted = RESPONSES.labels(status="200", view="task-events", method="GET")
    before = counted._value.get()
    reads.request("GET", f"/api/v1/tasks/{agent['task_id']}/events/", {"Authorization": f"Bearer {agent['token']}"},
                  base_url="http://testserver")
    assert counted._value.get() == before + 1


@pytest.mark.parametrize(("method", "path", "headers"), [
    ("POST", "/api/v1/tasks/{task}/events/", {}),  # no token: a staff session, or nobody
    ("GET", "/api/v1/tasks/{task}/", {"Authorization": "Basic eDp5"}),
    ("GET", "/api/v1/tasks/{upper}/", {"Authorization": "Bearer x"}),  # not a path Django takes either
    ("GET", "/api/v1/tasks/{task}", {"Authorization": "Bearer x"}),  # no slash: Django's to route
    ("GET", "/api/v1/tasks/{task}/verify/", {"Authorization": "Bearer x"}),  # DRF's views, not agent routes
    ("POST", "/api/v1/tasks/{task}/cancel/", {"Authorization": "Bearer x"}),
    ("GET", "/api/v1/seals/latest/", {"Authorization": "Bearer x"}),
])
def test_every_other_request_on_their_paths_is_left_to_django(reads: AsyncReads, method: str, path: str,
                                                             headers: dict[str, str]) -> None:
    task = uuid.uuid4()
    url = path.format(task=task, upper=str(task).upper())
    assert reads.request(method, url, headers, base_url="http://testserver").status_code == 418


def test_with_tracing_on_a_read_is_a_server_span_in_the_agents_trace(reads: AsyncReads, agent: dict[str, Any]) -> None:
    exporter = InMemorySpanExporter()
    tracing.tracing_install(exporter, service_name="backplane-test")
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        headers = {"Authorization": f"Bearer {agent['token']}", "traceparent": f"00-{trace_id}-{parent}-01"}
        answer = reads.request("GET", f"/api/v1/tasks/{agent['task_id']}/", headers, base_url="http://testserver")
    finally:
        tracing.tracing_uninstall()
    assert answer.status_code == 200
    (span,) = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert span.name == "GET api/v1/tasks/<uuid:task_id>/" and span.parent is not None
    assert (format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x")) == (trace_id, parent)


def test_a_restart_costs_one_503_then_the_pools_connections_are_new(reads: AsyncReads, agent: dict[str, Any]) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/"
    sent = {"Authorization": f"Bearer {agent['token']}"}
    assert reads.request("GET", path, sent, base_url="http://testserver").status_code == 200
    with connections["default"].cursor() as cursor:  # a restart, as the pool's connections see it
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                       [APPLICATION_NAME])
        assert cursor.fetchone()[0] >= 1
    lost = reads.request("GET", path, sent, base_url="http://testserver")
    assert lost.status_code == 503 and lost.headers["retry-after"] == "5" and gate.is_marked_down
    time.sleep(PROBE_INTERVAL)  # the gate probes again, finds the database, opens
    for _ in range(3):  # every connection the next reads get is new: none of them meets the restart
        assert reads.request("GET", path, sent, base_url="http://testserver").status_code == 200
    assert not gate.is_marked_down


def test_an_error_that_leaves_the_connection_broken_is_a_lost_database(reads: AsyncReads) -> None:
    """psycopg reports some losses mid-protocol as another error (PgBouncer's server connection
    dying under a BEGIN is "received 2 results", an InternalError): a broken connection is what
    says the database was lost, so the request answers 503 and the pool is renewed, not 500."""

    async def error_on(*, break_it: bool) -> BaseException:
        try:
            async with pooled_connection() as conn:
                if break_it:
                    async with (await async_pool()).connection() as other:
                        await other.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
                    with contextlib.suppress(psycopg.OperationalError):
                        await conn.execute("SELECT 1")
                    assert conn.broken
                raise psycopg.InternalError("received 2 results from command 'BEGIN'")
        except psycopg.Error as exc:
            return exc
        raise AssertionError("nothing raised")

    lost = reads.loop.run_until_complete(error_on(break_it=True))
    assert isinstance(lost, psycopg.OperationalError) and isinstance(lost.__cause__, psycopg.InternalError)
    # On a connection still whole, the error is the query's own: the contract's 500.
    assert type(reads.loop.run_until_complete(error_on(break_it=False))) is psycopg.InternalError


def test_the_pools_connections_prepare_the_statements_they_run_often(reads: AsyncReads,
                                                                     agent: dict[str, Any]) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/"
    # One at a time, so the pool holds one or two connections (the first request may wait for
    # one while the pool opens another), each given enough reads to pass psycopg's threshold of 5.
    for _ in range(24):
        assert reads.request("GET", path, {"Authorization": f"Bearer {agent['token']}"},
                             base_url="http://testserver").status_code == 200

    async def prepared() -> list[str]:
        async with (await async_pool()).connection() as conn:
            return [row[0] for row in await (await conn.execute("SELECT statement FROM pg_prepared_statements"))
                    .fetchall()]

    statements = reads.loop.run_until_complete(prepared())
    assert any(TASK_ROW_SQL.split("%s")[0].strip() in statement for statement in statements), statements


# --- writes ---------------------------------------------------------------------------------------


def both_write(reads: AsyncReads, method: str, path: str, *, token: str, body: bytes | None = None,
               content_type: str = "application/json", headers: dict[str, str] | None = None) -> httpx.Response:
    """A request that changes nothing (a refusal, a replay), sent to both stacks; asserts they
    agree as ``both`` does; the front's answer."""
    sent = {"Authorization": f"Bearer {token}", "Host": "testserver", **(headers or {})}
    if body is not None:
        sent["Content-Type"] = content_type
    served = reads.request(method, path, sent, base_url="http://testserver", content=body)
    assert served.status_code != 418, f"{method} {path} was not taken by the agent routes"
    django = Client().generic(method, path, data=body or b"", content_type=content_type if body is not None else None,
                              headers=sent)
    assert (served.status_code, served.content) == (django.status_code, django.content), (method, path)
    for name in (*COMPARED_HEADERS, "idempotent-replay"):
        # A 204 has no Content-Length on the front (RFC 9110 forbids one); Django adds "0".
        if name == "content-length" and (name not in django.headers or served.status_code == 204):
            continue
        assert served.headers.get(name) == django.headers.get(name), (name, method, path)
    return served


def stored_event(task_id: str, seq: int) -> Any:
    """The event as the log holds it, as the API answers it (JSONB orders a payload's keys its
    own way: compared as JSON)."""
    return json.loads(json_bytes(event_as_api_dict(Event.objects.get(task_id=task_id, seq=seq))))


def test_an_append_is_written_once_and_its_replay_answers_alike(reads: AsyncReads, agent: dict[str, Any]) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/events/"
    step = json.dumps({"type": "ReasoningStepCompleted", "payload": {"step": 9, "t": "\u2028"},
                       "idempotency_key": "front-9", "expected_seq": 6}).encode()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    written = reads.request("POST", path, sent, base_url="http://testserver", content=step)
    assert written.status_code == 201 and written.json() == stored_event(agent["task_id"], 7)
    assert written.headers["allow"] == "GET, POST, HEAD, OPTIONS" and "idempotent-replay" not in written.headers
    replay = both_write(reads, "POST", path, token=agent["token"], body=step)
    assert replay.status_code == 200 and replay.headers["idempotent-replay"] == "true"
    assert replay.json() == written.json()
    # And the other way round: written by Django's stack, replayed by the front's.
    other = json.dumps({"type": "Noted", "payload": {}, "idempotency_key": "django-1"}).encode()
    first = Client().post(path, other, content_type="application/json",
                          headers={"Authorization": sent["Authorization"]})
    assert first.status_code == 201
    assert both_write(reads, "POST", path, token=agent["token"], body=other).content == first.content
    assert Event.objects.filter(task_id=agent["task_id"]).count() == 8


def test_a_batch_is_written_once_and_its_replay_answers_alike(reads: AsyncReads, agent: dict[str, Any]) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/events/batch/"
    batch = json.dumps({"events": [{"type": "Noted", "payload": {"n": n}, "idempotency_key": f"b{n}"}
                                   for n in range(3)]}).encode()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    written = reads.request("POST", path, sent, base_url="http://testserver", content=batch)
    assert written.status_code == 201
    assert [e["seq"] for e in written.json()["results"]] == [7, 8, 9]
    assert both_write(reads, "POST", path, token=agent["token"], body=batch).json() == written.json()


def test_a_chunked_body_is_read_to_the_limit(reads: AsyncReads, agent: dict[str, Any], settings: Any) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/events/"
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    step = b'{"type": "Noted", "payload": {"chunked": true}}'
    written = reads.request("POST", path, sent, base_url="http://testserver", content=iter([step[:10], step[10:]]))
    assert written.status_code == 201 and written.json()["payload"] == {"chunked": True}
    settings.BACKPLANE_PAYLOAD_LIMIT_BYTES = 1000
    refused = reads.request("POST", path, sent, base_url="http://testserver", content=iter([b" " * 600] * 2))
    assert refused.status_code == 413
    assert refused.content == json.dumps(too_large_error(1000)).encode()
    assert Event.objects.filter(task_id=agent["task_id"]).count() == 7


@pytest.mark.parametrize(("body", "content_type", "status"), [
    (b"{", "application/json", 400),
    (b'{"type": "Noted", "type": "Noted", "payload": {}}', "application/json", 400),  # duplicate keys
    (b"[" * 70 + b"]" * 70, "application/json", 400),  # deeper than 64
    (b'{"type": "Noted", "payload": {"a": "\\u0000"}}', "application/json", 400),
    (b'{"type": "Noted", "payload": {}}', "text/plain", 415),
    (b'{"type": "Noted", "payload": {}}', "application/json; charset=latin-1", 415),
    (b'{"type": 5, "payload": {}}', "application/json", 400),
    (b'{"type": "TaskStarted", "payload": {}}', "application/json", 400),  # reserved
    (b'{"type": "Noted"}', "application/json", 400),  # no payload
    (b'{"type": "Noted", "payload": {}, "expected_seq": 2}', "application/json", 409),
    (b'{"type": "Noted", "payload": {}, "lease_epoch": 7}', "application/json", 409),
    (b'{"type": "Noted", "payload": {}, "outbox": [{"topic": "backplane.x", "payload": {}}]}',
     "application/json", 400),
    (b"", "application/json", 400),  # an empty body: every required field is missing
])
def test_a_refused_append_is_refused_alike_and_writes_nothing(reads: AsyncReads, agent: dict[str, Any],
                                                              body: bytes, content_type: str, status: int) -> None:
    answer = both_write(reads, "POST", f"/api/v1/tasks/{agent['task_id']}/events/", token=agent["token"],
                        body=body, content_type=content_type)
    assert answer.status_code == status, answer.text
    assert Event.objects.filter(task_id=agent["task_id"]).count() == 6


def test_a_body_over_the_limit_is_the_same_413(reads: AsyncReads, agent: dict[str, Any], settings: Any) -> None:
    settings.BACKPLANE_PAYLOAD_LIMIT_BYTES = 100
    answer = both_write(reads, "POST", f"/api/v1/tasks/{agent['task_id']}/events/", token=agent["token"],
                        body=b'{"type": "Noted", "payload": {"pad": "' + b"x" * 200 + b'"}}')
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize(("method", "path", "status"), [
    ("PUT", "/api/v1/tasks/{task}/events/", 405),
    ("DELETE", "/api/v1/tasks/{task}/", 405),
    ("HEAD", "/api/v1/tasks/{task}/events/batch/", 405),
    ("GET", "/api/v1/leases/", 405),
    ("OPTIONS", "/api/v1/tasks/{task}/heartbeat/", 204),
    ("POST", "/api/v1/tasks/{other}/events/", 404),
    ("POST", "/api/v1/tasks/{other}/heartbeat/", 404),
    ("POST", "/api/v1/tool-calls/nope/result/", 404),
])
def test_each_route_refuses_methods_and_strangers_alike(reads: AsyncReads, agent: dict[str, Any], method: str,
                                                       path: str, status: int) -> None:
    bodies = {"events": b'{"type": "Noted", "payload": {}}', "heartbeat": b'{"lease_epoch": 1}',
              "result": b'{"status": "succeeded", "result": {}}'}
    url = path.format(task=agent["task_id"], other=uuid.uuid4())
    body = bodies[url.rstrip("/").rsplit("/", 1)[1]] if method in ("POST", "PUT") else None
    answer = both_write(reads, method, url, token=agent["token"], body=body)
    assert answer.status_code == status, answer.text


def test_claims_heartbeats_and_tool_calls_on_the_front(reads: AsyncReads, agent: dict[str, Any]) -> None:
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return reads.request("POST", path, sent, base_url="http://testserver", content=json.dumps(body).encode())

    claim = post("/api/v1/leases/", {"kinds": ["lead-qualification"], "lease_seconds": 60})
    assert claim.status_code == 200 and claim.json()["task"]["task_id"] == agent["task_id"]
    assert both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}").status_code == 204
    epoch = claim.json()["lease_epoch"]
    task = f"/api/v1/tasks/{agent['task_id']}/"
    beat = post(f"{task}heartbeat/", {"lease_epoch": epoch})
    assert beat.status_code == 200 and beat.json()["expires_at"] > claim.json()["expires_at"]
    assert both_write(reads, "POST", f"{task}heartbeat/", token=agent["token"],
                      body=json.dumps({"lease_epoch": epoch + 1}).encode()).status_code == 409
    call = {"step": 1, "tool": "crm.lookup", "input": {"id": 7}, "lease_epoch": epoch}
    dispatched = post(f"{task}tool-calls/", call)
    assert dispatched.status_code == 201
    in_flight = both_write(reads, "POST", f"{task}tool-calls/", token=agent["token"], body=json.dumps(call).encode())
    assert in_flight.json()["status"] == "in_flight"
    key = dispatched.json()["idempotency_key"]
    outcome = {"status": "succeeded", "result": {"found": True}, "lease_epoch": epoch}
    recorded = post(f"/api/v1/tool-calls/{key}/result/", outcome)
    assert recorded.status_code == 201 and recorded.json()["replayed"] is False
    again = both_write(reads, "POST", f"/api/v1/tool-calls/{key}/result/", token=agent["token"],
                       body=json.dumps(outcome).encode())
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert [e.type for e in Event.objects.filter(task_id=agent["task_id"], seq__gt=6).order_by("seq")] == [
        "TaskClaimed", "ToolCallDispatched", "ToolCallResultReceived"]


def test_an_append_carries_the_agents_trace_with_tracing_off(reads: AsyncReads, agent: dict[str, Any]) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json",
            "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    written = reads.request("POST", f"/api/v1/tasks/{agent['task_id']}/events/", sent, base_url="http://testserver",
                            content=b'{"type": "Noted", "payload": {}}')
    assert written.status_code == 201 and written.json()["trace_id"] == trace_id


def test_each_write_is_counted_under_its_route(reads: AsyncReads, agent: dict[str, Any]) -> None:
    counted = RESPONSES.labels(status="201", view="task-events", method="POST")
    before = counted._value.get()
    reads.request("POST", f"/api/v1/tasks/{agent['task_id']}/events/",
                  {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"},
                  base_url="http://testserver", content=b'{"type": "Noted", "payload": {}}')
    assert counted._value.get() == before + 1


def test_tasks_are_created_listed_and_paged_alike(reads: AsyncReads, agent: dict[str, Any]) -> None:
    task_id = str(uuid.uuid4())
    create = json.dumps({"task_id": task_id, "kind": "lead-qualification", "input": {"lead": "b"}}).encode()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    created = reads.request("POST", "/api/v1/tasks/", sent, base_url="http://testserver", content=create)
    assert created.status_code == 201 and created.json()["task_id"] == task_id
    replay = both_write(reads, "POST", "/api/v1/tasks/", token=agent["token"], body=create)
    assert replay.status_code == 200 and replay.json() == created.json()
    taken = json.dumps({"task_id": task_id, "kind": "other", "input": {}}).encode()
    assert both_write(reads, "POST", "/api/v1/tasks/", token=agent["token"], body=taken).status_code == 409
    first = both(reads, "GET", "/api/v1/tasks/?limit=1&kind=lead-qualification", token=agent["token"])
    assert first.json()["next"].startswith("http://testserver/api/v1/tasks/?limit=1&kind=lead-qualification&cursor=")
    following = first.json()["next"].removeprefix("http://testserver")
    assert [t["task_id"] for t in both(reads, "GET", following, token=agent["token"]).json()["results"]] == [task_id]
    assert both(reads, "GET", "/api/v1/tasks/?status=nope", token=agent["token"]).status_code == 400
    assert both(reads, "GET", "/api/v1/tasks/?limit=1", token=agent["token"], scheme="https",
                host="testserver").json()["next"].startswith("https://testserver/")


def test_release_recovery_context_subtasks_and_forks_alike(reads: AsyncReads, agent: dict[str, Any]) -> None:
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}

    def post(path: str, body: dict[str, Any]) -> httpx.Response:
        return reads.request("POST", path, sent, base_url="http://testserver", content=json.dumps(body).encode())

    task = f"/api/v1/tasks/{agent['task_id']}/"
    epoch = post("/api/v1/leases/", {"kinds": ["lead-qualification"]}).json()["lease_epoch"]
    assert both(reads, "GET", f"{task}recovery-context/", token=agent["token"]).status_code == 200
    delegate = {"step": 4, "kind": "research", "input": {"company": "Acme"}, "lease_epoch": epoch}
    dispatched = post(f"{task}subtasks/", delegate)
    assert dispatched.status_code == 201
    again = both_write(reads, "POST", f"{task}subtasks/", token=agent["token"], body=json.dumps(delegate).encode())
    assert again.status_code == 200 and again.json() == dispatched.json()
    stale = json.dumps({"lease_epoch": epoch + 1}).encode()
    assert both_write(reads, "POST", f"{task}release/", token=agent["token"], body=stale).status_code == 409
    released = post(f"{task}release/", {"lease_epoch": epoch})
    assert released.status_code == 200 and released.json()["status"] == "pending"
    fork = {"at_seq": 3, "reason": "try again", "task_id": str(uuid.uuid4())}
    forked = post(f"{task}fork/", fork)
    assert forked.status_code == 201 and forked.json()["task_id"] == fork["task_id"]
    assert both_write(reads, "POST", f"{task}fork/", token=agent["token"],
                      body=json.dumps(fork).encode()).json() == forked.json()
    assert both(reads, "GET", "/api/v1/tool-calls/" + "0" * 64 + "/", token=agent["token"]).status_code == 404
    invoke = json.dumps({"task_id": agent["task_id"], "step": 1, "input": {}}).encode()
    assert both_write(reads, "POST", "/api/v1/tools/no-such-tool/invoke/", token=agent["token"],
                      body=invoke).status_code == 404


# --- which appends the event loop writes (backplane/eventlog/async_services.py) ----------------


@pytest.fixture
def on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each append the front was sent was written on the event loop (True) or handed to
    the service on a thread (False)."""
    taken: list[bool] = []
    loop_append = agent_front.event_append_batch_async

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            outcome = await loop_append(*args, **kwargs)
        except HandOff:
            taken.append(False)
            raise
        taken.append(True)
        return outcome

    monkeypatch.setattr(agent_front, "event_append_batch_async", recorded)
    return taken


@pytest.mark.parametrize(("body", "loop"), [
    ({"type": "Noted", "payload": {"step": 1}}, True),
    ({"type": "Noted", "payload": {}, "outbox": [{"topic": "crm.leads", "payload": {"id": 1}, "key": "l1"}]}, True),
    ({"type": "Noted", "payload": {}, "idempotency_key": "k-1", "expected_seq": 6, "lamport": 99}, True),
    # A completion: the breakers' follow-up finds the agent's breaker quiet (below for one that is not).
    ({"type": "TaskCompleted", "payload": {"output": {"score": 1}}}, True),
    ({"type": "TaskFailed", "payload": {"error": "no", "retryable": False}}, False),
    # A model call: priced, and no budget applies (below for one that does).
    ({"type": "LLMCalled", "payload": {"model": "gpt-4o", "provider": "openai", "prompt_sha256": "0" * 64,
                                       "output": "yes", "usage": {"input_tokens": 3, "output_tokens": 1}}},
     True),
])
def test_a_quiet_step_is_written_on_the_loop_and_any_other_append_by_the_service(
        reads: AsyncReads, agent: dict[str, Any], on_the_loop: list[bool], body: dict[str, Any], loop: bool) -> None:
    from backplane.delivery.models import OutboxMessage, WebhookSubscription
    WebhookSubscription.objects.create(name="crm", url="https://crm.example/hook", topic_pattern="crm.#",
                                       namespaces=["acme"], secret="s3cret")
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    written = reads.request("POST", f"/api/v1/tasks/{agent['task_id']}/events/", sent, base_url="http://testserver",
                            content=json.dumps(body).encode())
    assert written.status_code == 201, written.text
    assert on_the_loop == [loop]
    assert written.json() == stored_event(agent["task_id"], 7)
    task = agent_task(agent)
    assert (task.last_seq, task.head_hash) == (7, written.json()["hash"])
    # The event's own messages: the broker's row and the subscription's, naming the event's place.
    own = OutboxMessage.objects.filter(task_id=agent["task_id"], topic="crm.leads").order_by("id")
    assert [(m.subscription_id is None, m.event_position, m.headers["seq"], m.key) for m in own] == (
        [(True, written.json()["position"], 7, "l1"), (False, written.json()["position"], 7, "l1")]
        if "outbox" in body else [])
    lifecycle = OutboxMessage.objects.filter(task_id=agent["task_id"], topic__startswith="backplane.tasks.")
    assert lifecycle.filter(created_at__gte=task.updated_at).exists() == (body["type"] != "Noted" and
                                                                          body["type"] != "LLMCalled")


def agent_task(agent: dict[str, Any]) -> Any:
    from backplane.eventlog.models import Task
    return Task.objects.get(pk=agent["task_id"])


def test_a_replay_a_closed_task_and_a_refusal_are_answered_as_django_answers_them(
        reads: AsyncReads, agent: dict[str, Any], on_the_loop: list[bool]) -> None:
    path = f"/api/v1/tasks/{agent['task_id']}/events/"
    step = json.dumps({"type": "Noted", "payload": {"n": 1}, "idempotency_key": "once"}).encode()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    first = reads.request("POST", path, sent, base_url="http://testserver", content=step)
    assert first.status_code == 201 and on_the_loop == [True]
    replay = both_write(reads, "POST", path, token=agent["token"], body=step)
    assert replay.status_code == 200 and replay.json() == first.json() and on_the_loop == [True, False]
    other_body = both_write(reads, "POST", path, token=agent["token"],
                            body=json.dumps({"type": "Noted", "payload": {"n": 2}, "idempotency_key": "once"}).encode())
    assert other_body.status_code == 422 and on_the_loop[-1] is False
    stale = both_write(reads, "POST", path, token=agent["token"], body=b'{"type": "Noted", "payload": {}, '
                                                                         b'"expected_seq": 3}')
    assert stale.status_code == 409 and stale.json()["error"]["details"]["last_seq"] == 7
    services_cancel(agent)
    closed = both_write(reads, "POST", path, token=agent["token"], body=b'{"type": "Noted", "payload": {}}')
    assert closed.status_code == 409 and closed.json()["error"]["details"]["cancelled_by"] == "ops"
    assert on_the_loop[-1] is False
    assert Event.objects.filter(task_id=agent["task_id"]).count() == 8  # 6, the step, the cancellation


def test_a_heartbeat_is_written_on_the_loop_and_a_cancelled_holders_answered_by_the_service(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime

    taken: list[bool] = []
    loop_heartbeat = agent_front.leases.lease_heartbeat_async

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            task = await loop_heartbeat(*args, **kwargs)
        except HandOff:
            taken.append(False)
            raise
        taken.append(True)
        return task

    monkeypatch.setattr(agent_front.leases, "lease_heartbeat_async", recorded)
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    claim = reads.request("POST", "/api/v1/leases/", sent, base_url="http://testserver",
                          content=b'{"kinds": ["lead-qualification"], "lease_seconds": 60}').json()
    path = f"/api/v1/tasks/{agent['task_id']}/heartbeat/"
    beat = reads.request("POST", path, sent, base_url="http://testserver",
                         content=json.dumps({"lease_epoch": claim["lease_epoch"]}).encode())
    assert beat.status_code == 200 and taken == [True]
    task = agent_task(agent)
    # The row holds the deadline the answer gives, moved on from the claim's; no event was written.
    assert task.lease_expires_at == datetime.fromisoformat(beat.json()["expires_at"])
    assert beat.json()["expires_at"] > claim["expires_at"] and task.last_seq == 7  # 6, the claim
    # Refusals are the same on both stacks, and change nothing.
    wrong = both_write(reads, "POST", path, token=agent["token"],
                       body=json.dumps({"lease_epoch": claim["lease_epoch"] + 1}).encode())
    assert wrong.status_code == 409 and wrong.json()["error"]["code"] == "stale_lease"
    other = services.agent_create(name="other", namespace="acme")
    not_the_holder = both_write(reads, "POST", path, token=other.token,
                                body=json.dumps({"lease_epoch": claim["lease_epoch"]}).encode())
    assert not_the_holder.status_code == 409 and not_the_holder.json()["error"]["code"] == "stale_lease"
    assert agent_task(agent).lease_expires_at == task.lease_expires_at
    # The holder of a lease a cancellation took hears who cancelled: the service reads it from the log.
    services_cancel(agent)
    cancelled = both_write(reads, "POST", path, token=agent["token"],
                           body=json.dumps({"lease_epoch": claim["lease_epoch"]}).encode())
    assert cancelled.status_code == 409 and cancelled.json()["error"]["details"]["cancelled_by"] == "ops"
    assert taken[-1] is False


def services_cancel(agent: dict[str, Any]) -> None:
    from recovery.fleet import task_cancel
    task_cancel(namespace=None, task_id=uuid.UUID(agent["task_id"]), cancelled_by="ops", reason="wrong lead",
                compensate=False)


def test_appends_on_the_loop_and_on_threads_at_once_make_one_chain(reads: AsyncReads, agent: dict[str, Any],
                                                                   on_the_loop: list[bool]) -> None:
    """Appends to one task over many connections at once, the loop's and the service's (a
    transition among them, which the service writes): every one gets its own place, in one chain."""
    from backplane.integrity.verification import chain_check

    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    path = f"/api/v1/tasks/{agent['task_id']}/events/"

    async def append(n: int) -> httpx.Response:
        transport = httpx.ASGITransport(app=reads.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post(path, headers=sent, content=json.dumps({"type": "Noted", "payload": {"n": n}}))

    async def all_at_once() -> list[httpx.Response]:
        return list(await asyncio.gather(*(append(n) for n in range(24))))

    def by_thread(n: int) -> None:
        try:
            services.event_append(namespace="acme", task_id=uuid.UUID(agent["task_id"]), agent="reader",
                                  draft=EventDraft(type="Noted", payload={"by": "thread", "n": n}))
        finally:
            connections.close_all()  # the thread's own connection

    with ThreadPoolExecutor(max_workers=4) as threads:
        by_service = [threads.submit(by_thread, n) for n in range(8)]
        answers = reads.loop.run_until_complete(all_at_once())
        for future in by_service:
            future.result()
    assert sorted(a.status_code for a in answers) == [201] * 24 and on_the_loop.count(True) == 24
    seqs = sorted(a.json()["seq"] for a in answers)
    assert len(set(seqs)) == 24 and min(seqs) > 6
    task = agent_task(agent)
    assert task.last_seq == 6 + 24 + 8
    verified = chain_check(task=task)
    assert verified.valid and verified.checked == task.last_seq


def test_an_append_on_the_loop_is_counted_and_announced_once_it_commits(
        reads: AsyncReads, agent: dict[str, Any], on_the_loop: list[bool], monkeypatch: pytest.MonkeyPatch,
        settings: Any) -> None:
    from backplane.telemetry.counters import APPEND_DURATION, EVENTS_APPENDED
    from dashboard import live

    settings.BACKPLANE_LIVE_NOTICES = True
    notices: list[dict[str, Any]] = []
    monkeypatch.setattr(live.publisher, "publish", notices.append)
    counted = EVENTS_APPENDED.labels(type="custom")
    before, timed = counted._value.get(), APPEND_DURATION._sum.get()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}
    written = reads.request("POST", f"/api/v1/tasks/{agent['task_id']}/events/", sent, base_url="http://testserver",
                            content=b'{"type": "Noted", "payload": {}}')
    assert written.status_code == 201 and on_the_loop == [True]
    assert counted._value.get() == before + 1 and APPEND_DURATION._sum.get() > timed
    assert notices == [{"task_id": agent["task_id"], "seq": 7, "position": written.json()["position"], "type": "Noted",
                        "status": "pending", "namespace": "acme", "parent_id": None}]
    # A write the database refuses rolls back: nothing counted, nothing announced.
    refused = reads.request("POST", f"/api/v1/tasks/{agent['task_id']}/events/", sent, base_url="http://testserver",
                            content=b'{"type": "Noted", "payload": {}, "expected_seq": 1}')
    assert refused.status_code == 409 and counted._value.get() == before + 1 and len(notices) == 1


# --- claims and releases on the event loop (recovery/leases.py) ----------------------------------


def record_loop(monkeypatch: pytest.MonkeyPatch, name: str, module: Any = agent_front.leases) -> list[bool]:
    """Whether each call of ``module``'s ``name`` the front made wrote on the event loop (True)
    or handed the write to the service on a thread (False)."""
    taken: list[bool] = []
    on_the_loop = getattr(module, name)

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            outcome = await on_the_loop(*args, **kwargs)
        except HandOff:
            taken.append(False)
            raise
        taken.append(True)
        return outcome

    monkeypatch.setattr(module, name, recorded)
    return taken


def post(reads: AsyncReads, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    sent = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return reads.request("POST", path, sent, base_url="http://testserver", content=json.dumps(body).encode())


def test_a_claim_and_a_release_are_written_on_the_loop_as_the_services_write_them(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from backplane.delivery.models import OutboxMessage
    from backplane.eventlog.models import Task

    claims, releases = record_loop(monkeypatch, "lease_claim_async"), record_loop(monkeypatch, "lease_release_async")
    claimed = post(reads, agent["token"], "/api/v1/leases/", {"kinds": ["lead-qualification"], "lease_seconds": 60})
    assert claimed.status_code == 200 and claims == [True]
    task = agent_task(agent)
    assert claimed.json() == json.loads(json_bytes({
        "task": task_as_api_dict(task), "lease_epoch": 1, "expires_at": claimed.json()["expires_at"],
        "recovered": False}))
    assert (task.status, task.lease_holder, task.lease_epoch, task.last_seq) == ("running", "reader", 1, 7)
    event = Event.objects.get(task_id=agent["task_id"], seq=7)
    assert (event.type, event.agent, event.payload["attempt"], event.payload["lease_seconds"]) == (
        "TaskClaimed", "reader", 1, 60)
    assert task.lease_expires_at.isoformat() == event.payload["expires_at"]
    # Nothing else pending: 204 on both stacks; kinds the agent may not claim: 400 on both.
    assert both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}").status_code == 204
    researcher = services.agent_create(name="researcher", namespace="acme", kinds=["research"])
    refused = both_write(reads, "POST", "/api/v1/leases/", token=researcher.token,
                         body=b'{"kinds": ["lead-qualification"]}')
    assert refused.status_code == 400 and refused.json()["error"]["details"]["kinds"] == "allowed: ['research']"
    released = post(reads, agent["token"], f"/api/v1/tasks/{agent['task_id']}/release/", {"lease_epoch": 1})
    assert released.status_code == 200 and releases == [True]
    assert released.json() == json.loads(json_bytes(task_as_api_dict(agent_task(agent))))
    assert released.json()["status"] == "pending" and released.json()["attempts"] == 0
    # Pending again is announced (a claim's running is not), as the service announces it.
    announced = OutboxMessage.objects.get(task_id=agent["task_id"], topic="backplane.tasks.lead-qualification",
                                          headers__seq=8)
    assert (announced.payload["status"], announced.payload["previous_status"]) == ("pending", "running")
    # Claimed again after a release: the log is read for a reviewer's requeue; no recovery.
    again = post(reads, agent["token"], "/api/v1/leases/", {})
    assert again.status_code == 200 and again.json()["lease_epoch"] == 2 and again.json()["recovered"] is False
    # A claimed task that a failure sent back to pending is a recovery, on the loop as well.
    services.event_append(namespace="acme", task_id=uuid.UUID(agent["task_id"]), agent="reader", lease_epoch=2,
                          draft=EventDraft(type="TaskFailed", payload={"error": "flaky", "retryable": True}))
    recovered = post(reads, agent["token"], "/api/v1/leases/", {})
    assert recovered.status_code == 200 and recovered.json()["recovered"] is True and claims[-1] is True
    assert Task.objects.get(pk=agent["task_id"]).attempts == 1


def test_a_sub_tasks_first_claim_on_the_loop_tells_its_parent(reads: AsyncReads, agent: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from recovery.subtasks import subtask_dispatch

    claims = record_loop(monkeypatch, "lease_claim_async")
    epoch = post(reads, agent["token"], "/api/v1/leases/", {"kinds": ["lead-qualification"]}).json()["lease_epoch"]
    child = subtask_dispatch(namespace="acme", parent_task_id=uuid.UUID(agent["task_id"]), step=3, kind="research",
                             input={"company": "Acme"}, agent="reader", lease_epoch=epoch).child
    worker = services.agent_create(name="researcher", namespace="acme", kinds=["research"])
    claimed = post(reads, worker.token, "/api/v1/leases/", {})
    assert claimed.status_code == 200 and claimed.json()["task"]["task_id"] == str(child.pk)
    assert claims == [True, True]
    accepted = Event.objects.filter(task_id=agent["task_id"]).order_by("-seq").first()
    assert accepted is not None and accepted.type == "SubAgentAccepted"
    assert accepted.payload == {"child_task_id": str(child.pk), "dispatch_key": child.dispatch_key,
                                "agent": "researcher"}


def test_spent_budgets_open_breakers_and_pauses_are_decided_as_the_service_decides_them(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from decimal import Decimal

    from django.utils import timezone

    from backplane.eventlog.models import Agent
    from recovery import budgets
    from recovery.fleet import pause_lift, pause_set
    from recovery.models import Budget
    from recovery.selectors import period_of

    claims = record_loop(monkeypatch, "lease_claim_async")
    today = timezone.now().date()
    # Paused work is passed over on the loop: nothing to claim, and nothing handed off.
    pause = pause_set(namespace="acme", kind="lead-qualification", paused_by="ops", reason="a fix goes out")
    assert both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}").status_code == 204
    assert claims == [True]
    pause_lift(pause_id=pause.pk, resumed_by="ops", reason="fixed")
    # So is the tree of a spent task budget.
    tree = budgets.budget_set(scope="task", key=agent["task_id"], period="task", unit="tokens", limit=Decimal(10),
                              decided_by="ops", reason="cap")
    Budget.objects.filter(pk=tree.pk).update(exceeded_on=period_of(tree, timezone.now()))
    assert both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}").status_code == 204
    assert claims[-1:] == [True]
    Budget.objects.filter(pk=tree.pk).update(exceeded_on=None)
    # A spent namespace budget is the service's 409, which reads the spend; nothing is taken.
    spent = budgets.budget_set(scope="namespace", key="acme", period="day", unit="tokens", limit=Decimal(10),
                               decided_by="ops", reason="cap")
    Budget.objects.filter(pk=spent.pk).update(exceeded_on=today)
    refused = both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "budget_exceeded"
    assert claims[-1:] == [False]
    Budget.objects.filter(pk=spent.pk).update(exceeded_on=None)
    # An open breaker is the service's too (its refusal, or the half-open trial it takes).
    Agent.objects.filter(name="reader").update(breaker_state="open", breaker_opened_at=timezone.now())
    opened = both_write(reads, "POST", "/api/v1/leases/", token=agent["token"], body=b"{}")
    assert opened.status_code == 503 and claims[-1:] == [False]
    assert agent_task(agent).status == "pending" and agent_task(agent).last_seq == 6


def test_claims_on_the_loop_and_on_threads_at_once_never_win_one_task_twice(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty claimers at once over separate connections, sixteen on the loop's pool and four by
    the service on threads, for eleven pending tasks: each task is won once, the rest hear 204."""
    from backplane.eventlog.models import Agent, Task
    from recovery.leases import lease_claim

    claims = record_loop(monkeypatch, "lease_claim_async")
    for n in range(10):
        services.task_create(namespace="acme", kind="lead-qualification", agent="reader", input={"n": n})
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}

    async def claim() -> httpx.Response:
        transport = httpx.ASGITransport(app=reads.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/api/v1/leases/", headers=sent, content=b"{}")

    async def all_at_once() -> list[httpx.Response]:
        return list(await asyncio.gather(*(claim() for _ in range(16))))

    def by_thread() -> str | None:
        try:
            won = lease_claim(agent=Agent.objects.get(name="reader"), kinds=None, lease_seconds=30)
            return None if won is None else str(won.task.pk)
        finally:
            connections.close_all()  # the thread's own connection

    with ThreadPoolExecutor(max_workers=4) as threads:
        by_service = [threads.submit(by_thread) for _ in range(4)]
        answers = reads.loop.run_until_complete(all_at_once())
        won_by_service = [future.result() for future in by_service]
    assert claims.count(True) == 16  # none handed off
    won = [a.json()["task"]["task_id"] for a in answers if a.status_code == 200] + [
        task for task in won_by_service if task is not None]
    assert len(won) == 11 and len(set(won)) == 11
    assert all(a.status_code in (200, 204) for a in answers)
    assert Task.objects.filter(namespace="acme", status="running", lease_epoch=1).count() == 11
    assert Event.objects.filter(type="TaskClaimed").count() == 11


def test_a_task_is_created_on_the_loop_as_the_service_creates_it(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from backplane.delivery.models import OutboxMessage
    from backplane.eventlog.models import Task

    creates = record_loop(monkeypatch, "task_create_async", agent_front)
    body = {"task_id": str(uuid.uuid4()), "kind": "research", "input": {"company": "Acme", "n": 2 ** 70},
            "metadata": {"source": "crm"}, "max_attempts": 5, "parent_task_id": agent["task_id"]}
    created = post(reads, agent["token"], "/api/v1/tasks/", body)
    assert created.status_code == 201 and creates == [True], created.text
    task = Task.objects.get(pk=body["task_id"])
    assert created.json() == json.loads(json_bytes(task_as_api_dict(task)))
    assert (task.namespace, task.kind, task.input, task.metadata, task.max_attempts, str(task.parent_id),
            task.created_by, task.status, task.last_seq) == (
        "acme", "research", body["input"], {"source": "crm"}, 5, agent["task_id"], "reader", "pending", 1)
    started = Event.objects.get(task_id=task.pk, seq=1)
    assert (started.type, started.agent, started.payload) == ("TaskStarted", "reader", {
        "kind": "research", "input": body["input"], "parent_task_id": agent["task_id"], "max_attempts": 5,
        "metadata": {"source": "crm"}})
    # A new task is announced, as the service announces one: no status before it.
    announced = OutboxMessage.objects.get(task_id=task.pk, topic="backplane.tasks.research")
    assert (announced.payload["status"], announced.payload["previous_status"], announced.headers["seq"]) == (
        "pending", None, 1)
    # The same id again: the service's replay (200, the header) or its 409, answered alike.
    replay = both_write(reads, "POST", "/api/v1/tasks/", token=agent["token"], body=json.dumps(body).encode())
    assert replay.status_code == 200 and replay.json() == created.json() and creates[-1:] == [False]
    taken = both_write(reads, "POST", "/api/v1/tasks/", token=agent["token"],
                       body=json.dumps({**body, "input": {"company": "Other"}}).encode())
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "task_exists"
    # A parent that is no task of the namespace, and a kind the token does not name: refused alike.
    orphan = json.dumps({"kind": "research", "input": {}, "parent_task_id": str(uuid.uuid4())}).encode()
    assert both_write(reads, "POST", "/api/v1/tasks/", token=agent["token"], body=orphan).status_code == 400
    narrow = services.agent_create(name="narrow", namespace="acme", kinds=["research"])
    other_kind = json.dumps({"kind": "billing", "input": {}}).encode()
    assert both_write(reads, "POST", "/api/v1/tasks/", token=narrow.token, body=other_kind).status_code == 403
    # (refusals made on the loop are not handed off: nothing is recorded for them)
    assert Task.objects.filter(namespace="acme").count() == 2 and creates == [True, False, False]
    # Of another kind under a parent of its own kind: the service reads the parent's kind.
    own = post(reads, narrow.token, "/api/v1/tasks/", {"kind": "research", "input": {}}).json()["task_id"]
    sub = post(reads, narrow.token, "/api/v1/tasks/", {"kind": "billing", "input": {}, "parent_task_id": own})
    assert sub.status_code == 201 and creates[-2:] == [True, False]


def test_one_id_created_at_once_on_the_loop_and_on_threads_is_one_task(reads: AsyncReads,
                                                                       agent: dict[str, Any]) -> None:
    """Ten creates of one task id at once over separate connections, eight on the loop's pool and
    two by the service on threads: one task with one first event; every other create is its replay."""
    from backplane.eventlog.models import Task

    task_id = uuid.uuid4()
    body = json.dumps({"task_id": str(task_id), "kind": "research", "input": {"company": "Acme"}}).encode()
    sent = {"Authorization": f"Bearer {agent['token']}", "Content-Type": "application/json"}

    async def create() -> httpx.Response:
        transport = httpx.ASGITransport(app=reads.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.post("/api/v1/tasks/", headers=sent, content=body)

    async def all_at_once() -> list[httpx.Response]:
        return list(await asyncio.gather(*(create() for _ in range(8))))

    def by_thread() -> bool:
        try:
            return services.task_create(namespace="acme", kind="research", input={"company": "Acme"}, agent="reader",
                                        task_id=task_id).created
        finally:
            connections.close_all()  # the thread's own connection

    with ThreadPoolExecutor(max_workers=2) as threads:
        by_service = [threads.submit(by_thread) for _ in range(2)]
        answers = reads.loop.run_until_complete(all_at_once())
        created_by_service = [future.result() for future in by_service]
    statuses = sorted(a.status_code for a in answers)
    assert statuses.count(201) + created_by_service.count(True) == 1
    assert statuses.count(200) + created_by_service.count(False) == 9 and set(statuses) <= {200, 201}
    assert Task.objects.filter(pk=task_id).count() == 1
    assert list(Event.objects.filter(task_id=task_id).values_list("type", flat=True)) == ["TaskStarted"]


def test_a_new_tool_call_and_its_answer_are_written_on_the_loop_as_the_services_write_them(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from recovery import tool_calls
    from recovery.models import ToolCall

    dispatches = record_loop(monkeypatch, "tool_call_dispatch_async", agent_front.tool_calls)
    answers = record_loop(monkeypatch, "tool_call_record_result_async", agent_front.tool_calls)
    task = f"/api/v1/tasks/{agent['task_id']}/"
    epoch = post(reads, agent["token"], "/api/v1/leases/", {}).json()["lease_epoch"]
    call = {"step": 3, "tool": "crm.update", "input": {"lead": 8812, "n": 2 ** 70}, "lease_epoch": epoch,
            "compensation": {"tool": "crm.revert", "input": {"lead": 8812}}}
    dispatched = post(reads, agent["token"], f"{task}tool-calls/", call)
    assert dispatched.status_code == 201 and dispatches == [True], dispatched.text
    key = dispatched.json()["idempotency_key"]
    assert key == tool_calls.tool_call_key(task_id=uuid.UUID(agent["task_id"]), step=3, tool="crm.update")
    record = ToolCall.objects.get(pk=key)
    assert (record.effect_key, record.input, record.compensation, record.status, record.dispatched_by) == (
        key, call["input"], call["compensation"], "dispatched", "reader")
    event = Event.objects.get(task_id=agent["task_id"], seq=8)  # 6, the claim, the dispatch
    assert (event.type, event.payload) == ("ToolCallDispatched", {
        "idempotency_key": key, "step": 3, "tool": "crm.update", "input": call["input"],
        "compensation": call["compensation"]})
    # The same call again is the service's replay; another input its 422: alike on both stacks.
    replay = both_write(reads, "POST", f"{task}tool-calls/", token=agent["token"], body=json.dumps(call).encode())
    assert replay.status_code == 200 and replay.json()["status"] == "in_flight" and dispatches[-1:] == [False]
    other = json.dumps({**call, "input": {"lead": 1}}).encode()
    assert both_write(reads, "POST", f"{task}tool-calls/", token=agent["token"], body=other).status_code == 422
    # The record reads alike on both stacks, on the loop for an agent.
    read = both(reads, "GET", f"/api/v1/tool-calls/{key}/", token=agent["token"])
    assert read.status_code == 200 and read.json()["status"] == "in_flight"
    answer = {"status": "succeeded", "result": {"ok": True}, "lease_epoch": epoch}
    answered = post(reads, agent["token"], f"/api/v1/tool-calls/{key}/result/", answer)
    assert answered.status_code == 201 and answers == [True], answered.text
    record = ToolCall.objects.get(pk=key)
    assert (record.status, record.result, record.completed_at is not None) == ("succeeded", {"ok": True}, True)
    assert answered.json() == json.loads(json_bytes({**agent_front.tool_call_as_api_dict(record), "replayed": False}))
    received = Event.objects.get(task_id=agent["task_id"], seq=9)
    assert (received.type, received.payload) == ("ToolCallResultReceived", {
        "idempotency_key": key, "step": 3, "tool": "crm.update", "status": "succeeded", "result": {"ok": True}})
    again = both_write(reads, "POST", f"/api/v1/tool-calls/{key}/result/", token=agent["token"],
                       body=json.dumps(answer).encode())
    assert again.status_code == 200 and again.headers["idempotent-replay"] == "true" and answers[-1:] == [False]
    differently = json.dumps({**answer, "status": "failed"}).encode()
    assert both_write(reads, "POST", f"/api/v1/tool-calls/{key}/result/", token=agent["token"],
                      body=differently).status_code == 422
    assert both(reads, "GET", "/api/v1/tool-calls/" + "0" * 64 + "/", token=agent["token"]).status_code == 404
    # A paid tool's answer is the service's (budgets hear of what it costs).
    paid = post(reads, agent["token"], f"{task}tool-calls/", {"step": 4, "tool": "search", "input": {},
                                                               "lease_epoch": epoch}).json()["idempotency_key"]
    cost = {"status": "succeeded", "result": {}, "lease_epoch": epoch, "cost": {"amount": "0.01", "currency": "USD"}}
    assert post(reads, agent["token"], f"/api/v1/tool-calls/{paid}/result/", cost).status_code == 201
    assert answers[-1:] == [False] and Event.objects.filter(task_id=agent["task_id"]).count() == 11


def test_a_policy_that_lets_a_call_through_is_decided_on_the_loop_and_one_that_asks_by_the_service(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from django.contrib.auth.models import Group

    from backplane.delivery.models import OutboxMessage
    from recovery import approvals
    from recovery.models import ApprovalRequest, ToolCall
    from tests.support.roles import staff_user

    Group.objects.get_or_create(name="Approvers")
    for namespace, condition in (("", "amount > 1000"), ("acme", "amount > 100")):
        approvals.tool_policy_set(tool="pay", namespace=namespace, condition=condition,
                                  field_types={"amount": "number"}, approver_group="Approvers", set_by="user:o",
                                  reason="rule")
    approvals.tool_policy_set(tool="refund", condition="", approver_group="Approvers", set_by="user:o",
                              reason="always", enabled=False)
    dispatches = record_loop(monkeypatch, "tool_call_dispatch_async", agent_front.tool_calls)
    task = f"/api/v1/tasks/{agent['task_id']}/tool-calls/"
    epoch = post(reads, agent["token"], "/api/v1/leases/", {}).json()["lease_epoch"]

    def dispatch(step: int, tool: str, input: dict[str, Any]) -> httpx.Response:
        return post(reads, agent["token"], task, {"step": step, "tool": tool, "input": input, "lease_epoch": epoch})

    # The namespace's policy is the one in force (100, not the global 1000); a disabled one asks nothing.
    assert dispatch(1, "pay", {"amount": 50}).status_code == 201 and dispatches == [True]
    assert dispatch(2, "refund", {"amount": 5000}).status_code == 201 and dispatches[-1:] == [True]
    # A call the policy asks about: the request and its event are written on the loop, answered 202
    # as the service answers (ApprovalPending is no hand-off: nothing more is recorded of it).
    asked = dispatch(3, "pay", {"amount": 500})
    assert asked.status_code == 202 and dispatches[-1:] == [True], asked.text
    request = ApprovalRequest.objects.get(pk=asked.json()["approval_id"])
    assert (request.step, request.tool, request.input, request.reason, request.requested_by, request.status) == (
        3, "pay", {"amount": 500}, "", "reader", "pending")
    requested = Event.objects.filter(task_id=agent["task_id"], type="ApprovalRequested").get()
    assert requested.payload["approval_id"] == str(request.pk) and requested.payload["policy_version"] == 1
    assert requested.payload["asked_because"] and requested.payload["group"] == "Approvers"
    assert OutboxMessage.objects.filter(topic="backplane.approvals").count() == 1
    # A field the condition cannot decide (missing) asks, as the service would.
    assert dispatch(4, "pay", {"currency": "EUR"}).status_code == 202 and dispatches[-1:] == [True]
    # The same call again finds its request: the service's answer, on the loop's hand-off.
    again = dispatch(3, "pay", {"amount": 500})
    assert again.json() == asked.json() and dispatches[-1:] == [False]
    assert ApprovalRequest.objects.count() == 2 and ToolCall.objects.count() == 2
    # Granted, the call is made on the loop under its approval; then replays are the service's.
    approvals.approval_decide(approval_id=request.pk, user=staff_user("ana", "Approvers"), verdict="approve",
                              reason="ok")
    made = dispatch(3, "pay", {"amount": 500})
    assert made.status_code == 201 and dispatches[-1:] == [True]
    made_event = Event.objects.get(task_id=agent["task_id"], type="ToolCallDispatched", payload__step=3)
    assert made_event.payload["approval_id"] == str(request.pk)
    assert dispatch(3, "pay", {"amount": 500}).status_code == 200 and dispatches[-1:] == [False]
    # Other arguments for an approved step: the service's 422.
    assert dispatch(3, "pay", {"amount": 501}).status_code == 422


def test_a_dispatch_a_spent_budget_refuses_is_the_services_409(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from decimal import Decimal

    from django.utils import timezone

    from recovery import budgets
    from recovery.models import Budget, ToolCall
    from recovery.selectors import period_of

    dispatches = record_loop(monkeypatch, "tool_call_dispatch_async", agent_front.tool_calls)
    tree = budgets.budget_set(scope="task", key=agent["task_id"], period="task", unit="tokens", limit=Decimal(10),
                              decided_by="ops", reason="cap")
    Budget.objects.filter(pk=tree.pk).update(exceeded_on=period_of(tree, timezone.now()))
    body = json.dumps({"step": 1, "tool": "search", "input": {}}).encode()
    refused = both_write(reads, "POST", f"/api/v1/tasks/{agent['task_id']}/tool-calls/", token=agent["token"],
                         body=body)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "budget_exceeded"
    assert dispatches == [False]
    assert not ToolCall.objects.exists() and agent_task(agent).last_seq == 6


def test_a_new_sub_task_is_handed_off_on_the_loop_as_the_service_hands_it_off(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from backplane.delivery.models import OutboxMessage
    from backplane.eventlog.models import Task

    dispatches = record_loop(monkeypatch, "subtask_dispatch_async", agent_front.subtasks)
    path = f"/api/v1/tasks/{agent['task_id']}/subtasks/"
    epoch = post(reads, agent["token"], "/api/v1/leases/", {}).json()["lease_epoch"]
    delegate = {"step": 4, "kind": "research", "input": {"company": "Acme"}, "lease_epoch": epoch}
    dispatched = post(reads, agent["token"], path, delegate)
    assert dispatched.status_code == 201 and dispatches == [True], dispatched.text
    child = Task.objects.get(pk=dispatched.json()["task"]["task_id"])
    assert dispatched.json() == json.loads(json_bytes({"task": task_as_api_dict(child),
                                                       "dispatch_key": child.dispatch_key}))
    assert (str(child.parent_id), child.kind, child.input, child.metadata, child.created_by, child.last_seq) == (
        agent["task_id"], "research", {"company": "Acme"}, {"dispatch_key": child.dispatch_key, "step": 4}, "reader",
        1)
    assert Event.objects.get(task_id=child.pk, seq=1).payload["parent_task_id"] == agent["task_id"]
    handed = Event.objects.get(task_id=agent["task_id"], seq=8)  # 6, the claim, the hand-off
    assert (handed.type, handed.payload) == ("SubAgentDispatched", {
        "child_task_id": str(child.pk), "dispatch_key": child.dispatch_key, "step": 4, "kind": "research",
        "input": {"company": "Acme"}})
    assert OutboxMessage.objects.get(task_id=child.pk).payload["status"] == "pending"
    # Again: the service's replay; another input: its 422; a closed parent: its 409 — alike on both.
    again = both_write(reads, "POST", path, token=agent["token"], body=json.dumps(delegate).encode())
    assert again.status_code == 200 and again.json() == dispatched.json() and dispatches[-1:] == [False]
    other = json.dumps({**delegate, "input": {"company": "Other"}}).encode()
    assert both_write(reads, "POST", path, token=agent["token"], body=other).status_code == 422
    services_cancel(agent)
    late = json.dumps({**delegate, "step": 5}).encode()
    closed = both_write(reads, "POST", path, token=agent["token"], body=late)
    assert closed.status_code == 409 and dispatches[-1:] == [False]
    assert Task.objects.filter(parent_id=agent["task_id"]).count() == 1


def test_a_fork_is_made_on_the_loop_as_the_service_makes_it(reads: AsyncReads, agent: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from backplane.delivery.models import OutboxMessage
    from backplane.eventlog.models import Task

    made = record_loop(monkeypatch, "task_fork_async", agent_front.forks)
    path = f"/api/v1/tasks/{agent['task_id']}/fork/"
    fork_id = str(uuid.uuid4())
    fork = {"at_seq": 3, "reason": "try again", "task_id": fork_id, "input": {"lead": "b"}}
    forked = post(reads, agent["token"], path, fork)
    assert forked.status_code == 201 and made == [True], forked.text
    task = Task.objects.get(pk=fork_id)
    assert forked.json() == json.loads(json_bytes(task_as_api_dict(task)))
    assert (str(task.forked_from_id), task.forked_at_seq, task.sandbox, task.input, task.kind, task.created_by) == (
        agent["task_id"], 3, False, {"lead": "b"}, "lead-qualification", "reader")
    source_event = Event.objects.get(task_id=agent["task_id"], seq=3)
    started, forked_event = Event.objects.filter(task_id=task.pk).order_by("seq")
    assert (started.type, forked_event.type) == ("TaskStarted", "TaskForked")
    assert forked_event.payload == {
        "source_task_id": agent["task_id"], "at_seq": 3, "source_hash": source_event.hash,
        "source_type": source_event.type, "reason": "try again", "forked_by": "reader", "by_staff": False,
        "sandbox": False, "input_replaced": True, "tool_answers": []}
    assert OutboxMessage.objects.get(task_id=task.pk).headers["seq"] == 2
    # The same fork again: the service's replay; refusals alike on both stacks, nothing written.
    again = both_write(reads, "POST", path, token=agent["token"], body=json.dumps(fork).encode())
    assert again.status_code == 200 and again.json() == forked.json() and made[-1:] == [False]
    for body, status in [({"at_seq": 99, "reason": "r"}, 400), ({"at_seq": 0, "reason": "r"}, 400),
                         ({"at_seq": 2, "reason": "r", "tool_answers": [
                             {"step": 1, "tool": "t", "status": "succeeded", "result": {}}]}, 400)]:
        refused = both_write(reads, "POST", path, token=agent["token"], body=json.dumps(body).encode())
        assert refused.status_code == status, refused.text
    unknown = both_write(reads, "POST", f"/api/v1/tasks/{uuid.uuid4()}/fork/", token=agent["token"],
                         body=b'{"at_seq": 1, "reason": "r"}')
    assert unknown.status_code == 404
    # A sandbox with an edited answer, on the loop too: a replay's task sends no lifecycle message.
    sandbox = post(reads, agent["token"], path, {"at_seq": 2, "reason": "replay", "sandbox": True, "tool_answers": [
        {"step": 1, "tool": "crm.update", "status": "failed", "result": {"error": "down"}}]})
    assert sandbox.status_code == 201 and made[-1:] == [True] and sandbox.json()["sandbox"] is True
    assert not OutboxMessage.objects.filter(task_id=sandbox.json()["task_id"]).exists()
    assert Task.objects.filter(forked_from_id=agent["task_id"]).count() == 2


def test_the_task_list_is_read_on_the_loop_unless_a_replica_may_serve_it(
        reads: AsyncReads, agent: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    on_the_loop: list[bool] = []
    filters = agent_front.task_list_filters

    def recorded(*args: Any, **kwargs: Any) -> Any:
        on_the_loop.append(True)
        return filters(*args, **kwargs)

    monkeypatch.setattr(agent_front, "task_list_filters", recorded)
    for n in range(3):
        services.task_create(namespace="acme", kind="research", agent="reader", input={"n": n})
    services.task_create(namespace="other", kind="research", agent="reader", input={})
    seen: list[str] = []
    path: str | None = "/api/v1/tasks/?limit=2&kind=research"
    while path is not None:
        page = both(reads, "GET", path, token=agent["token"])  # the loop's answer, and Django's alike
        seen += [task["task_id"] for task in page.json()["results"]]
        following = page.json()["next"]
        path = following.removeprefix("http://testserver") if following else None
    assert len(seen) == 3 == len(set(seen)) and on_the_loop == [True, True]
    assert both(reads, "GET", "/api/v1/tasks/?cursor=abc", token=agent["token"]).status_code == 400
    # With a replica configured the list is Django's (replica_reads), answered alike.
    monkeypatch.setattr(agent_front, "replica_configured", lambda: True)
    assert len(both(reads, "GET", "/api/v1/tasks/", token=agent["token"]).json()["results"]) == 4
    assert on_the_loop == [True, True, True]  # the 400's; the replica's list was not read here


def test_a_completion_is_written_on_the_loop_when_no_follow_up_has_work_to_do(
        reads: AsyncReads, agent: dict[str, Any], on_the_loop: list[bool]) -> None:
    from backplane.delivery.models import OutboxMessage
    from backplane.eventlog.models import Agent, Task
    from recovery.subtasks import subtask_dispatch

    def complete(task_id: str, token: str) -> httpx.Response:
        return post(reads, token, f"/api/v1/tasks/{task_id}/events/",
                    {"type": "TaskCompleted", "payload": {"output": {"score": 1}}})

    assert complete(agent["task_id"], agent["token"]).status_code == 201 and on_the_loop == [True]
    task = agent_task(agent)
    assert (task.status, task.output) == ("completed", {"score": 1})
    announced = OutboxMessage.objects.get(task_id=task.pk, headers__seq=7)
    assert (announced.payload["status"], announced.payload["previous_status"]) == ("completed", "pending")
    # A failure counted against the agent: the service's breakers reset the count.
    second = services.task_create(namespace="acme", kind="lead-qualification", agent="reader", input={}).task
    Agent.objects.filter(name="reader").update(consecutive_failures=2)
    assert complete(str(second.pk), agent["token"]).status_code == 201 and on_the_loop[-1:] == [False]
    assert Agent.objects.get(name="reader").consecutive_failures == 0
    # A sub-task's: its parent hears of it (the service's report), in the same commit.
    parent = services.task_create(namespace="acme", kind="lead-qualification", agent="reader", input={}).task
    child = subtask_dispatch(namespace="acme", parent_task_id=parent.pk, step=1, kind="research", input={},
                             agent="reader", lease_epoch=None).child
    assert complete(str(child.pk), agent["token"]).status_code == 201 and on_the_loop[-1:] == [False]
    assert Task.objects.get(pk=parent.pk).last_seq == 3  # started, dispatched, the child's result


def test_a_model_call_is_priced_and_written_on_the_loop_when_no_budget_applies(
        reads: AsyncReads, agent: dict[str, Any], on_the_loop: list[bool]) -> None:
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from backplane.eventlog.models import CostRollup, ModelPrice
    from recovery import budgets

    for token_type, per_million in (("input", "2"), ("output", "10")):
        ModelPrice.objects.create(provider="acme-ai", model="m-1", token_type=token_type, version="v1",
                                  per_million=Decimal(per_million), currency="USD",
                                  valid_from=timezone.now() - timedelta(days=1))
    path = f"/api/v1/tasks/{agent['task_id']}/events/"
    payload: dict[str, Any] = {"step": 1, "model": "m-1", "provider": "acme-ai", "prompt_sha256": "0" * 64,
                               "output": "yes", "usage": {"input_tokens": 1_000_000, "output_tokens": 100_000}}
    model_call = {"type": "LLMCalled", "payload": payload}
    written = post(reads, agent["token"], path, model_call)
    assert written.status_code == 201 and on_the_loop == [True], written.text
    assert written.json()["payload"]["cost"] == {"amount": "3", "currency": "USD", "source": "price_table",
                                                 "price_version": "v1"}
    assert written.json() == stored_event(agent["task_id"], 7)
    task_rollup = CostRollup.objects.get(scope="task", key=agent["task_id"])
    assert (task_rollup.calls, task_rollup.input_tokens, task_rollup.cost) == (1, 1_000_000, Decimal(3))
    # A budget of the namespace applies: the service's follow-up notes the spending.
    budgets.budget_set(scope="namespace", key="acme", period="day", unit="currency", currency="USD",
                       limit=Decimal(4), decided_by="ops", reason="cap")
    again = post(reads, agent["token"], path, {"type": "LLMCalled", "payload": {**payload, "step": 2}})
    assert again.status_code == 201 and on_the_loop[-1:] == [False]
    # 6 of 4 USD: the lines it crossed, written by the service's follow-up into the task's log.
    assert Event.objects.filter(task_id=agent["task_id"], type__startswith="Budget").count() >= 1
    assert CostRollup.objects.get(scope="task", key=agent["task_id"]).calls == 2
