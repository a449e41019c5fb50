"""Hostile input on every write route (docs/api.md, Conventions, issue 14).

Every case answers in the contract's error shape with its status and changes nothing (row
counts of tasks, events, outbox and tool calls). What only a real server can show (chunked
and truncated bodies on the wire) goes through the product's web process, uvicorn and all.
"""

from __future__ import annotations

import copy
import io
import json
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from rest_framework.test import APIClient

from api.parsers import MAX_DEPTH, InvalidJSON, loads_strict
from backplane.eventlog import services
from tests.api.conftest import AgentClient, assert_error, claim, create_task, row_counts
from tests.support.live_server import WebProcess

Counts = Callable[[], dict[str, int]]
LONG = "x" * 200_000  # under the 256 KiB body limit, over every string field's own

# name, path, a valid body, the fields a client can set (dotted and indexed into nested ones)
WRITE_ROUTES: list[tuple[str, str, dict[str, Any], list[str]]] = [
    ("tasks_create", "/api/v1/tasks/", {"kind": "k", "input": {}, "metadata": {}},
     ["kind", "input", "task_id", "parent_task_id", "max_attempts", "metadata"]),
    ("events_append", "/api/v1/tasks/{task}/events/",
     {"type": "Noted", "payload": {}, "outbox": [{"topic": "t", "payload": {}, "key": "k"}]},
     ["type", "payload", "expected_seq", "idempotency_key", "lease_epoch", "lamport", "causation_id",
      "correlation_id", "trace_id", "outbox", "outbox[0].topic", "outbox[0].payload", "outbox[0].key"]),
    ("events_batch", "/api/v1/tasks/{task}/events/batch/",
     {"events": [{"type": "Noted", "payload": {}, "outbox": [{"topic": "t", "payload": {}}]}]},
     ["expected_seq", "lease_epoch", "events", "events[0].type", "events[0].payload", "events[0].idempotency_key",
      "events[0].lamport", "events[0].trace_id", "events[0].outbox", "events[0].outbox[0].topic"]),
    ("leases_claim", "/api/v1/leases/", {"kinds": ["k"], "lease_seconds": 30}, ["kinds", "kinds[0]", "lease_seconds"]),
    ("heartbeat", "/api/v1/tasks/{task}/heartbeat/", {"lease_epoch": 1}, ["lease_epoch"]),
    ("release", "/api/v1/tasks/{task}/release/", {"lease_epoch": 1}, ["lease_epoch"]),
    ("tool_calls_dispatch", "/api/v1/tasks/{task}/tool-calls/",
     {"step": 5, "tool": "crm", "input": {}, "compensation": {"tool": "undo", "input": {}}},
     ["step", "tool", "input", "lease_epoch", "compensation", "compensation.tool", "compensation.input"]),
    ("tool_calls_result", "/api/v1/tool-calls/{key}/result/", {"status": "succeeded", "result": {}},
     ["status", "result", "lease_epoch"]),
    ("subtasks", "/api/v1/tasks/{task}/subtasks/", {"step": 5, "kind": "k", "input": {}},
     ["step", "kind", "input", "lease_epoch"]),
    ("tools_invoke", "/api/v1/tools/crm/invoke/", {"task_id": "{task}", "step": 5, "input": {}},
     ["task_id", "step", "input", "lease_epoch"]),
    ("dead_letters_requeue", "/api/v1/dead-letters/999999/requeue/", {"reason": "r", "payload": {}},
     ["reason", "payload"]),
    ("dead_letters_discard", "/api/v1/dead-letters/999999/discard/", {"reason": "r", "compensate": False},
     ["reason", "compensate"]),
]
ROUTE_IDS = [name for name, *_ in WRITE_ROUTES]


def with_field(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``body`` with the field at ``path`` (``outbox[0].topic``) set to ``value``."""
    body = copy.deepcopy(body)
    steps: list[str | int] = [int(p) if p.isdigit() else p for p in re.findall(r"[^.\[\]]+", path)]
    holder: Any = body
    for step, after in zip(steps, steps[1:], strict=False):
        if isinstance(holder, dict) and step not in holder:
            holder[step] = [{}] if isinstance(after, int) else {}
        holder = holder[step]
    holder[steps[-1]] = value
    return body


def raw_with_extra(body: dict[str, Any], extra: str) -> bytes:
    """The body's JSON with one more member spelled exactly as given (escapes included)."""
    return (json.dumps(body)[:-1] + (", " if body else "") + extra + "}").encode()


def duplicated_first_key(body: dict[str, Any]) -> bytes:
    first = next(iter(body.items()))
    members = [first, *body.items()]
    return ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in members) + "}").encode()


