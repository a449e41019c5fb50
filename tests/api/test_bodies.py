"""The agent routes' bodies and answers (api/bodies.py): declared once, a body checked from its
declaration with every fault named by its path, each answer holding to its declaration, and the
OpenAPI document's components made from the same structs."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import exceptions

from api import bodies
from api.bodies import (
    EventAppendIn,
    EventBatchIn,
    EventBatchOut,
    EventListOut,
    EventOut,
    HeartbeatOut,
    LeaseClaimOut,
    SubtaskOut,
    TaskCreateIn,
    TaskForkIn,
    TaskListOut,
    TaskOut,
    ToolCallDispatchIn,
    ToolCallDispatchOut,
    ToolCallOut,
    checked,
)
from backplane.eventlog.models import TaskStatus
from tests.api.conftest import AgentClient


def refusal(body_type: type[bodies.Body], data: Any) -> dict[str, str]:
    with pytest.raises(exceptions.ValidationError) as raised:
        checked(body_type, data)
    detail = raised.value.detail
    assert isinstance(detail, dict)
    return {name: str(message) for name, message in detail.items()}


def test_a_body_it_takes_is_a_dict_of_the_fields_sent() -> None:
    sent = {"type": "LeadScored", "payload": {"score": 1}, "lamport": 3, "outbox": [{"topic": "t", "payload": {}}]}
    assert checked(EventAppendIn, sent) == sent  # optional fields not sent stay absent
    assert checked(EventAppendIn, {**sent, "idempotency_key": None})["idempotency_key"] is None


def test_every_field_at_fault_is_named_at_once_with_its_path() -> None:
    assert refusal(EventAppendIn, {}) == {"type": "This field is required.", "payload": "This field is required."}
    assert refusal(EventAppendIn, {"type": "LeadScored", "payload": {}, "seq": 2, "status": "x"}) == {
        "seq": "Unknown field.", "status": "Unknown field."}
    faults = refusal(EventBatchIn, {"events": [{"type": "LeadScored"}, {"type": "LeadScored", "payload": {}},
                                               {"type": "x", "payload": {}, "outbox": [{"topic": 1, "payload": {}}]}],
                                    "lease_epoch": -1})
    assert set(faults) == {"events[0].payload", "events[2].type", "events[2].outbox[0].topic", "lease_epoch"}
    assert faults["events[0].payload"] == "This field is required."
    dispatch = {"step": 0, "tool": "t", "input": {}, "compensation": {"tool": "u", "x": 1}}
    assert refusal(ToolCallDispatchIn, dispatch) == {
        "compensation.input": "This field is required.", "compensation.x": "Unknown field."}


def test_json_types_are_not_coerced() -> None:
    for value in (True, 1.0, "5", None):
        assert set(refusal(EventAppendIn, {"type": "LeadScored", "payload": {}, "lamport": value})) == {"lamport"}
    assert set(refusal(EventAppendIn, {"type": "LeadScored", "payload": {}, "idempotency_key": 7})) == {
        "idempotency_key"}
    assert set(refusal(TaskForkIn, {"at_seq": 1, "reason": "r", "sandbox": 1})) == {"sandbox"}
    assert set(refusal(TaskCreateIn, {"kind": "k", "input": {}, "task_id": False})) == {"task_id"}
    assert refusal(EventAppendIn, ["not", "an", "object"]) == {"body": "Expected `object`, got `array`"}


def test_bounds_hold_on_lengths_numbers_and_lists() -> None:
    base = {"type": "LeadScored", "payload": {}}
    assert set(refusal(EventAppendIn, {**base, "lamport": 2**62 + 1})) == {"lamport"}
    assert checked(EventAppendIn, {**base, "lamport": 2**62})["lamport"] == 2**62
    assert set(refusal(EventAppendIn, {**base, "idempotency_key": "k" * 256})) == {"idempotency_key"}
    assert set(refusal(EventAppendIn, {**base, "outbox": [{"topic": "t", "payload": {}}] * 1001})) == {"outbox"}
    assert set(refusal(EventBatchIn, {"events": []})) == {"events"}
    assert set(refusal(EventAppendIn, {"type": "lowercase", "payload": {}})) == {"type"}


def test_strings_are_trimmed_before_they_are_checked_and_payloads_are_not() -> None:
    data = checked(EventAppendIn, {"type": " LeadScored ", "payload": {"note": "  kept  "}, "idempotency_key": "  k\n",
                                   "outbox": [{"topic": " leads.scored ", "payload": {" a ": " b "}}]})
    assert (data["type"], data["idempotency_key"], data["outbox"][0]["topic"]) == ("LeadScored", "k", "leads.scored")
    assert data["payload"] == {"note": "  kept  "} and data["outbox"][0]["payload"] == {" a ": " b "}
    assert set(refusal(EventAppendIn, {"type": "LeadScored", "payload": {}, "idempotency_key": "   "})) == {
        "idempotency_key"}
    batch = checked(EventBatchIn, {"events": [{"type": "LeadScored ", "payload": {}}]})
    assert batch["events"][0]["type"] == "LeadScored"


def test_a_uuid_is_taken_in_any_form_and_given_as_a_uuid() -> None:
    printed = "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"
    for sent in (printed, printed.upper(), printed.replace("-", "")):
        assert checked(TaskCreateIn, {"kind": "k", "input": {}, "task_id": sent})["task_id"] == uuid.UUID(printed)
    assert set(refusal(TaskCreateIn, {"kind": "k", "input": {}, "task_id": "not-a-uuid"})) == {"task_id"}


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                         st.sampled_from(["", " ", "LeadScored", "x" * 256, "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


def body_of(body_type: type[bodies.Body]) -> st.SearchStrategy[Any]:
    """Dicts of the declaration's own field names (and one it does not know) with any JSON values,
    and mostly right values for the fields of an event, so acceptance is exercised too."""
    names = [*(field.encode_name for field in msgspec.structs.fields(body_type)), "unknown"]
    event = st.fixed_dictionaries({"type": st.sampled_from(["LeadScored", " LeadScored", "x"]),
                                   "payload": st.dictionaries(st.text(max_size=3), json_scalars, max_size=2)})
    value = st.one_of(json_values, event, st.lists(event, max_size=3), st.integers(min_value=-1, max_value=3))
    return st.one_of(json_values, st.dictionaries(st.sampled_from(names), value, max_size=len(names)))


@pytest.mark.parametrize("body_type", bodies.BODIES, ids=lambda body_type: body_type.__name__)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_json_is_taken_or_refused_with_each_fault_named(body_type: type[bodies.Body], data: st.DataObject) -> None:
    body = data.draw(body_of(body_type))
    try:
        taken = checked(body_type, body)
    except exceptions.ValidationError as refused:
        assert isinstance(refused.detail, dict) and refused.detail, body
        assert all(isinstance(name, str) and str(message) for name, message in refused.detail.items())
        return
    # What it takes, it takes again unchanged (a UUID printed as the API prints one).
    printed = {name: str(value) if isinstance(value, uuid.UUID) else value for name, value in taken.items()}
    assert checked(body_type, printed) == taken


def test_the_openapi_components_are_the_declarations_in_openapi_3_0() -> None:
    components = bodies.openapi_components()
    for body_type in bodies.BODIES:
        assert f"{body_type.__name__}Request" in components
    assert "CompensationInRequest" in components and "OutboxItemInRequest" in components  # nested structs
    dispatch = components["ToolCallDispatchInRequest"]
    assert dispatch["properties"]["compensation"] == {
        "allOf": [{"$ref": "#/components/schemas/CompensationInRequest"}], "nullable": True}
    assert dispatch["required"] == ["step", "tool", "input"] and dispatch["additionalProperties"] is False
    key = components["EventAppendInRequest"]["properties"]["idempotency_key"]
    assert key == {"type": "string", "maxLength": 255, "minLength": 1, "nullable": True}
    assert "required" not in components["LeaseClaimInRequest"]  # every field optional: no empty list
    assert components["ToolCallResultInRequest"]["properties"]["status"] == {
        "$ref": "#/components/schemas/AnswerStatusEnum"}
    assert components["AnswerStatusEnum"]["enum"] == ["failed", "succeeded"]
    assert components["TaskOut"]["properties"]["lease"] == {"allOf": [{"$ref": "#/components/schemas/LeaseOut"}],
                                                           "nullable": True}
    assert "additionalProperties" not in components["TaskOut"]  # an answer may gain fields


def conforms(answer: Any, answer_type: type[bodies.Answer]) -> dict[str, Any]:
    """The answer's body holds exactly the declared fields, each of the declared type."""
    body = answer.json()
    msgspec.convert(body, answer_type, strict=True)  # a wrong type or a missing field raises
    declared = {field.encode_name for field in msgspec.structs.fields(answer_type)}
    required = {field.encode_name for field in msgspec.structs.fields(answer_type) if field.required}
    assert required <= set(body) <= declared, (answer_type.__name__, set(body) ^ declared)
    return body


