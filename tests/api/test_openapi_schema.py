"""The OpenAPI schema documents every operation: what it does, its parameters, its errors with examples."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from backplane.eventlog.event_types import SERVER_ONLY_TYPES

METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def schema(db: None) -> dict[str, Any]:
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def operations(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        op["operationId"]: op
        for item in schema["paths"].values()
        for method, op in item.items()
        if method in METHODS
    }


def test_every_operation_has_a_description_and_every_parameter_too(schema: dict[str, Any]) -> None:
    ops = operations(schema)
    assert len(ops) == 57, sorted(ops)
    for name, op in ops.items():
        assert len(op.get("description", "")) > 40, name
        for parameter in op.get("parameters", []):
            assert parameter.get("description"), (name, parameter["name"])


def test_the_api_description_states_the_transport_rules(schema: dict[str, Any]) -> None:
    description = schema["info"]["description"]
    for words in ("trailing `/`", "chunked", "64", "duplicate object keys", "surrogates", "U+0000", "415"):
        assert words in description, words


def test_every_4xx_response_has_an_example_in_the_error_shape(schema: dict[str, Any]) -> None:
    for name, op in operations(schema).items():
        for status, response in op["responses"].items():
            if not status.startswith(("4", "5")):
                continue
            assert response.get("description"), (name, status)
            content = response["content"]["application/json"]
            examples = content.get("examples") or {}
            assert examples, (name, status)
            for example in examples.values():
                body = example["value"]
                assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, (name, status)


def test_every_request_body_has_an_example(schema: dict[str, Any]) -> None:
    for name, op in operations(schema).items():
        if "requestBody" in op:
            assert op["requestBody"]["content"]["application/json"].get("examples"), name
            assert "415" in op["responses"], name


def test_the_append_operation_says_how_to_finish_or_fail_a_task(schema: dict[str, Any]) -> None:
    append = operations(schema)["tasks_events_append"]
    description = append["description"]
    for words in ("`TaskCompleted`", "`output`", "`TaskFailed`", "`error`", "`retryable`", "`payload` is required"):
        assert words in description, words
    for reserved in SERVER_ONLY_TYPES:
        assert f"`{reserved}`" in description, reserved
    examples = [e["value"] for e in append["requestBody"]["content"]["application/json"]["examples"].values()]
    assert {"TaskCompleted", "TaskFailed", "ReasoningStepCompleted"} <= {e["type"] for e in examples}
    completed = next(e for e in examples if e["type"] == "TaskCompleted")
    failed = next(e for e in examples if e["type"] == "TaskFailed")
    assert isinstance(completed["payload"]["output"], dict)
    assert isinstance(failed["payload"]["error"], str) and isinstance(failed["payload"]["retryable"], bool)
    conflicts = append["responses"]["409"]["content"]["application/json"]["examples"]
    assert {e["value"]["error"]["code"] for e in conflicts.values()} == {
        "seq_conflict", "stale_lease", "task_closed", "sandbox_refused", "budget_exceeded", "subject_erased"}


def test_the_create_operation_documents_task_ids_across_namespaces(schema: dict[str, Any]) -> None:
    create = operations(schema)["tasks_create"]
    assert "another one" in create["description"] and "task_exists" in create["description"]
    conflicts = create["responses"]["409"]["content"]["application/json"]["examples"]
    assert [e["value"]["error"]["code"] for e in conflicts.values()] == ["task_exists"]


def test_a_created_or_claimed_task_links_to_the_operations_on_it(schema: dict[str, Any]) -> None:
    ops = operations(schema)
    for producer, status in (("tasks_create", "201"), ("tasks_create", "200"), ("leases_claim", "200")):
        links = ops[producer]["responses"][status]["links"]
        assert {"GetTask", "AppendEvent", "Heartbeat", "Release", "DispatchToolCall"} <= set(links), producer
        for link in links.values():
            assert link["operationId"] in ops
    assert ops["tasks_tool_calls_dispatch"]["responses"]["201"]["links"]["RecordResult"]["parameters"] == {
        "key": "$response.body#/idempotency_key"}