# Bodies the parser itself refuses: 400 validation_error with details {"body": ...}.
PARSE_FAILURES: list[tuple[str, Callable[[dict[str, Any]], bytes]]] = [
    ("5000 nested arrays", lambda body: b"[" * 5000 + b"]" * 5000),
    ("5000 nested objects, unclosed", lambda body: b'{"a":' * 5000),
    ("65 levels inside a field", lambda body: raw_with_extra(body, '"deep": ' + "[" * 65 + "]" * 65)),
    ("a float past a double", lambda body: raw_with_extra(body, '"n": 1e400')),
    ("a negative float past a double", lambda body: raw_with_extra(body, '"n": -1e400')),
    ("an integer of 5000 digits", lambda body: raw_with_extra(body, '"n": ' + "9" * 5000)),
    ("NaN", lambda body: raw_with_extra(body, '"n": NaN')),
    ("Infinity", lambda body: raw_with_extra(body, '"n": Infinity')),
    ("NUL in a value", lambda body: raw_with_extra(body, '"s": "a\\u0000b"')),
    ("NUL in a key", lambda body: raw_with_extra(body, '"a\\u0000": 1')),
    ("a lone high surrogate in a value", lambda body: raw_with_extra(body, '"s": "\\ud800"')),
    ("a lone low surrogate in a key", lambda body: raw_with_extra(body, '"\\udc00": 1')),
    ("surrogates in the wrong order", lambda body: raw_with_extra(body, '"s": "\\udc00\\ud800"')),
    ("a NUL byte outside strings", lambda body: json.dumps(body).encode() + b"\x00"),
    ("a raw control character in a string", lambda body: raw_with_extra(body, '"s": "a\x01b"')),
    ("a duplicate key", duplicated_first_key),
    ("invalid UTF-8", lambda body: raw_with_extra(body, '"s": "') + b'\xff"}'),
    ("UTF-8-encoded surrogate", lambda body: raw_with_extra(body, '"s": "') + b'\xed\xa0\x80"}'),
    ("a truncated body", lambda body: json.dumps(body).encode()[:-1]),
    ("an empty object cut short", lambda body: b"{"),
    ("trailing garbage", lambda body: json.dumps(body).encode() + b" {}"),
    ("single quotes", lambda body: b"{'kind': 'k'}"),
]

# Bodies that parse but are not what the route takes: 400 validation_error naming fields.
SHAPE_FAILURES: list[tuple[str, bytes]] = [
    ("a 10,000-element array as the body", json.dumps([0] * 10_000).encode()),
    ("a string as the body", b'"hello"'),
    ("a number as the body", b"12"),
    ("null as the body", b"null"),
]

WRONG_CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/xml",
    "application/json-patch+json",
]


@pytest.fixture
def reviewer(db: None) -> APIClient:
    user = User.objects.create_user("rita", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="review_deadletter"))
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def world(alice: AgentClient, reviewer: APIClient) -> dict[str, Any]:
    """A leased task with a dispatched tool call, and who may write to each route."""
    task = create_task(alice, kind="k")
    lease = claim(alice)
    dispatched = alice.post(f"/api/v1/tasks/{task['task_id']}/tool-calls/",
                            {"step": 0, "tool": "crm", "input": {}, "lease_epoch": lease["lease_epoch"]}, format="json")
    assert dispatched.status_code == 201, dispatched.content
    return {"task": task["task_id"], "key": dispatched.json()["idempotency_key"], "agent": alice, "reviewer": reviewer}


def route_call(world: dict[str, Any], name: str) -> tuple[APIClient, str, dict[str, Any]]:
    _, path, body, _ = next(route for route in WRITE_ROUTES if route[0] == name)
    client = world["reviewer"] if name.startswith("dead_letters") else world["agent"]
    body = json.loads(json.dumps(body).replace("{task}", world["task"]))
    return client, path.format(task=world["task"], key=world["key"]), body


