"""Every agent route as production serves it: the web process `make run` starts (uvicorn, a2wsgi,
Django's WSGI handler), its connection pool on, real HTTP, every write committed. Each answer,
success and error, is checked against the OpenAPI document's operation for that route (status,
content type, body) and against the contract (the error shape, ``Allow``, ``Retry-After``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from django.db import connection

from backplane.eventlog import services
from tests.support.live_server import WebProcess, database_url_of_test_db
from tests.support.pgbouncer import pgbouncer_in_front_of
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["direct", "pgbouncer"])
def served(request: pytest.FixtureRequest, django_db_setup: None) -> Iterator[WebProcess]:
    # As shipped (settings.py): the pool on, DEBUG off. The duty watch stays off: no worker here.
    env = {"BACKPLANE_DB_POOL": "1", "DEBUG": "0"}
    with contextlib.ExitStack() as stack:
        if request.param == "pgbouncer":
            # The layout with a transaction pooler (docs/production.md, "PgBouncer"): DATABASE_URL
            # through a private PgBouncer, the direct URL beside it for what needs a session.
            direct = database_url_of_test_db()
            bouncer = stack.enter_context(pgbouncer_in_front_of(direct))
            env.update(DATABASE_URL=bouncer.url(connection.settings_dict["NAME"]), DATABASE_DIRECT_URL=direct,
                       BACKPLANE_DB_POOLER="transaction")
        server = WebProcess(name=f"served-web-{request.param}", env=env)
        stack.callback(server.close)
        server.start()
        if request.param == "pgbouncer":
            # The pool's connections are PgBouncer's clients, not PostgreSQL's.
            wait_until(lambda: bouncer.client_count(connection.settings_dict["NAME"]) >= 1, timeout=10,
                       what="the web process's pool connects through PgBouncer", details=bouncer.log)
        yield server


class Route:
    """One operation of the schema, called over HTTP, each answer checked against it."""

    def __init__(self, client: httpx.Client, schema: Any, path: str, method: str) -> None:
        self.client, self.path, self.method = client, path, method
        self.operation = schema[path][method]

    def __call__(self, expected: int, *, code: str | None = None, json: Any = None, content: bytes | None = None,
                 headers: dict[str, str] | None = None, client: httpx.Client | None = None,
                 at: dict[str, str] | None = None) -> httpx.Response:
        url = self.path.format(**(at or {}))
        response = (client or self.client).request(self.method, url, json=json, content=content, headers=headers)
        assert response.status_code == expected, (self.method, url, response.status_code, response.text)
        assert str(expected) in self.operation.definition.raw["responses"], f"{expected} is not documented"
        self.operation.validate_response(response)
        if code is not None:
            body = response.json()
            assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, body
            assert body["error"]["code"] == code, body
        return response


def test_every_agent_route_answers_by_its_schema_and_the_contract(served: WebProcess, committed_db: None) -> None:
    token = services.agent_create(name="served", namespace="acme").token
    agent = httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    stranger = httpx.Client(base_url=served.url, timeout=10)
    schema = schemathesis.openapi.from_dict(agent.get("/api/schema/?format=json").json())

    def route(path: str, method: str) -> Route:
        return Route(agent, schema, path, method)

    create = route("/api/v1/tasks/", "POST")
    read = route("/api/v1/tasks/{task_id}/", "GET")
    events = route("/api/v1/tasks/{task_id}/events/", "GET")
    append = route("/api/v1/tasks/{task_id}/events/", "POST")
    batch = route("/api/v1/tasks/{task_id}/events/batch/", "POST")
    listing = route("/api/v1/tasks/", "GET")
    verify = route("/api/v1/tasks/{task_id}/verify/", "GET")
    context = route("/api/v1/tasks/{task_id}/recovery-context/", "GET")
    release = route("/api/v1/tasks/{task_id}/release/", "POST")
    subtasks = route("/api/v1/tasks/{task_id}/subtasks/", "POST")
    tool_call = route("/api/v1/tool-calls/{key}/", "GET")
    claim = route("/api/v1/leases/", "POST")
    heartbeat = route("/api/v1/tasks/{task_id}/heartbeat/", "POST")
    dispatch = route("/api/v1/tasks/{task_id}/tool-calls/", "POST")
    result = route("/api/v1/tool-calls/{key}/result/", "POST")

    assert claim(204).content == b""  # nothing pending yet
    task_id = create(201, json={"kind": "served", "input": {"n": 1}}).json()["task_id"]
    ids = {"task_id": task_id}
    missing = {"task_id": str(uuid.uuid4())}

    # Reads, and who may read.
    answer = read(200, at=ids)
    assert answer.json()["status"] == "pending" and answer.headers["Allow"] == "GET, HEAD, OPTIONS"
    read(404, code="not_found", at=missing)
    unauthenticated = read(401, code="not_authenticated", client=stranger, at=ids)
    assert unauthenticated.headers["WWW-Authenticate"] == 'Bearer realm="api"'
    assert events(200, at=ids).json()["next_after_seq"] is None

    # The lease, and fencing.
    lease = claim(200, json={"kinds": ["served"], "lease_seconds": 60}).json()
    epoch = lease["lease_epoch"]
    assert heartbeat(200, json={"lease_epoch": epoch}, at=ids).json()["expires_at"]
    heartbeat(409, code="stale_lease", json={"lease_epoch": epoch + 1}, at=ids)
    append(409, code="stale_lease", json={"type": "Noted", "payload": {}}, at=ids)

    # Appends: written, replayed, conflicting, refused.
    step = {"type": "ReasoningStepCompleted", "payload": {"step": 1}, "idempotency_key": "s1", "lease_epoch": epoch}
    written = append(201, json=step, at=ids)
    assert written.json()["seq"] == 3 and written.headers["Allow"] == "GET, POST, HEAD, OPTIONS"
    replayed = append(200, json=step, at=ids)
    assert replayed.headers["Idempotent-Replay"] == "true" and replayed.json() == written.json()
    append(422, code="idempotency_mismatch", json={**step, "payload": {"step": 2}}, at=ids)
    append(409, code="seq_conflict", json={"type": "Noted", "payload": {}, "expected_seq": 1, "lease_epoch": epoch},
           at=ids)
    append(400, code="validation_error", json={"type": "TaskStarted", "payload": {}, "lease_epoch": epoch}, at=ids)
    append(400, code="validation_error", content=b'{"type": "Noted", "type": "X"}',
           headers={"Content-Type": "application/json"}, at=ids)
    append(415, code="unsupported_media_type", content=b"type=Noted", headers={"Content-Type": "text/plain"}, at=ids)
    not_allowed = agent.delete(f"/api/v1/tasks/{task_id}/events/")
    assert not_allowed.status_code == 405 and not_allowed.headers["Allow"] == "GET, POST, HEAD, OPTIONS"
    batch(201, json={"lease_epoch": epoch, "events": [{"type": "Noted", "payload": {"i": i}} for i in range(3)]},
          at=ids)
    batch(400, code="validation_error", json={"lease_epoch": epoch, "events": []}, at=ids)

    # The tool-call proxy: dispatched once, answered once.
    call = {"step": 2, "tool": "crm.write", "input": {"lead": 1}, "lease_epoch": epoch}
    key = dispatch(201, json=call, at=ids).json()["idempotency_key"]
    assert dispatch(200, json=call, at=ids).json()["status"] == "in_flight"
    dispatch(422, code="idempotency_mismatch", json={**call, "input": {"lead": 2}}, at=ids)
    answer_body = {"status": "succeeded", "result": {"id": 7}, "lease_epoch": epoch}
    result(201, json=answer_body, at={"key": key})
    assert result(200, json=answer_body, at={"key": key}).json()["replayed"] is True
    result(422, code="idempotency_mismatch", json={**answer_body, "result": {"id": 8}}, at={"key": key})
    result(404, code="not_found", json=answer_body, at={"key": "0" * 64})
    assert tool_call(200, at={"key": key}).json()["status"] == "succeeded"
    tool_call(404, code="not_found", at={"key": "0" * 64})

    # A hand-off, and what a recovering agent reads.
    handoff = {"step": 3, "kind": "served-child", "input": {"q": 1}, "lease_epoch": epoch}
    child = subtasks(201, json=handoff, at=ids).json()["task"]
    assert subtasks(200, json=handoff, at=ids).json()["task"]["task_id"] == child["task_id"]
    assert context(200, at=ids).json()["task_id"] == task_id
    assert verify(200, at=ids).json()["valid"] is True
    assert {t["task_id"] for t in listing(200).json()["results"]} == {task_id, child["task_id"]}

    # The end of the task, and what a closed task answers.
    append(201, json={"type": "TaskCompleted", "payload": {"output": {"ok": True}}, "lease_epoch": epoch}, at=ids)
    append(409, code="task_closed", json={"type": "Noted", "payload": {}}, at=ids)
    finished = read(200, at=ids).json()
    assert (finished["status"], finished["lease"], finished["last_seq"]) == ("completed", None, 10)
    page = events(200, at=ids).json()["results"]
    assert [e["seq"] for e in page] == list(range(1, 11))

    # A lease given back: the child, claimed and released, then a release with the old epoch.
    child_ids = {"task_id": child["task_id"]}
    child_lease = claim(200, json={"kinds": ["served-child"]}).json()
    assert release(200, json={"lease_epoch": child_lease["lease_epoch"]}, at=child_ids).json()["status"] == "pending"
    release(409, code="stale_lease", json={"lease_epoch": child_lease["lease_epoch"]}, at=child_ids)

    # Forks of the finished task, a sandbox's refusals, and the diff.
    fork = route("/api/v1/tasks/{task_id}/fork/", "POST")
    diff = route("/api/v1/tasks/{task_id}/diff/{other_id}/", "GET")
    forked = fork(201, json={"at_seq": 8, "reason": "again"}, at=ids).json()  # after the call's answer
    assert forked["forked_from"] == {"task_id": task_id, "at_seq": 8} and forked["status"] == "pending"
    fork(400, code="validation_error", json={"at_seq": 99, "reason": "past the head"}, at=ids)
    fork(404, code="not_found", json={"at_seq": 1, "reason": "nobody's"}, at=missing)
    fork_ids = {"task_id": forked["task_id"]}
    sandbox = fork(201, json={"at_seq": 1, "reason": "replay", "sandbox": True}, at=ids).json()
    fork(409, code="sandbox_refused", json={"at_seq": 1, "reason": "to production"}, at={"task_id": sandbox["task_id"]})
    sandbox_lease = claim(200, json={"task_id": sandbox["task_id"]}).json()
    dispatch(409, code="sandbox_refused", json={"step": 9, "tool": "never", "input": {},
                                                "lease_epoch": sandbox_lease["lease_epoch"]},
             at={"task_id": sandbox["task_id"]})
    unleased = {name: value for name, value in call.items() if name != "lease_epoch"}
    recorded = dispatch(200, json=unleased, at=fork_ids).json()  # the source's step, from its record
    assert recorded["status"] == "succeeded" and recorded["effect_key"] == key
    drift = diff(200, at={**ids, "other_id": forked["task_id"]}).json()
    # Both histories hold the source's claim, which the diff leaves out as lease bookkeeping.
    assert drift["first_divergence"]["kind"] == "only_in_a" and drift["counts"]["same"] == 7
    diff(404, code="not_found", at={**ids, "other_id": str(uuid.uuid4())})
