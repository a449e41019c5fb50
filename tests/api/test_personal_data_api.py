"""Personal data over the API (docs/privacy.md): a marked value is sealed before it is hashed or
stored, opened for the namespace's agents and for people allowed (each read by a person recorded),
refused to everyone else, and erased for good; the chain an outsider checks is the same bytes
before and after the erasure. Every refusal is the contract's error and changes nothing."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import rfc8785
from django.db import connection
from rest_framework.test import APIClient

from backplane.delivery.models import OutboxMessage
from backplane.privacy.models import DataSubject, PersonalDataRead, PersonalLookup
from tests.api.conftest import AgentClient, assert_error, claim, create_task, row_counts
from tests.support.roles import staff_user

pytestmark = pytest.mark.django_db

EMAIL = "ada.lovelace@example.com"


def personal(value: Any, subject: str = "lead:8812", **more: Any) -> dict[str, Any]:
    return {"$personal": {"subject": subject, "value": value, **more}}


def session(name: str, *roles: str) -> APIClient:
    client = APIClient()
    client.force_login(staff_user(name, *roles))
    return client


def append(client: AgentClient, task_id: str, payload: dict[str, Any], **body: Any) -> Any:
    return client.post(f"/api/v1/tasks/{task_id}/events/",
                       {"type": "LeadQualified", "payload": payload, **body}, format="json")


def stored_text() -> str:
    """Every stored payload, input and outbox message as PostgreSQL holds them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(string_agg(payload::text, ' '), '') FROM backplane_event")
        events = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(string_agg(input::text || output::text, ' '), '') FROM backplane_task")
        tasks = cursor.fetchone()[0]
        cursor.execute("SELECT coalesce(string_agg(payload::text, ' '), '') FROM backplane_outboxmessage")
        return events + tasks + cursor.fetchone()[0]


def outsider_hash(event: dict[str, Any]) -> str:
    """../shared/API.md's rule, with no code of ours: drop hash and position, RFC 8785, SHA-256."""
    return hashlib.sha256(rfc8785.dumps({k: v for k, v in event.items() if k not in ("hash", "position")})).hexdigest()


def qualified(alice: AgentClient) -> tuple[dict[str, Any], dict[str, Any]]:
    """A task whose input and one event carry the lead's e-mail, sealed; the event as answered."""
    task = create_task(alice, input={"lead": personal(EMAIL, lookup=True), "source": "webinar"})
    response = append(alice, task["task_id"], {"email": personal(EMAIL), "score": 87,
                                               "name": personal({"first": "Ada", "last": "Lovelace"})},
                      idempotency_key="qualify-1",
                      outbox=[{"topic": "leads.qualified", "payload": {"email": personal(EMAIL)}}])
    assert response.status_code == 201, response.content
    return task, response.json()


def test_a_marked_value_is_stored_hashed_and_sent_only_sealed(alice: AgentClient) -> None:
    task, event = qualified(alice)
    assert EMAIL not in stored_text() and "Lovelace" not in stored_text()
    sealed = event["payload"]["email"]["$personal"]
    assert set(sealed) == {"subject", "sealed"} and sealed["subject"] == "lead:8812"
    assert event["payload"]["score"] == 87  # the rest stays as it was sent
    assert task["input"]["lead"]["$personal"]["sealed"] and task["input"]["source"] == "webinar"
    # The same value of the same subject seals alike: the input's and the event's envelope match.
    assert task["input"]["lead"] == event["payload"]["email"]
    message = OutboxMessage.objects.get(topic="leads.qualified")
    assert message.payload == {"email": event["payload"]["email"]}
    assert outsider_hash(event) == event["hash"]
    verified = alice.get(f"/api/v1/tasks/{task['task_id']}/verify/").json()
    assert verified["valid"] is True