# The table runs as one test per route (a fixture per case would cost minutes on a shared machine);
# each failure names its case.


@pytest.mark.parametrize("route", ROUTE_IDS)
def test_the_parser_refuses_hostile_json_on_every_write_route(world: dict[str, Any], route: str) -> None:
    client, path, body = route_call(world, route)
    before = row_counts()
    for case, make_body in PARSE_FAILURES:
        response = client.post(path, data=make_body(body), content_type="application/json")
        error = assert_error(response, 400, "validation_error")
        assert set(error["details"]) == {"body"}, (case, error)
    assert row_counts() == before


@pytest.mark.parametrize("route", ROUTE_IDS)
def test_a_body_that_is_not_an_object_is_400(world: dict[str, Any], route: str) -> None:
    client, path, _ = route_call(world, route)
    before = row_counts()
    for case, raw in SHAPE_FAILURES:
        response = client.post(path, data=raw, content_type="application/json")
        assert response.status_code == 400, case
        assert_error(response, 400, "validation_error")
    assert row_counts() == before


@pytest.mark.parametrize("route", ROUTE_IDS)
def test_a_body_that_is_not_json_is_415(world: dict[str, Any], route: str) -> None:
    client, path, body = route_call(world, route)
    before = row_counts()
    for content_type in WRONG_CONTENT_TYPES:
        response = client.post(path, data=json.dumps(body).encode(), content_type=content_type)
        assert response.status_code == 415, content_type
        assert_error(response, 415, "unsupported_media_type")
    assert row_counts() == before


@pytest.mark.parametrize("route", ROUTE_IDS)
def test_a_very_long_string_in_any_field_is_400(world: dict[str, Any], route: str) -> None:
    client, path, body = route_call(world, route)
    fields = next(fields for name, _, _, fields in WRITE_ROUTES if name == route)
    before = row_counts()
    for field in fields:
        error = assert_error(client.post(path, with_field(body, field, LONG), format="json"), 400, "validation_error")
        top = re.split(r"[.\[]", field)[0]
        assert any(re.split(r"[.\[]", name)[0] == top for name in error["details"]), (field, error)
    assert row_counts() == before


TEN_THOUSAND = [
    ("events_append", "outbox", [{}] * 10_000),
    ("events_batch", "events", [{}] * 10_000),
    ("leases_claim", "kinds", ["k"] * 10_000),
    ("tasks_create", "kind", ["k"] * 10_000),
    ("tool_calls_dispatch", "input", list(range(10_000))),
]


@pytest.mark.parametrize(("route", "field", "value"), TEN_THOUSAND, ids=[f"{r}:{f}" for r, f, _ in TEN_THOUSAND])
def test_a_10000_element_array_where_it_does_not_belong_is_400(
    world: dict[str, Any], route: str, field: str, value: Any
) -> None:
    client, path, body = route_call(world, route)
    before = row_counts()
    body = with_field(body, field, value)
    assert len(json.dumps(body)) < 256 * 1024
    error = assert_error(client.post(path, body, format="json"), 400, "validation_error")
    assert any(name.startswith(field) for name in error["details"]), error
    assert row_counts() == before


@pytest.mark.parametrize(
    ("value", "detail"),
    [(10**30, "max_attempts"), (1e300, "max_attempts"), (-(10**30), "max_attempts"), (2**63, "max_attempts")],
)
def test_huge_numbers_in_integer_fields_are_400(alice: AgentClient, counts: Counts, value: Any, detail: str) -> None:
    before = counts()
    error = assert_error(alice.post("/api/v1/tasks/", {"kind": "k", "input": {}, "max_attempts": value}, format="json"),
                         400, "validation_error")
    assert detail in error["details"]
    assert counts() == before


def test_a_big_integer_inside_input_is_refused_when_it_cannot_be_hashed(alice: AgentClient, counts: Counts) -> None:
    before = counts()
    raw = b'{"kind": "k", "input": {"n": ' + b"9" * 400 + b"}}"
    assert_error(alice.post("/api/v1/tasks/", data=raw, content_type="application/json"), 400, "validation_error")
    assert counts() == before


