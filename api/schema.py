"""OpenAPI post-processing: say in the schema what the serializers enforce, describe the
parameters every route shares, and link the operations so clients and Schemathesis can
follow a task from its creation."""

from __future__ import annotations

from typing import Any

from api import bodies

PARAMETER_DESCRIPTIONS = {
    "task_id": "the task's id (a UUID); another namespace's task is 404",
    "key": "the tool call's idempotency key, 64 lowercase hex digits",
    "name": "the registered tool's name",
    "position": "the event's `position`",
    "dead_letter_id": "the dead letter's id",
}

# operation id -> where its answer keeps the task id (a JSON pointer into the response body)
_TASK_PRODUCERS = {
    "tasks_create": ("201", "200", "/task_id"),
    "leases_claim": ("200", None, "/task/task_id"),
    "tasks_subtasks_dispatch": ("201", "200", "/task/task_id"),
}
# operations that take {task_id} and what a link to them is called
_TASK_CONSUMERS = {
    "tasks_retrieve": "GetTask",
    "tasks_events_list": "ListEvents",
    "tasks_events_append": "AppendEvent",
    "tasks_events_batch_append": "AppendEvents",
    "tasks_verify": "VerifyChain",
    "tasks_heartbeat": "Heartbeat",
    "tasks_release": "Release",
    "tasks_recovery_context": "RecoveryContext",
    "tasks_tool_calls_dispatch": "DispatchToolCall",
    "tasks_subtasks_dispatch": "DispatchSubtask",
}


def add_declared_bodies(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """The agent routes' request bodies, declared in api/bodies.py, as the schema's components;
    an operation requires its body when the body has a required field (drf-spectacular takes a
    body given as a reference as optional; an empty body is read as ``{}``)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    declared = bodies.openapi_components()
    schemas.update(declared)
    result["components"]["schemas"] = dict(sorted(schemas.items()))
    with_required = {f"#/components/schemas/{name}" for name, schema in declared.items() if schema.get("required")}
    for operation in _operations(result).values():
        request_body = operation.get("requestBody", {})
        if any(media.get("schema", {}).get("$ref") in with_required
               for media in request_body.get("content", {}).values()):
            request_body["required"] = True
    return result


def forbid_unknown_request_fields(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Request bodies refuse unknown fields (StrictSerializer), so the schema says
    ``additionalProperties: false`` for them; response objects stay open for additions."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


def _operations(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        operation["operationId"]: operation
        for path_item in result.get("paths", {}).values()
        for method, operation in path_item.items()
        if isinstance(operation, dict) and "operationId" in operation
    }


TRANSPORT_RULES = """

Transport rules (docs/api.md, Conventions): every answer, errors included, is JSON; errors are
`{"error": {"code", "message", "details"}}`. A path without its trailing `/` is the same route
(never a redirect). Request bodies are `application/json` (anything else is `415
unsupported_media_type`) of at most 256 KiB by default, declared or sent with
`Transfer-Encoding: chunked` (`413 payload_too_large` past it). JSON nested deeper than 64
levels, duplicate object keys, lone UTF-16 surrogates, U+0000, numbers outside a double and any
other parse failure are `400 validation_error` with `details.body`."""


def describe_parameters_and_link_operations(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """Path parameters get their description; a task's producers link to every operation on it;
    the API's description says how requests travel."""
    info = result.setdefault("info", {})
    if TRANSPORT_RULES not in info.get("description", ""):
        info["description"] = info.get("description", "") + TRANSPORT_RULES
    operations = _operations(result)
    for operation in operations.values():
        for parameter in operation.get("parameters", []):
            if not parameter.get("description") and parameter.get("name") in PARAMETER_DESCRIPTIONS:
                parameter["description"] = PARAMETER_DESCRIPTIONS[parameter["name"]]
    for producer, (*statuses, pointer) in _TASK_PRODUCERS.items():
        for status in statuses:
            response = operations.get(producer, {}).get("responses", {}).get(status)
            if response is None:
                continue
            response["links"] = {
                link: {
                    "operationId": consumer,
                    "parameters": {"task_id": f"$response.body#{pointer}"},
                    "description": f"`{consumer}` on the task this answer names",
                }
                for consumer, link in _TASK_CONSUMERS.items()
                if consumer in operations
            }
    dispatch = operations.get("tasks_tool_calls_dispatch", {}).get("responses", {})
    for status in ("201", "200"):
        if status in dispatch:
            dispatch[status]["links"] = {
                link: {"operationId": consumer, "parameters": {"key": "$response.body#/idempotency_key"}}
                for consumer, link in (("tool_calls_retrieve", "GetToolCall"), ("tool_calls_result", "RecordResult"))
            }
    return result