def test_the_same_request_again_is_a_replay_and_another_value_a_mismatch(alice: AgentClient) -> None:
    task, event = qualified(alice)
    again = append(alice, task["task_id"], {"email": personal(EMAIL), "score": 87,
                                            "name": personal({"first": "Ada", "last": "Lovelace"})},
                   idempotency_key="qualify-1",
                   outbox=[{"topic": "leads.qualified", "payload": {"email": personal(EMAIL)}}])
    assert again.status_code == 200 and again.headers["Idempotent-Replay"] == "true"
    assert again.json() == event
    other = append(alice, task["task_id"], {"email": personal("someone@example.com"), "score": 87,
                                            "name": personal({"first": "Ada", "last": "Lovelace"})},
                   idempotency_key="qualify-1",
                   outbox=[{"topic": "leads.qualified", "payload": {"email": personal(EMAIL)}}])
    assert_error(other, 422, "idempotency_mismatch")
    created_again = alice.post("/api/v1/tasks/", {"task_id": task["task_id"], "kind": "lead-qualification",
                                                  "input": {"lead": personal(EMAIL, lookup=True),
                                                            "source": "webinar"}}, format="json")
    assert created_again.status_code == 200


def test_the_agents_of_the_namespace_open_and_pass_sealed_values_on(alice: AgentClient, make_agent: Any) -> None:
    task, event = qualified(alice)
    opened = alice.post("/api/v1/personal-data/open/", {"value": event["payload"]}, format="json")
    assert opened.status_code == 200, opened.content
    assert opened.json() == {"value": {"email": EMAIL, "score": 87, "name": {"first": "Ada", "last": "Lovelace"}},
                             "subjects": [{"subject": "lead:8812", "erased_at": None}]}
    # An agent passes an envelope on as it read it: kept as it is, and it opens as before.
    colleague = make_agent("bob", "acme")
    passed = append(colleague, task["task_id"], {"contact": event["payload"]["email"]})
    assert passed.status_code == 201 and passed.json()["payload"]["contact"] == event["payload"]["email"]
    assert PersonalDataRead.objects.count() == 0  # agents read to work; people's reads are recorded


def test_another_namespace_a_viewer_and_an_altered_envelope_open_nothing(
    alice: AgentClient, mallory: AgentClient,
) -> None:
    task, event = qualified(alice)
    envelope = event["payload"]["email"]
    assert_error(mallory.post("/api/v1/personal-data/open/", {"value": envelope}, format="json"),
                 400, "validation_error")
    assert_error(mallory.post("/api/v1/personal-data/open/", {"value": envelope, "namespace": "acme"},
                              format="json"), 403, "permission_denied")
    assert_error(session("vera", "Viewers").post("/api/v1/personal-data/open/",
                                                 {"value": envelope, "namespace": "acme"}, format="json"),
                 403, "permission_denied")
    altered = {"$personal": {**envelope["$personal"], "sealed": envelope["$personal"]["sealed"][:-2] + "AA"}}
    assert_error(alice.post("/api/v1/personal-data/open/", {"value": altered}, format="json"),
                 400, "validation_error")
    moved = {"$personal": {**envelope["$personal"], "subject": "lead:1"}}
    other = create_task(mallory, input={})
    before = row_counts()
    assert_error(append(alice, task["task_id"], {"contact": moved}), 400, "validation_error")
    assert_error(append(alice, task["task_id"], {"contact": altered}), 400, "validation_error")
    # Mallory cannot launder acme's envelope into her namespace either.
    assert_error(append(mallory, other["task_id"], {"contact": envelope}), 400, "validation_error")
    assert row_counts() == before
    assert list(DataSubject.objects.values_list("namespace", "subject")) == [("acme", "lead:8812")]
    assert PersonalDataRead.objects.count() == 0


def test_a_privacy_officers_read_is_recorded(alice: AgentClient) -> None:
    task, event = qualified(alice)
    officer = session("priya", "Privacy officers")
    refused = officer.post("/api/v1/personal-data/open/", {"value": event["payload"]}, format="json")
    assert_error(refused, 400, "validation_error")  # staff of every namespace say whose data it is
    opened = officer.post("/api/v1/personal-data/open/", {"value": event["payload"], "namespace": "acme",
                                                          "task_id": task["task_id"]}, format="json")
    assert opened.status_code == 200 and opened.json()["value"]["email"] == EMAIL
    read = PersonalDataRead.objects.get()
    assert (read.reader, read.namespace, read.subjects, read.where, str(read.task_id)) == (
        "user:priya", "acme", ["lead:8812"], "api", task["task_id"])