def test_the_depth_limit_is_64_levels_exactly() -> None:
    assert loads_strict(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(InvalidJSON, match="nested deeper"):
        loads_strict(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    # Brackets inside strings, escaped quotes included, are not nesting.
    inside = b'{"s": "' + b'\\"[' * 200 + b'"}'
    assert loads_strict(inside) == {"s": '"[' * 200}
    # An unterminated string with many escaped quotes is scanned in linear time, then refused.
    with pytest.raises(InvalidJSON):
        loads_strict(b"[" * 70 + b'"' + b'\\"' * 100_000)


def test_valid_pairs_and_escaped_backslashes_are_not_mistaken_for_bad_escapes() -> None:
    assert loads_strict(b'{"s": "\\ud83d\\ude00"}') == {"s": "\U0001f600"}
    assert loads_strict(b'{"s": "\\\\u0000 \\\\ud800"}') == {"s": "\\u0000 \\ud800"}


# --- paths without their trailing slash --------------------------------------------------------

SLASHED_PATHS = [
    "/api/v1/tasks/", "/api/v1/tasks/{task}/", "/api/v1/tasks/{task}/events/", "/api/v1/tasks/{task}/events/batch/",
    "/api/v1/tasks/{task}/verify/", "/api/v1/leases/", "/api/v1/tasks/{task}/heartbeat/",
    "/api/v1/tasks/{task}/release/", "/api/v1/tasks/{task}/recovery-context/", "/api/v1/tasks/{task}/tool-calls/",
    "/api/v1/tool-calls/{key}/", "/api/v1/tool-calls/{key}/result/", "/api/v1/tasks/{task}/subtasks/",
    "/api/v1/tools/crm/invoke/", "/api/v1/seals/latest/", "/api/v1/seals/consistency/",
    "/api/v1/events/1/proof/", "/api/v1/dead-letters/", "/api/v1/dead-letters/1/requeue/",
    "/api/v1/dead-letters/1/discard/", "/api/v1/nope/", "/api/v1/tasks/not-a-uuid/",
]
METHODS = ["get", "post", "put", "patch", "delete", "head", "options"]


@pytest.mark.parametrize("path", SLASHED_PATHS)
def test_a_path_without_its_slash_answers_like_the_path_with_it(world: dict[str, Any], path: str) -> None:
    """Every method, DEBUG off and on: never a redirect, never HTML, never a 5xx."""
    client = world["agent"]
    client.raise_request_exception = False
    slashed = path.format(task=world["task"], key=world["key"])
    for debug in (False, True):
        for method in METHODS:
            answers = []
            with override_settings(DEBUG=debug):
                for url in (slashed, slashed.rstrip("/")):
                    before = row_counts()
                    data: dict[str, Any] | None = {} if method in ("post", "put", "patch") else None
                    response = getattr(client, method)(url, data, format="json")
                    where = (debug, method, url, response.status_code, response.content[:300])
                    assert 400 <= response.status_code < 500 or response.status_code in (200, 204), where
                    assert row_counts() == before, where
                    if method != "head" and response.status_code != 204:
                        assert response["Content-Type"].startswith("application/json"), where
                        answers.append((response.status_code, response.json()))
                    else:
                        answers.append((response.status_code, None))
            assert answers[0] == answers[1], (debug, method, slashed, answers)


def test_a_create_without_the_slash_is_a_create(alice: AgentClient) -> None:
    for debug in (False, True):
        with override_settings(DEBUG=debug):
            response = alice.post("/api/v1/tasks", {"kind": "k", "input": {"debug": debug}}, format="json")
            assert response.status_code == 201, response.content
            assert alice.get(f"/api/v1/tasks/{response.json()['task_id']}").json() == response.json()


# --- chunked bodies in process (the WSGI request Django builds under a2wsgi) --------------------


def post_chunked(client: APIClient, path: str, raw: bytes) -> Any:
    """What a2wsgi hands Django for ``Transfer-Encoding: chunked``: no CONTENT_LENGTH, the body on wsgi.input."""
    # Django sends bytes as they are (its stubs say str); the rest goes into the WSGI environ.
    extra: dict[str, Any] = {"data": raw, "CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked",
                             "wsgi.input": io.BytesIO(raw)}
    return client.generic("POST", path, content_type="application/json", **extra)


def test_a_chunked_body_is_read_like_any_other(alice: AgentClient, counts: Counts) -> None:
    response = post_chunked(alice, "/api/v1/tasks/", json.dumps({"kind": "k", "input": {"a": 1}}).encode())
    assert response.status_code == 201, response.content
    assert response.json()["input"] == {"a": 1}
    before = counts()
    assert_error(post_chunked(alice, "/api/v1/tasks/", b'{"kind": "k"'), 400, "validation_error")
    assert_error(post_chunked(alice, "/api/v1/tasks/", b"[" * 5000), 400, "validation_error")
    assert counts() == before


def test_a_chunked_body_over_the_limit_is_413(alice: AgentClient, counts: Counts, settings: Any) -> None:
    before = counts()
    body = json.dumps({"kind": "k", "input": {"blob": "x" * settings.BACKPLANE_PAYLOAD_LIMIT_BYTES}}).encode()
    assert_error(post_chunked(alice, "/api/v1/tasks/", body), 413, "payload_too_large")
    assert counts() == before


@pytest.mark.parametrize("length", ["abc", "-5", "1e3"])
def test_a_bad_content_length_is_400(alice: AgentClient, counts: Counts, length: str) -> None:
    before = counts()
    raw = b'{"kind": "k", "input": {}}'
    extra: dict[str, Any] = {"data": raw, "CONTENT_LENGTH": length}  # bytes as they are (the stubs say str)
    response = alice.generic("POST", "/api/v1/tasks/", content_type="application/json", **extra)
    assert_error(response, 400, "validation_error")
    assert counts() == before


# --- through the real web process (uvicorn, a2wsgi, Django) ------------------------------------


@pytest.fixture(scope="module")
def web(django_db_setup: None) -> Iterator[WebProcess]:
    server = WebProcess(name="hostile-inputs")
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def live_token(committed_db: None) -> str:
    return services.agent_create(name=f"live-{uuid.uuid4().hex[:6]}", namespace="live").token


def raw_exchange(web: WebProcess, request: bytes, *, half_close: bool = False) -> bytes:
    """Send bytes as they are and read what comes back until the server closes (``Connection: close``).
    ``half_close`` ends our side at once, as a client that dies mid-body does (uvicorn then drops
    the connection without waiting for the app)."""
    with socket.create_connection((web.host, web.port), timeout=10) as sock:
        sock.sendall(request)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received


def head_and_body(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in headers.items()}
    if headers.get("transfer-encoding") == "chunked":
        decoded, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            decoded, rest = decoded + rest[:size], rest[size + 2:]
        body = decoded
    return int(lines[0].split()[1]), headers, body


def chunked_request(web: WebProcess, token: str, path: str, chunks: list[bytes], *, terminate: bool = True) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: {web.host}:{web.port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks)
    return head + body + (b"0\r\n\r\n" if terminate else b"")


def assert_wire_error(raw: bytes, status: int, code: str) -> None:
    got, headers, body = head_and_body(raw)
    assert got == status, raw[:500]
    assert headers["content-type"].startswith("application/json"), headers
    parsed = json.loads(body)
    assert set(parsed) == {"error"} and set(parsed["error"]) == {"code", "message", "details"}, parsed
    assert parsed["error"]["code"] == code, parsed


def test_live_a_chunked_create_is_201(web: WebProcess, live_token: str) -> None:
    body = json.dumps({"kind": "k", "input": {"via": "chunks"}}).encode()
    raw = raw_exchange(web, chunked_request(web, live_token, "/api/v1/tasks/", [body[:7], body[7:20], body[20:]]))
    status, _, answer = head_and_body(raw)
    assert status == 201, raw[:500]
    assert json.loads(answer)["input"] == {"via": "chunks"}


def test_live_a_chunked_body_past_the_limit_is_413_and_writes_nothing(web: WebProcess, live_token: str) -> None:
    before = row_counts()
    blob = json.dumps({"kind": "k", "input": {"blob": "x" * (300 * 1024)}}).encode()
    chunks = [blob[i:i + 16384] for i in range(0, len(blob), 16384)]
    assert_wire_error(raw_exchange(web, chunked_request(web, live_token, "/api/v1/tasks/", chunks)),
                      413, "payload_too_large")
    assert row_counts() == before


def test_live_hostile_bodies_are_400_and_write_nothing(web: WebProcess, live_token: str) -> None:
    before = row_counts()
    headers = {"Authorization": f"Bearer {live_token}", "Content-Type": "application/json"}
    for raw in (b"[" * 5000, b'{"kind": "k", "kind": "k", "input": {}}', b'{"kind": "k", "input": {"s": "\\ud800"}}',
                b'{"kind": "k", "input": {"n": 1e400}}'):
        response = httpx.post(f"{web.url}/api/v1/tasks/", content=raw, headers=headers, timeout=10)
        assert_error(response, 400, "validation_error")
    # the same over chunks
    assert_wire_error(raw_exchange(web, chunked_request(web, live_token, "/api/v1/tasks/", [b"[" * 5000])),
                      400, "validation_error")
    assert row_counts() == before


@pytest.mark.parametrize("kind", ["content-length", "chunked"])
def test_live_a_truncated_body_writes_nothing_and_never_answers_5xx(
    web: WebProcess, live_token: str, kind: str
) -> None:
    before = row_counts()
    body = json.dumps({"kind": "k", "input": {"pad": "y" * 200}}).encode()
    if kind == "content-length":
        request = (f"POST /api/v1/tasks/ HTTP/1.1\r\nHost: {web.host}\r\nAuthorization: Bearer {live_token}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body[:60]
    else:
        request = chunked_request(web, live_token, "/api/v1/tasks/", [body[:60]], terminate=False)
    raw = raw_exchange(web, request, half_close=True)
    if raw:  # the server may answer a half-closed connection, or just close it
        assert_wire_error(raw, 400, "validation_error")
    assert row_counts() == before
    assert httpx.get(f"{web.url}/api/v1/tasks/", headers={"Authorization": f"Bearer {live_token}"}).status_code == 200


def test_live_a_path_without_its_slash_is_the_same_route(web: WebProcess, live_token: str) -> None:
    headers = {"Authorization": f"Bearer {live_token}"}
    created = httpx.post(f"{web.url}/api/v1/tasks", json={"kind": "k", "input": {}}, headers=headers, timeout=10)
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    got = httpx.get(f"{web.url}/api/v1/tasks/{task_id}", headers=headers, timeout=10)
    slashed = httpx.get(f"{web.url}/api/v1/tasks/{task_id}/", headers=headers, timeout=10)
    assert got.status_code == 200 and got.json() == slashed.json()
    assert_error(httpx.get(f"{web.url}/api/v1/nope", headers=headers), 404, "not_found")


# --- issue 39: amounts, charsets, cursors and query values past what is stored ----------------


def llm_called(cost: Any) -> dict[str, Any]:
    from backplane.eventlog.event_types import prompt_sha256

    return {"type": "LLMCalled", "payload": {"model": "m", "prompt_sha256": prompt_sha256("p"), "output": {},
                                             "cost": cost}}


@pytest.mark.parametrize("amount", ["1E-99999", "1E+99999999999", "-0.01", "0.0000000000001", "1000000000000",
                                    "NaN", "sNaN", "Infinity", "1" * 65, "", "0x10", " "])
def test_an_amount_past_its_bounds_is_400_naming_the_field(alice: AgentClient, counts: Counts, amount: str) -> None:
    task = create_task(alice, kind="k")
    before = counts()
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", llm_called({"amount": amount, "currency": "USD"}),
                          format="json")
    assert "payload.cost.amount" in assert_error(response, 400, "validation_error")["details"]
    assert counts() == before


@pytest.mark.parametrize(("amount", "stored"), [("0.00420", "0.0042"), ("1.50E+1", "15"), ("-0", "0"),
                                                ("999999999999.999999999999", "999999999999.999999999999"),
                                                ("1E-12", "0.000000000001"), ("100", "100")])
def test_an_amount_is_stored_in_one_plain_text(alice: AgentClient, amount: str, stored: str) -> None:
    task = create_task(alice, kind="k")
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", llm_called({"amount": amount, "currency": "USD"}),
                          format="json")
    assert response.status_code == 201, response.content
    assert response.json()["payload"]["cost"]["amount"] == stored


def test_a_token_count_past_its_bound_is_400(alice: AgentClient, counts: Counts) -> None:
    task = create_task(alice, kind="k")
    body = llm_called({"amount": "1", "currency": "USD"})
    body["payload"]["usage"] = {"input_tokens": 10**12 + 1}
    before = counts()
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", body, format="json")
    assert "payload.usage.input_tokens" in assert_error(response, 400, "validation_error")["details"]
    assert counts() == before


@pytest.mark.parametrize("amount", ["1E-99999", "1E+99999999999"])
def test_a_tool_cost_past_its_bounds_is_400(world: dict[str, Any], counts: Counts, amount: str) -> None:
    before = counts()
    response = world["agent"].post(f"/api/v1/tool-calls/{world['key']}/result/", {
        "status": "succeeded", "result": {}, "cost": {"amount": amount, "currency": "USD"}}, format="json")
    assert "cost.amount" in assert_error(response, 400, "validation_error")["details"]
    assert counts() == before


@pytest.mark.parametrize("limit", ["1E+99999999999", "1E-99999", "NaN", "-1", "Infinity"])
def test_a_budget_limit_past_its_bounds_is_400(admin_client: Any, limit: str) -> None:
    response = admin_client.post("/api/v1/budgets/", {"scope": "namespace", "key": "acme", "period": "day",
                                                      "unit": "currency", "currency": "USD", "limit": limit,
                                                      "reason": "r"}, content_type="application/json")
    assert "limit" in assert_error(response, 400, "validation_error")["details"]


def test_a_budget_limit_of_nan_from_the_dashboard_is_refused_not_a_500(admin_client: Any) -> None:
    from recovery.models import Budget

    response = admin_client.post("/budgets/set/", {"scope": "namespace", "key": "acme", "period": "day",
                                                            "unit": "currency", "currency": "USD", "limit": "NaN",
                                                            "reason": "r"})
    assert response.status_code in (302, 303, 404), response.content[:300]
    assert not Budget.objects.exists()


NOT_UTF8 = ["unicode_escape", "latin-1", "utf-16", "utf-7", "cp1252", "bogus", "raw_unicode_escape", "utf-8-sig",
            '"unicode_escape"']
UTF8_SPELLINGS = ["utf-8", "UTF-8", "UTF8", "utf8", '"utf-8"', "us-ascii", "US-ASCII"]
SURROGATE_BODY = b'{"kind": "k", "input": {"s": "\\ud800"}}'


@pytest.mark.parametrize("charset", NOT_UTF8)
def test_a_charset_other_than_utf8_is_415_on_every_kind_of_route(
    world: dict[str, Any], counts: Counts, charset: str
) -> None:
    before = counts()
    agent = world["agent"]
    content_type = f"application/json; charset={charset}"
    # DRF's route (task create) and an agent route (append)
    assert_error(agent.post("/api/v1/tasks/", SURROGATE_BODY, content_type=content_type), 415, "unsupported_media_type")
    append = json.dumps({"type": "Noted", "payload": {"s": "é"}}).encode()
    assert_error(agent.post(f"/api/v1/tasks/{world['task']}/events/", append, content_type=content_type),
                 415, "unsupported_media_type")
    assert counts() == before


@pytest.mark.parametrize("charset", UTF8_SPELLINGS)
def test_utf8_in_any_spelling_is_accepted(alice: AgentClient, charset: str) -> None:
    content_type = f"application/json; charset={charset}"
    created = alice.post("/api/v1/tasks/", json.dumps({"kind": "k", "input": {"s": "plain"}}).encode(),
                         content_type=content_type)
    assert created.status_code == 201, created.content
    appended = alice.post(f"/api/v1/tasks/{created.json()['task_id']}/events/",
                          json.dumps({"type": "Noted", "payload": {}}).encode(), content_type=content_type)
    assert appended.status_code == 201, appended.content


@pytest.mark.parametrize("cursor", [
    pytest.param("WyJb" * 700, id="long"),
    pytest.param(__import__("base64").urlsafe_b64encode(b"[" * 2000).decode(), id="2000 brackets"),
    pytest.param(__import__("base64").urlsafe_b64encode(b"[" * 100).decode(), id="100 brackets"),
    pytest.param(__import__("base64").urlsafe_b64encode(b"[1, 2]").decode(), id="two numbers"),
    pytest.param(__import__("base64").urlsafe_b64encode(b'["x", "y", "z"]').decode(), id="three strings"),
    pytest.param(__import__("base64").urlsafe_b64encode(b'{"a": 1, "b": 2}').decode(), id="an object"),
    pytest.param("!!!", id="not base64"),
    pytest.param(__import__("base64").urlsafe_b64encode(b"\xff\xfe").decode(), id="not utf-8"),
])
def test_a_cursor_the_api_did_not_write_is_400(alice: AgentClient, cursor: str) -> None:
    response = alice.get("/api/v1/tasks/", {"cursor": cursor})
    assert "cursor" in assert_error(response, 400, "validation_error")["details"]


def test_a_cursor_of_2000_brackets_on_the_dashboard_is_not_a_500(admin_client: Any) -> None:
    import base64

    response = admin_client.get("/tasks/", {"cursor": base64.urlsafe_b64encode(b"[" * 2000).decode()})
    assert response.status_code < 500


@pytest.mark.parametrize(("path", "name"), [
    ("/api/v1/tasks/{task}/events/?after_seq=9223372036854775808", "after_seq"),
    ("/api/v1/tasks/{task}/events/?after_seq=-1", "after_seq"),
    ("/api/v1/tasks/{task}/events/?after_seq=%D9%A3", "after_seq"),
    ("/api/v1/tasks/{task}/events/?limit=99999999999999999999999", "limit"),
    ("/api/v1/seals/consistency/?first=9223372036854775808&second=1", "first"),
    ("/api/v1/seals/consistency/?first=1&second=9223372036854775808", "second"),
    ("/api/v1/tasks/?kind=a%00b", "query"),
    ("/api/v1/tasks/?status=%00", "query"),
])
def test_a_query_value_postgresql_would_refuse_is_400(world: dict[str, Any], path: str, name: str) -> None:
    response = world["agent"].get(path.format(task=world["task"]))
    assert name in assert_error(response, 400, "validation_error")["details"]


@pytest.mark.parametrize("path", [
    "/api/v1/events/9223372036854775808/proof/",
    "/api/v1/events/99999999999999999999999999/proof/?tree_size=1",
    "/api/v1/events/1/proof/?tree_size=9223372036854775808",
    "/api/v1/tool-calls/a%00b/",
])
def test_an_id_in_the_path_past_what_postgresql_holds_is_4xx(world: dict[str, Any], path: str) -> None:
    response = world["agent"].get(path)
    assert 400 <= response.status_code < 500, response.content[:300]
    assert set(response.json()) == {"error"}


@pytest.mark.parametrize("path", ["/api/v1/jobs/?cursor=9223372036854775808",
                                  "/api/v1/jobs/99999999999999999999999/",
                                  "/api/v1/dead-letters/?cursor=9223372036854775808",
                                  "/api/v1/jobs/1/items/?status=%00"])
def test_a_staff_query_past_what_postgresql_holds_is_4xx(admin_client: Any, path: str) -> None:
    response = admin_client.get(path)
    assert 400 <= response.status_code < 500, response.content[:300]
    assert set(response.json()) == {"error"}


def test_live_a_charset_of_unicode_escape_with_a_lone_surrogate_is_415_at_once(
    web: WebProcess, live_token: str
) -> None:
    headers = {"Authorization": f"Bearer {live_token}", "Content-Type": "application/json; charset=unicode_escape"}
    created = httpx.post(f"{web.url}/api/v1/tasks/", json={"kind": "k", "input": {}},
                         headers={"Authorization": f"Bearer {live_token}"}, timeout=5)
    before = row_counts()
    for path in ("/api/v1/tasks/", f"/api/v1/tasks/{created.json()['task_id']}/events/"):
        body = SURROGATE_BODY if path == "/api/v1/tasks/" else b'{"type": "Noted", "payload": {"s": "\\ud800"}}'
        assert_error(httpx.post(f"{web.url}{path}", content=body, headers=headers, timeout=5),
                     415, "unsupported_media_type")
    assert row_counts() == before