@pytest.mark.django_db
def test_every_agent_routes_answer_is_its_declaration(alice: AgentClient) -> None:
    created = conforms(alice.post("/api/v1/tasks/", {"kind": "lead-qualification", "input": {"n": 1}},
                                  format="json"), TaskOut)
    task = f"/api/v1/tasks/{created['task_id']}/"
    conforms(alice.get(task), TaskOut)
    conforms(alice.get("/api/v1/tasks/?limit=1"), TaskListOut)
    lease = conforms(alice.post("/api/v1/leases/", {"task_id": created["task_id"]}, format="json"), LeaseClaimOut)
    epoch = lease["lease_epoch"]
    conforms(alice.post(f"{task}heartbeat/", {"lease_epoch": epoch}, format="json"), HeartbeatOut)
    step = {"type": "ReasoningStepCompleted", "payload": {"step": 1}, "lease_epoch": epoch}
    conforms(alice.post(f"{task}events/", step, format="json"), EventOut)
    conforms(alice.post(f"{task}events/batch/", {"events": [{"type": "Noted", "payload": {}}], "lease_epoch": epoch},
                        format="json"), EventBatchOut)
    conforms(alice.get(f"{task}events/"), EventListOut)
    dispatch = {"step": 2, "tool": "crm.lookup", "input": {"q": "a"}, "lease_epoch": epoch}
    dispatched = conforms(alice.post(f"{task}tool-calls/", dispatch, format="json"), ToolCallDispatchOut)
    replayed = conforms(alice.post(f"{task}tool-calls/", dispatch, format="json"), ToolCallDispatchOut)
    assert replayed["replayed"] is True
    call = f"/api/v1/tool-calls/{dispatched['idempotency_key']}/"
    conforms(alice.get(call), ToolCallOut)
    conforms(alice.post(f"{call}result/", {"status": "succeeded", "result": {"ok": True}, "lease_epoch": epoch},
                        format="json"), ToolCallOut)
    conforms(alice.post(f"{task}subtasks/", {"step": 3, "kind": "outreach", "input": {}, "lease_epoch": epoch},
                        format="json"), SubtaskOut)
    conforms(alice.post(f"{task}release/", {"lease_epoch": epoch}, format="json"), TaskOut)
    conforms(alice.post(f"{task}fork/", {"at_seq": 2, "reason": "try again"}, format="json"), TaskOut)


def test_the_answer_s_task_statuses_are_the_model_s() -> None:
    assert [(status.name, status.value) for status in bodies.TaskOutStatusEnum] == [
        (status.name, status.value) for status in TaskStatus]