def test_a_value_marked_for_lookup_finds_its_subject_by_a_keyed_hash(alice: AgentClient) -> None:
    qualified(alice)
    found = alice.post("/api/v1/personal-data/lookup/", {"value": EMAIL}, format="json")
    assert found.json() == {"subjects": ["lead:8812"]}
    assert alice.post("/api/v1/personal-data/lookup/", {"value": "nobody@example.com"},
                      format="json").json() == {"subjects": []}
    digest = bytes(PersonalLookup.objects.get().digest)
    assert digest != hashlib.sha256(rfc8785.dumps(EMAIL)).digest() and EMAIL.encode() not in digest


@pytest.mark.parametrize(("payload", "field"), [
    ({"email": {"$personal": {"value": EMAIL}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "", "value": EMAIL}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "x" * 201, "value": EMAIL}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "lead\n1", "value": EMAIL}}}, "payload.email"),
    ({"email": {"$personal": {"subject": 8812, "value": EMAIL}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "lead:1"}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "lead:1", "value": EMAIL, "why": "x"}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "lead:1", "value": EMAIL, "lookup": "yes"}}}, "payload.email"),
    ({"email": {"$personal": {"subject": "lead:1", "value": EMAIL}, "also": 1}}, "payload.email"),
    ({"email": {"$personal": "ada"}}, "payload.email"),
    ({"list": [1, {"$personal": {"subject": "lead:1", "value": personal(EMAIL)}}]}, "payload.list[1]"),
    ({"email": {"$personal": {"subject": "lead:1", "sealed": 7}}}, "payload.email"),
])
def test_a_malformed_mark_is_400_naming_where_and_changes_nothing(
    alice: AgentClient, payload: dict[str, Any], field: str,
) -> None:
    task = create_task(alice, input={})
    before = row_counts(), DataSubject.objects.count()
    error = assert_error(append(alice, task["task_id"], payload), 400, "validation_error")
    assert field in error["details"], error
    assert (row_counts(), DataSubject.objects.count()) == before


def test_a_request_marks_at_most_its_share(alice: AgentClient) -> None:
    task = create_task(alice, input={})
    many_subjects = {f"k{n}": personal(n, subject=f"lead:{n}") for n in range(101)}
    assert_error(append(alice, task["task_id"], many_subjects), 400, "validation_error")
    many_values = {"values": [personal(n) for n in range(1001)]}
    assert_error(append(alice, task["task_id"], many_values), 400, "validation_error")
    assert DataSubject.objects.count() == 0


def test_erasure_shows_erased_everywhere_and_the_chain_is_the_same_bytes(alice: AgentClient) -> None:
    task, event = qualified(alice)
    step = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                      {"type": "ReasoningStepCompleted", "payload": {"step": 1, "about": personal(EMAIL)}},
                      format="json")
    assert step.status_code == 201
    context_url = f"/api/v1/tasks/{task['task_id']}/recovery-context/"
    # Before: the namespace's agent resumes with the values opened; a viewer sees them sealed.
    assert alice.get(context_url).json()["completed_steps"][0]["payload"]["about"] == EMAIL
    assert EMAIL in alice.get(context_url).json()["resume_prompt"]
    assert EMAIL not in session("vera", "Viewers").get(context_url).content.decode()
    events_url = f"/api/v1/tasks/{task['task_id']}/events/"
    before = alice.get(events_url).content
    officer = session("priya", "Privacy officers")
    erased = officer.post("/api/v1/personal-data/erase/", {"namespace": "acme", "subject": "lead:8812",
                                                           "reason": "art. 17 request #4411"}, format="json")
    assert erased.status_code == 200, erased.content
    assert erased.json()["erased_by"] == "user:priya" and erased.json()["reason"] == "art. 17 request #4411"
    row = DataSubject.objects.get(subject="lead:8812")
    assert row.wrapped_key is None and row.kek_id is None and PersonalLookup.objects.count() == 0
    notice = OutboxMessage.objects.get(topic="backplane.privacy")
    assert notice.payload["type"] == "SubjectErased" and notice.payload["subject"] == "lead:8812"

    # Every hashed byte is as it was, and an outsider's check still holds.
    assert alice.get(events_url).content == before
    assert all(outsider_hash(e) == e["hash"] for e in alice.get(events_url).json()["results"])
    assert alice.get(f"/api/v1/tasks/{task['task_id']}/verify/").json()["valid"] is True

    opened = alice.post("/api/v1/personal-data/open/", {"value": event["payload"]}, format="json").json()
    assert opened["value"]["email"] == {"$personal": {"subject": "lead:8812", "erased_at": erased.json()["erased_at"]}}
    assert opened["value"]["score"] == 87
    assert alice.post("/api/v1/personal-data/lookup/", {"value": EMAIL}, format="json").json() == {"subjects": []}
    context = alice.get(context_url)
    assert context.status_code == 200 and EMAIL not in context.content.decode()
    assert context.json()["completed_steps"][0]["payload"]["about"] == opened["value"]["email"]
    assert "erased_at" in context.json()["resume_prompt"]


