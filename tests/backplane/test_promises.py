"""Tests that guard each promise (issue 14): each one kills a single-line mutation of a core
invariant that the rest of the suite let through.

- an idempotent replay answers with the original event, not the task's latest ones;
- the periodic verification recomputes hashes from content and checks the seals against the
  signed tree head;
- an event and its outbox rows commit or fail together;
- the built-in chain check hashes through an implementation independent of the writer's;
- token digests are compared in constant time.
"""

from __future__ import annotations

import ast
import json
import struct
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection
from hypothesis import given, settings
from hypothesis import strategies as st

from backplane.eventlog import services
from backplane.eventlog.chain import compute_hash, hashed_fields, stored_row_hash
from backplane.eventlog.models import Agent, Event, Task, hash_token
from backplane.eventlog.writer import EventDraft, OutboxDraft
from backplane.integrity import independent_hash, sealing, verification
from backplane.integrity import tasks as integrity_tasks
from backplane.integrity.models import IntegrityAlert, IntegrityAlertKind
from tests.api.conftest import AgentClient, assert_error, claim, create_task
from tests.backplane.integrity.audit_support import as_attacker
from tests.support.roles import staff_user

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "vectors" / "rfc8785"


def seed(steps: int = 3) -> Task:
    task = services.task_create(namespace="acme", kind="k", input={"n": steps}, agent="planner").task
    for n in range(steps):
        services.event_append(namespace="acme", task_id=task.pk, agent="a",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": n}))
    task.refresh_from_db()
    return task


def edit_payload_behind_the_logs_back(task: Task, *, seq: int, payload: dict[str, Any]) -> None:
    """The careless attacker: the payload changes, the ``hash`` column is left as it was."""
    as_attacker(("UPDATE backplane_event SET payload = %s::jsonb WHERE task_id = %s AND seq = %s",
                 [json.dumps(payload), task.pk, seq]))


# --- an idempotent replay answers with the original event --------------------------------------


def append(client: Any, task_id: str, **body: Any) -> Any:
    return client.post(f"/api/v1/tasks/{task_id}/events/", body, format="json")


def test_a_replay_after_later_appends_returns_the_original_event(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    original = append(alice, task["task_id"], type="ReasoningStepCompleted", payload={"step": 1},
                      idempotency_key="step-1")
    assert original.status_code == 201
    # Later appends, keyed and not: a replay must not answer with any of them.
    for step, key in ((2, "step-2"), (3, None), (4, "step-4")):
        later = append(alice, task["task_id"], type="ReasoningStepCompleted", payload={"step": step},
                       idempotency_key=key)
        assert later.status_code == 201

    replay = append(alice, task["task_id"], type="ReasoningStepCompleted", payload={"step": 1},
                    idempotency_key="step-1")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replay"] == "true"
    assert replay.json() == original.json()
    assert Event.objects.filter(task_id=task["task_id"]).count() == 5


def test_a_batch_replay_after_later_appends_returns_the_original_events(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    url = f"/api/v1/tasks/{task['task_id']}/events/batch/"
    batch = {"events": [
        {"type": "ReasoningStepCompleted", "payload": {"step": 1}, "idempotency_key": "b-1"},
        {"type": "ReasoningStepCompleted", "payload": {"step": 2}, "idempotency_key": "b-2"},
    ]}
    original = alice.post(url, batch, format="json")
    assert original.status_code == 201
    later = alice.post(url, {"events": [
        {"type": "ReasoningStepCompleted", "payload": {"step": 3}, "idempotency_key": "b-3"},
        {"type": "ReasoningStepCompleted", "payload": {"step": 4}, "idempotency_key": "b-4"},
    ]}, format="json")
    assert later.status_code == 201

    replay = alice.post(url, batch, format="json")
    assert replay.status_code == 200 and replay.headers["Idempotent-Replay"] == "true"
    assert replay.json() == original.json()
    assert [e["seq"] for e in replay.json()["results"]] == [2, 3]


def test_a_tool_call_replay_after_later_calls_returns_the_original_call(alice) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    epoch = claim(alice)["lease_epoch"]
    url = f"/api/v1/tasks/{task['task_id']}/tool-calls/"

    def dispatch(step: int) -> Any:
        return alice.post(url, {"step": step, "tool": "crm", "input": {"step": step}, "lease_epoch": epoch},
                          format="json")

    def answer(key: str, result: dict[str, Any]) -> None:
        response = alice.post(f"/api/v1/tool-calls/{key}/result/",
                              {"status": "succeeded", "result": result, "lease_epoch": epoch}, format="json")
        assert response.status_code == 201, response.content

    first = dispatch(0).json()
    answer(first["idempotency_key"], {"answer": 0})
    in_flight = dispatch(1).json()  # dispatched, never answered
    later = dispatch(2).json()
    answer(later["idempotency_key"], {"answer": 2})

    replay = dispatch(0)
    assert replay.status_code == 200
    assert replay.json() == {"idempotency_key": first["idempotency_key"], "effect_key": first["idempotency_key"],
                             "status": "succeeded", "result": {"answer": 0}, "replayed": True}
    replay = dispatch(1)
    assert replay.status_code == 200
    assert replay.json() == {"idempotency_key": in_flight["idempotency_key"],
                             "effect_key": in_flight["idempotency_key"], "status": "in_flight",
                             "dispatched_at": in_flight["dispatched_at"], "replayed": True}


def test_a_subtask_replay_after_later_subtasks_returns_the_original_child(alice) -> None:  # type: ignore[no-untyped-def]
    parent = create_task(alice)
    epoch = claim(alice)["lease_epoch"]
    url = f"/api/v1/tasks/{parent['task_id']}/subtasks/"

    def dispatch(step: int) -> Any:
        return alice.post(url, {"step": step, "kind": "research", "input": {"q": step}, "lease_epoch": epoch},
                          format="json")

    first = dispatch(1)
    assert first.status_code == 201
    assert dispatch(2).status_code == 201
    replay = dispatch(1)
    assert replay.status_code == 200
    assert replay.json()["task"]["task_id"] == first.json()["task"]["task_id"]
    assert replay.json()["dispatch_key"] == first.json()["dispatch_key"]


# --- leases: what `make mutants` found unguarded (docs/mutation-testing.md) ----------------------


def test_an_agent_never_claims_another_namespaces_task(alice: AgentClient, mallory: AgentClient) -> None:
    create_task(mallory)
    assert alice.post("/api/v1/leases/", {}, format="json").status_code == 204
    assert claim(mallory)["task"]["namespace"] == "globex"


@pytest.mark.parametrize("operation", ["heartbeat", "release"])
def test_another_namespace_cannot_heartbeat_or_release_a_lease(alice: AgentClient, mallory: AgentClient,
                                                              operation: str) -> None:
    task = create_task(alice)
    epoch = claim(alice)["lease_epoch"]
    url = f"/api/v1/tasks/{task['task_id']}/{operation}/"
    assert_error(mallory.post(url, {"lease_epoch": epoch}, format="json"), 404, "not_found")
    assert Task.objects.get(pk=task["task_id"]).lease_holder == "alice"


def test_a_released_lease_cannot_be_heartbeaten_with_its_old_epoch(alice: AgentClient) -> None:
    task = create_task(alice)
    epoch = claim(alice)["lease_epoch"]
    url = f"/api/v1/tasks/{task['task_id']}/"
    assert alice.post(url + "release/", {"lease_epoch": epoch}, format="json").status_code == 200
    # The task is unleased and its epoch is still the one sent: only "is it leased?" refuses it.
    assert_error(alice.post(url + "heartbeat/", {"lease_epoch": epoch}, format="json"), 409, "stale_lease")


def test_a_release_records_who_released_which_lease(alice: AgentClient) -> None:
    task = create_task(alice)
    epoch = claim(alice)["lease_epoch"]
    alice.post(f"/api/v1/tasks/{task['task_id']}/release/", {"lease_epoch": epoch}, format="json")
    released = Event.objects.get(task_id=task["task_id"], type="LeaseReleased")
    assert (released.agent, released.payload) == ("alice", {"agent": "alice", "lease_epoch": epoch})


# --- verification recomputes from content, on a schedule, seals included ----------------------


def test_seal_verification_recomputes_each_hash_from_content(db) -> None:  # type: ignore[no-untyped-def]
    task = seed(steps=3)
    sealing.seal_new_events()
    assert sealing.seal_verify_against_head().valid and verification.seals_verify().valid
    edit_payload_behind_the_logs_back(task, seq=3, payload={"step": 99})

    assert not sealing.seal_verify_against_head().valid
    checked = verification.seals_verify()
    assert not checked.valid and checked.finding is not None
    assert (checked.finding.task_id, checked.finding.seq) == (task.pk, 3)


def test_the_full_run_raises_an_alert_at_the_first_edited_seq(db) -> None:  # type: ignore[no-untyped-def]
    task = seed(steps=4)
    sealing.seal_new_events()
    assert integrity_tasks.verify_chains_full()["failures"] == 0
    assert integrity_tasks.verify_chains_incremental()["failures"] == 0
    edit_payload_behind_the_logs_back(task, seq=4, payload={"step": 99})
    edit_payload_behind_the_logs_back(task, seq=2, payload={"step": 99})

    result = integrity_tasks.verify_chains_full()
    assert result["failures"] >= 1
    alert = IntegrityAlert.objects.get(task=task)
    assert (alert.kind, alert.first_invalid_seq) == (IntegrityAlertKind.CHAIN, 2)


def test_the_full_run_finds_a_rehashed_edit_through_the_seals(db) -> None:  # type: ignore[no-untyped-def]
    """Edited and re-hashed to the head, task row included, before any run pinned a verified head:
    the chain is consistent again, and only the leaves' sealed hashes and the signed root tell."""
    task = seed(steps=4)
    sealing.seal_new_events()
    events = list(Event.objects.filter(task=task).order_by("seq"))
    prev = events[1].prev_hash
    statements: list[tuple[str, list[Any]]] = []
    for event in events[1:]:
        if event.seq == 2:
            event.payload = {"step": 99}
        event.prev_hash = prev
        event.hash = independent_hash.row_hash([
            event.task_id, event.seq, event.type, event.payload, event.agent, event.idempotency_key, event.lamport,
            event.causation_id, event.correlation_id, event.trace_id, event.recorded_at, event.prev_hash])
        prev = event.hash
        statements.append(("UPDATE backplane_event SET payload = %s::jsonb, prev_hash = %s, hash = %s"
                           " WHERE position = %s", [json.dumps(event.payload), event.prev_hash, event.hash,
                                                    event.position]))
    statements.append(("UPDATE backplane_task SET head_hash = %s WHERE id = %s", [prev, task.pk]))
    as_attacker(*statements)

    result = integrity_tasks.verify_chains_full()
    assert result["failures"] == 1
    alert = IntegrityAlert.objects.get(task=task)
    assert (alert.kind, alert.first_invalid_seq) == (IntegrityAlertKind.CHAIN, 2)
    assert alert.problem.startswith("seal:")


def test_a_rewritten_leaf_table_is_narrowed_to_a_subtree_by_the_signed_frontier(db) -> None:  # type: ignore[no-untyped-def]
    task = seed(steps=6)  # 7 events: subtrees of 4, 2 and 1 leaves
    sealing.seal_new_events()
    event = Event.objects.get(task=task, seq=6)
    payload = {"step": 99}
    new_hash = independent_hash.row_hash([
        event.task_id, event.seq, event.type, payload, event.agent, event.idempotency_key, event.lamport,
        event.causation_id, event.correlation_id, event.trace_id, event.recorded_at, event.prev_hash])
    as_attacker(
        ("UPDATE backplane_event SET payload = %s::jsonb, hash = %s WHERE position = %s",
         [json.dumps(payload), new_hash, event.position]),
        ("UPDATE backplane_merkleleaf SET event_hash = %s WHERE event_id = %s", [new_hash, event.position]),
    )
    checked = verification.seals_verify()
    assert checked.finding is not None and checked.finding.leaf_index == 4
    assert "leaves 4..5" in checked.finding.problem


def test_a_full_run_with_nothing_sealed_and_nothing_wrong_has_no_failures(db) -> None:  # type: ignore[no-untyped-def]
    seed(steps=1)
    assert integrity_tasks.verify_chains_full()["failures"] == 0


# --- an event and its outbox rows commit or fail together --------------------------------------


@pytest.fixture
def refused_topic(committed_db) -> Any:  # type: ignore[no-untyped-def]
    """A real failure of the outbox INSERT: a CHECK constraint that refuses one topic. Added with
    real commits (other connections would see it too) and always taken away again."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE backplane_outboxmessage ADD CONSTRAINT test_refused_topic"
                       " CHECK (topic <> 'refused.topic')")
    yield "refused.topic"
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE backplane_outboxmessage DROP CONSTRAINT test_refused_topic")


def test_an_outbox_insert_failure_fails_the_append_and_writes_no_event(alice, refused_topic) -> None:  # type: ignore[no-untyped-def]
    task = create_task(alice)
    before = Event.objects.filter(task_id=task["task_id"]).count()
    response = append(alice, task["task_id"], type="ReasoningStepCompleted", payload={"step": 1},
                      outbox=[{"topic": refused_topic, "payload": {"n": 1}}])
    assert_error(response, 500, "internal_error")
    assert Event.objects.filter(task_id=task["task_id"]).count() == before
    assert Task.objects.get(pk=task["task_id"]).last_seq == before
    # The task takes the next append as if nothing had happened.
    assert append(alice, task["task_id"], type="ReasoningStepCompleted", payload={"step": 1}).json()["seq"] == 2


def test_an_outbox_insert_failure_in_a_batch_writes_none_of_it(refused_topic) -> None:  # type: ignore[no-untyped-def]
    task = services.task_create(namespace="acme", kind="k", input={}, agent="planner").task
    drafts = [EventDraft(type="ReasoningStepCompleted", payload={"step": 1}),
              EventDraft(type="ReasoningStepCompleted", payload={"step": 2},
                         outbox=(OutboxDraft(topic=refused_topic, payload={}),))]
    with pytest.raises(DatabaseError):
        services.event_append_batch(namespace="acme", task_id=task.pk, drafts=drafts, agent="a")
    assert Event.objects.filter(task=task).count() == 1
    task.refresh_from_db()
    assert task.last_seq == 1


# --- the chain check hashes independently of the writer ----------------------------------------


def _vector_pairs() -> list[str]:
    return sorted(p.name.removesuffix(".input.json") for p in VECTORS.glob("*.input.json")
                  if (VECTORS / p.name.replace(".input.", ".output.")).exists())


@pytest.mark.parametrize("name", _vector_pairs())
def test_the_independent_canonicaliser_produces_the_reference_bytes(name: str) -> None:
    value = json.loads((VECTORS / f"{name}.input.json").read_text(encoding="utf-8"))
    assert independent_hash.jcs(value) == (VECTORS / f"{name}.output.json").read_bytes()


def test_the_independent_canonicaliser_sorts_by_utf16_code_units() -> None:
    value = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.input.json").read_text(encoding="utf-8"))
    expected = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.expected-values-order.json").read_text())
    assert list(json.loads(independent_hash.jcs(value)).values()) == expected


def _number_rows() -> list[dict[str, Any]]:
    numbers = json.loads((VECTORS / "numbers.json").read_text())
    return [*numbers["rows"], *numbers["extra_samples"]]


@pytest.mark.parametrize("row", _number_rows(), ids=lambda r: r["ieee_hex"])
def test_the_independent_canonicaliser_formats_numbers_as_ecmascript(row: dict[str, Any]) -> None:
    value = struct.unpack(">d", bytes.fromhex(row["ieee_hex"]))[0]
    if row.get("error"):
        with pytest.raises(independent_hash.NotCanonicalizable):
            independent_hash.jcs(value)
    else:
        assert independent_hash.jcs(value).decode() == row["expected"]


def test_the_independent_hasher_imports_none_of_the_writers_hashing() -> None:
    tree = ast.parse((ROOT / "backplane" / "integrity" / "independent_hash.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.startswith(("backplane", "rfc8785"))}, imported


_text = st.text(st.one_of(
    st.characters(exclude_categories=["Cs"]),
    st.sampled_from(["\x1f", "\x7f", '"', "\\", "\b", "\f", "\n", "\r", "\t", "\u2028", "\ue000", "\U0001f600",
                     "\u00e9", "\ufb33"]),
), max_size=8)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=12,
)
_optional_text = st.none() | _text
_hex64 = st.text("0123456789abcdef", min_size=64, max_size=64)


@settings(max_examples=300, deadline=None)
@given(
    task_id=st.uuids(), seq=st.integers(1, 2**31), type_=_text, payload=st.dictionaries(_text, _json, max_size=5),
    agent=_optional_text, key=_optional_text, lamport=st.integers(1, 2**40), causation=_optional_text,
    correlation=_optional_text, trace=_optional_text, prev_hash=_hex64,
    recorded_at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                             timezones=st.just(UTC)),
    offset_minutes=st.integers(-720, 720),
)
def test_the_independent_hash_agrees_with_the_writers_on_random_events(  # type: ignore[no-untyped-def]
    task_id: uuid.UUID, seq, type_, payload, agent, key, lamport, causation, correlation, trace, prev_hash,
    recorded_at: datetime, offset_minutes: int,
) -> None:
    from datetime import timezone as tz

    moment = recorded_at.astimezone(tz(timedelta(minutes=offset_minutes)))  # any zone; the rule prints UTC
    writers = compute_hash(hashed_fields(
        task_id=str(task_id), seq=seq, type=type_, payload=payload, agent=agent, idempotency_key=key,
        lamport=lamport, causation_id=causation, correlation_id=correlation, trace_id=trace,
        recorded_at=moment, prev_hash=prev_hash,
    ))
    ours = independent_hash.row_hash(
        [task_id, seq, type_, payload, agent, key, lamport, causation, correlation, trace, moment, prev_hash])
    assert ours == writers


def test_the_independent_hash_agrees_on_stored_rows(db) -> None:  # type: ignore[no-untyped-def]
    task = services.task_create(namespace="acme", kind="k", input={"big": 2**60, "f": 0.1, "e": "\U0001f600"},
                                agent="planner").task
    services.event_append(namespace="acme", task_id=task.pk, agent="a", draft=EventDraft(
        type="ReasoningStepCompleted", payload={"step": 1, "x": [1e21, -0.0, 5e-324, "\u2028"], "\ufb33": 1,
                                                "\U0001f600": 2}, idempotency_key="k", trace_id="t"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT task_id, seq, type, payload, agent, idempotency_key, lamport, causation_id,"
                       " correlation_id, trace_id, recorded_at, prev_hash, hash FROM backplane_event"
                       " WHERE task_id = %s ORDER BY seq", [task.pk])
        rows = cursor.fetchall()
    assert len(rows) == 2
    for *columns, stored in rows:
        assert independent_hash.row_hash(columns) == stored_row_hash(columns) == stored


@pytest.mark.parametrize("left_out", ["prev_hash", "payload"])
def test_the_periodic_check_catches_a_writer_that_hashes_too_little(db, monkeypatch, left_out: str) -> None:  # type: ignore[no-untyped-def]
    """The two mutants only the offline verifier caught: a writer whose hash leaves out
    ``prev_hash`` or ``payload``. The built-in check, hashing on its own, now catches them too."""
    from backplane.eventlog import chain

    # The mutation as it was made: in the rule's one definition, shared by the writer and by
    # chain.stored_row_hash, so a check hashing through chain.py would agree with the writer.
    original = chain.hashed_fields
    monkeypatch.setattr(chain, "hashed_fields", lambda **fields: {
        name: value for name, value in original(**fields).items() if name != left_out})
    task = seed(steps=2)
    result = integrity_tasks.verify_chains_incremental()
    assert result["failures"] == 1
    assert IntegrityAlert.objects.get(task=task).first_invalid_seq == 1
    # The API's check of one task hashes on its own too.
    from django.test import Client

    staff = Client()
    staff.force_login(staff_user("auditor", "Viewers", password="x" * 20))
    verified = staff.get(f"/api/v1/tasks/{task.pk}/verify/").json()
    assert (verified["valid"], verified["first_invalid_seq"]) == (False, 1)


# --- token digests are compared in constant time ------------------------------------------------


def test_a_token_matches_only_its_own_hash(db) -> None:  # type: ignore[no-untyped-def]
    created = services.agent_create(name="bot", namespace="acme")
    agent = Agent.objects.get(pk=created.agent.pk)
    assert agent.token_hash == hash_token(created.token)
    assert agent.token_matches(created.token)
    assert not agent.token_matches(created.token + "x")


_SECRET_WORDS = ("token", "signature", "secret")
# Where tokens and signatures are checked. Any module that compares a secret goes here.
_AUTH_MODULES = [
    "api/authentication.py",
    "backplane/eventlog/models.py",
    "backplane/eventlog/services.py",
    "backplane/delivery/sinks.py",
]


def _names_a_secret(node: ast.AST) -> bool:
    """A name, attribute or call whose spelling says it holds a token, a signature or a secret (a
    token digest is spelled `token_hash`)."""
    for sub in ast.walk(node):
        spelled = (sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(sub, ast.Attribute) else
                   sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else "")
        if isinstance(sub, ast.Constant):
            continue  # a literal is not a secret (e.g. comparing a scheme name)
        if any(word in spelled.lower() for word in _SECRET_WORDS):
            return True
    return False


def secret_comparisons_with_eq(source: str) -> list[int]:
    """Lines that compare a token, digest or signature with ``==`` / ``!=`` (short-circuiting,
    so timing tells how many leading characters matched): they must use hmac.compare_digest."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            if any(_names_a_secret(side) for side in [node.left, *node.comparators]):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", _AUTH_MODULES)
def test_token_digests_are_never_compared_with_eq(path: str) -> None:
    assert secret_comparisons_with_eq((ROOT / path).read_text()) == [], f"use hmac.compare_digest in {path}"


def test_the_eq_check_sees_what_it_guards() -> None:
    assert secret_comparisons_with_eq("ok = self.token_hash == hash_token(token)") == [1]
    assert secret_comparisons_with_eq("ok = expected_signature != sig") == [1]
    assert secret_comparisons_with_eq("ok = hmac.compare_digest(self.token_hash, hash_token(token))") == []
    assert secret_comparisons_with_eq("ok = parts[0] == 'Bearer'") == []