def test_an_erased_subject_takes_no_new_data_and_a_second_erasure_changes_nothing(alice: AgentClient) -> None:
    task, _ = qualified(alice)
    officer = session("priya", "Privacy officers")
    body = {"namespace": "acme", "subject": "lead:8812", "reason": "asked"}
    assert officer.post("/api/v1/personal-data/erase/", body, format="json").status_code == 200
    before = row_counts()
    outbox = OutboxMessage.objects.count()
    again = assert_error(officer.post("/api/v1/personal-data/erase/", body, format="json"), 409, "subject_erased")
    assert again["details"]["erased_by"] == "user:priya"
    assert_error(officer.post("/api/v1/personal-data/erase/", {**body, "subject": "lead:1"}, format="json"),
                 404, "not_found")
    assert_error(append(alice, task["task_id"], {"email": personal("new@example.com")}), 409, "subject_erased")
    assert_error(officer.post("/api/v1/personal-data/erase/", {**body, "reason": ""}, format="json"),
                 400, "validation_error")
    assert (row_counts(), OutboxMessage.objects.count()) == (before, outbox)


def test_only_privacy_officers_erase(alice: AgentClient, mallory: AgentClient) -> None:
    qualified(alice)
    body = {"subject": "lead:8812", "reason": "asked"}
    assert_error(alice.post("/api/v1/personal-data/erase/", body, format="json"), 403, "permission_denied")
    assert_error(session("olivia", "Operators").post("/api/v1/personal-data/erase/", {**body, "namespace": "acme"},
                                                     format="json"), 403, "permission_denied")
    assert DataSubject.objects.get().erased_at is None


def test_a_privacy_tools_token_bound_to_an_officer_erases(alice: AgentClient) -> None:
    from backplane.eventlog import services

    qualified(alice)
    tool = services.agent_create(name="privacy-tool", namespace="acme")
    tool.agent.user = staff_user("priya", "Privacy officers")
    tool.agent.save(update_fields=["user"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tool.token}")
    erased = client.post("/api/v1/personal-data/erase/", {"subject": "lead:8812", "reason": "DSAR 12"},
                         format="json")
    assert erased.status_code == 200, erased.content
    assert erased.json()["erased_by"] == "user:priya (agent:privacy-tool)"


def test_a_tool_call_keeps_its_personal_input_sealed_and_its_replay_matches(alice: AgentClient) -> None:
    create_task(alice, input={})
    lease = claim(alice)
    body = {"step": 1, "tool": "crm-update", "input": {"email": personal(EMAIL)}, "lease_epoch": lease["lease_epoch"]}
    url = f"/api/v1/tasks/{lease['task']['task_id']}/tool-calls/"
    assert alice.post(url, body, format="json").status_code == 201
    again = alice.post(url, body, format="json")
    assert again.status_code == 200 and again.json()["status"] == "in_flight"
    assert EMAIL not in stored_text()
    with connection.cursor() as cursor:
        cursor.execute("SELECT input::text FROM recovery_toolcall")
        assert EMAIL not in cursor.fetchone()[0]


def test_a_session_of_every_namespace_marks_nothing(alice: AgentClient) -> None:
    task = create_task(alice, input={})
    operator = session("olivia", "Operators")
    response = operator.post(f"/api/v1/tasks/{task['task_id']}/signals/paid/", {"payload": {"by": personal(EMAIL)}},
                             format="json")
    assert_error(response, 400, "validation_error")
    assert DataSubject.objects.count() == 0
    assert json.dumps(personal(EMAIL)) not in stored_text()


def test_a_fork_of_a_task_touching_an_erased_subject_works_with_the_value_erased(alice: AgentClient) -> None:
    task, _ = qualified(alice)
    step = alice.post(f"/api/v1/tasks/{task['task_id']}/events/",
                      {"type": "ReasoningStepCompleted", "payload": {"step": 1, "about": personal(EMAIL)}},
                      format="json").json()
    session("priya", "Privacy officers").post("/api/v1/personal-data/erase/", {
        "namespace": "acme", "subject": "lead:8812", "reason": "asked"}, format="json")
    forked = alice.post(f"/api/v1/tasks/{task['task_id']}/fork/",
                        {"at_seq": step["seq"], "reason": "retry the qualification"}, format="json")
    assert forked.status_code == 201, forked.content
    fork_id = forked.json()["task_id"]
    assert alice.get(f"/api/v1/tasks/{fork_id}/verify/").json()["valid"] is True
    context = alice.get(f"/api/v1/tasks/{fork_id}/recovery-context/").json()
    about = context["completed_steps"][0]["payload"]["about"]
    assert set(about["$personal"]) == {"subject", "erased_at"} and EMAIL not in json.dumps(context)


def test_a_payload_search_never_finds_a_personal_value(alice: AgentClient) -> None:
    task, _ = qualified(alice)
    viewer = session("vera", "Viewers")
    assert task["task_id"] not in viewer.get("/tasks/", {"q": EMAIL}).content.decode()
    assert task["task_id"] in viewer.get("/tasks/", {"q": "webinar"}).content.decode()


def test_every_agent_routes_body_is_sealed_batches_sub_tasks_and_signals_too(alice: AgentClient) -> None:
    create_task(alice, input={})
    lease = claim(alice)
    task_id, epoch = lease["task"]["task_id"], lease["lease_epoch"]
    batch = alice.post(f"/api/v1/tasks/{task_id}/events/batch/", {"lease_epoch": epoch, "events": [
        {"type": "LeadQualified", "payload": {"email": personal(EMAIL)}},
        {"type": "LeadScored", "payload": {"who": personal("Ada", subject="lead:9")}}]}, format="json")
    assert batch.status_code == 201, batch.content
    child = alice.post(f"/api/v1/tasks/{task_id}/subtasks/", {"step": 3, "kind": "outreach", "lease_epoch": epoch,
                                                            "input": {"to": personal(EMAIL)}}, format="json")
    assert child.status_code == 201, child.content
    assert child.json()["task"]["input"]["to"] == batch.json()["results"][0]["payload"]["email"]
    signal = alice.post(f"/api/v1/tasks/{task_id}/signals/reply/", {"payload": {"from": personal(EMAIL)}},
                        format="json")
    assert signal.status_code == 201, signal.content
    assert EMAIL not in stored_text() and "Ada" not in stored_text()
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM recovery_tasksignal")
        assert EMAIL not in cursor.fetchone()[0]
    assert_error(alice.post(f"/api/v1/tasks/{task_id}/events/batch/", {"lease_epoch": epoch, "events": [
        {"type": "Noted", "payload": {}}, {"type": "Noted", "payload": {"x": {"$personal": {"value": 1}}}}]},
        format="json"), 400, "validation_error")


def test_a_token_acting_for_a_person_opens_a_recovery_context_and_the_read_is_recorded(alice: AgentClient) -> None:
    from backplane.eventlog import services

    task, _ = qualified(alice)
    assert EMAIL in alice.get(f"/api/v1/tasks/{task['task_id']}/recovery-context/").content.decode()
    assert PersonalDataRead.objects.count() == 0  # an agent of its own reads to work
    tool = services.agent_create(name="privacy-tool", namespace="acme")
    tool.agent.user = staff_user("priya", "Privacy officers")
    tool.agent.save(update_fields=["user"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tool.token}")
    assert EMAIL in client.get(f"/api/v1/tasks/{task['task_id']}/recovery-context/").content.decode()
    read = PersonalDataRead.objects.get()
    assert (read.reader, read.where, str(read.task_id)) == (
        "user:priya (agent:privacy-tool)", "recovery context", task["task_id"])
