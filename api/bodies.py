"""The request bodies of the agent routes, declared once as msgspec structs: the routes validate
with them (``checked``) and the OpenAPI document describes them from the same declarations
(``openapi_components``, added by api/schema.py).

JSON's types are not coerced (``"5"`` is no integer, ``1`` no string, ``true`` no number), and a
field the struct does not declare is refused (so a client cannot believe it set ``seq``,
``namespace`` or ``status``). A string field is trimmed of whitespace at its ends before it is
checked, as the API has always taken them: an idempotency key or a tool name sent with a space
around it names what it named before (payloads and inputs are taken as sent). Optional fields default
to ``UNSET`` and are absent from the checked body, as they were absent from the request.

An error names every top-level field at fault at once, as ``details`` maps fields to messages
(docs/api.md): ``"This field is required."``, ``"Unknown field."``, or msgspec's words for the
value (``"Expected `int` >= 0"``), under the field's path (``events[2].type``).
"""

from __future__ import annotations

import enum
import functools
import re
import types as pytypes
import typing
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType
from msgspec import inspect as types
from rest_framework import exceptions

from backplane.eventlog.event_types import CLIENT_TYPE_PATTERN, SERVER_ONLY_TYPES

# --- the shapes of a field ----------------------------------------------------------------------

# PostgreSQL's integer, which steps are stored in.
STEP_MAX = 2**31 - 1

Name = Annotated[str, Meta(min_length=1, max_length=100)]
Text255 = Annotated[str, Meta(min_length=1, max_length=255)]
ToolName = Annotated[str, Meta(min_length=1, max_length=200)]
Step = Annotated[int, Meta(ge=0, le=STEP_MAX)]
Epoch = Annotated[int, Meta(ge=0)]
JSONObject = dict[str, Any]


class AnswerStatusEnum(enum.Enum):
    """A tool call's answer, as an agent records it and as the gateway and a sandbox give it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Body(Struct, forbid_unknown_fields=True):
    """A request body: its declared fields and no other."""


# --- tasks and events ---------------------------------------------------------------------------


class TaskCreateIn(Body):
    kind: Name
    input: JSONObject
    task_id: uuid.UUID | UnsetType = UNSET
    parent_task_id: uuid.UUID | None | UnsetType = UNSET
    max_attempts: Annotated[int, Meta(ge=1, le=100)] | UnsetType = UNSET
    metadata: JSONObject | UnsetType = UNSET


class OutboxItemIn(Body):
    """One message to publish with the event. Its headers are the server's (task, seq, event hash,
    agent, namespace): a client sets none."""

    # Reserved topics are refused in the service (eventlog/services.py), as reserved event types are.
    topic: Annotated[str, Meta(
        min_length=1, max_length=255,
        description="Routing key on the broker, matched by subscriptions' patterns. Topics beginning with "
                    "`backplane.` (in any case) belong to the server: 400 validation_error.",
    )]
    payload: JSONObject
    key: Annotated[str, Meta(
        min_length=1, max_length=255,
        description="Delivery order is kept per key within the writing agent's namespace (default: the task id).",
    )] | UnsetType = UNSET


EventType = Annotated[str, Meta(
    min_length=3, max_length=64, pattern=CLIENT_TYPE_PATTERN.pattern,
    description=(
        "PascalCase, matching ^[A-Z][A-Za-z0-9]{2,63}$. ReasoningStepCompleted needs an integer payload.step, "
        "TaskCompleted an object payload.output, TaskFailed a string payload.error and a boolean "
        "payload.retryable. Written only by the server, refused with 400 validation_error: "
        + ", ".join(sorted(SERVER_ONLY_TYPES)) + "."
    ),
)]
Outbox = Annotated[list[OutboxItemIn], Meta(max_length=1000)]


class EventFieldsIn(Body):
    """One event as a client writes it."""

    # The pattern is checked again, with the reserved names, in the service.
    type: EventType
    payload: Annotated[JSONObject, Meta(description="required (docs/api.md); `{}` when the type needs nothing")]
    idempotency_key: Text255 | None | UnsetType = UNSET
    lamport: Annotated[int, Meta(ge=0, le=2**62)] | UnsetType = UNSET
    causation_id: Text255 | None | UnsetType = UNSET
    correlation_id: Text255 | None | UnsetType = UNSET
    trace_id: Text255 | None | UnsetType = UNSET
    outbox: Outbox | UnsetType = UNSET


class EventAppendIn(EventFieldsIn):
    """One event as a client writes it, checked against the task's chain and lease."""

    expected_seq: Epoch | UnsetType = UNSET
    lease_epoch: Epoch | UnsetType = UNSET


class EventBatchIn(Body):
    """Events appended in one transaction: all of them, or none."""

    events: Annotated[list[EventFieldsIn], Meta(min_length=1, max_length=1000)]
    expected_seq: Epoch | UnsetType = UNSET
    lease_epoch: Epoch | UnsetType = UNSET


# --- leases, tool calls, sub-tasks, the gateway --------------------------------------------------


class LeaseClaimIn(Body):
    kinds: Annotated[list[Name], Meta(min_length=1, max_length=100)] | UnsetType = UNSET
    lease_seconds: Annotated[int, Meta(ge=1, le=3600)] | UnsetType = UNSET
    task_id: uuid.UUID | UnsetType = UNSET


class LeaseEpochIn(Body):
    lease_epoch: Epoch


class CompensationIn(Body):
    tool: ToolName
    input: JSONObject


# Why the agent makes a call, shown to the people a tool policy asks (docs/approvals.md).
ApprovalReason = Annotated[str, Meta(max_length=2000, description=(
    "why the agent makes this call; shown to the people whose approval a tool policy asks for"))]


class ToolCallDispatchIn(Body):
    step: Step
    tool: ToolName
    input: JSONObject
    lease_epoch: Epoch | UnsetType = UNSET
    compensation: CompensationIn | None | UnsetType = UNSET
    reason: ApprovalReason | UnsetType = UNSET


class ToolCallResultIn(Body):
    status: AnswerStatusEnum
    result: JSONObject
    lease_epoch: Epoch | UnsetType = UNSET
    cost: Annotated[JSONObject, Meta(
        description='what a paid tool charged: {"amount": "0.02", "currency": "USD"}')] | UnsetType = UNSET


class SubtaskIn(Body):
    step: Step
    kind: Name
    input: JSONObject
    lease_epoch: Epoch | UnsetType = UNSET


class ToolInvokeIn(Body):
    task_id: uuid.UUID
    step: Step
    input: JSONObject
    lease_epoch: Epoch | UnsetType = UNSET
    reason: ApprovalReason | UnsetType = UNSET


# --- forks --------------------------------------------------------------------------------------

REASON_MAX_CHARS = 1000


class ToolAnswerIn(Body):
    step: Step
    tool: ToolName
    status: AnswerStatusEnum
    result: JSONObject


class TaskForkIn(Body):
    at_seq: Annotated[int, Meta(ge=1, le=STEP_MAX)]
    reason: Annotated[str, Meta(min_length=1, max_length=REASON_MAX_CHARS)]
    input: JSONObject | UnsetType = UNSET
    task_id: uuid.UUID | UnsetType = UNSET
    sandbox: bool | UnsetType = UNSET
    tool_answers: Annotated[list[ToolAnswerIn], Meta(max_length=1000)] | UnsetType = UNSET


# --- the answers -------------------------------------------------------------------------------
# What the agent routes answer, as their handlers build it (api/serializers.py's ``*_as_api_dict``,
# api/recovery.py's); tests/api/test_bodies.py holds each answer to its declaration. An answer
# may gain fields in a minor release, so these take fields they do not declare.

Timestamp = Annotated[str, Meta(description="RFC 3339, UTC")]


class Answer(Struct):
    """An answer's body."""


# The schema's name for a task's status since the first docs/openapi.yaml (clients generated from
# it name their type after it), so not TaskStatus itself; tests/api/test_bodies.py holds the two equal.
class TaskOutStatusEnum(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"


class LeaseOut(Answer):
    agent: str
    epoch: int
    expires_at: Timestamp | None


class ForkedFromOut(Answer):
    task_id: uuid.UUID
    at_seq: int


class TaskOut(Answer):
    """The Task object of docs/api.md, with where a fork continues from (``forked_from``, null
    for a task that is no fork) and whether it is a sandbox."""

    task_id: uuid.UUID
    namespace: str
    kind: str
    status: TaskOutStatusEnum
    input: JSONObject
    output: JSONObject | None
    error: str | None
    parent_task_id: uuid.UUID | None
    attempts: int
    max_attempts: int
    lease: LeaseOut | None
    last_seq: int
    head_hash: str
    created_at: Timestamp
    updated_at: Timestamp
    last_event_at: Timestamp | None
    forked_from: ForkedFromOut | None
    sandbox: bool


class TaskListOut(Answer):
    results: list[TaskOut]
    next: Annotated[str, Meta(extra_json_schema={"format": "uri"})] | None


# Field for field the row it is made from (eventlog/selectors.py's EventRow): this is the answer's
# declaration, which the schema is generated from; that, the columns the events page reads.
class EventOut(Answer):
    """The Event object of docs/api.md; ``hash`` covers every field but itself and ``position``."""

    task_id: uuid.UUID
    seq: int
    position: int
    type: str
    payload: JSONObject
    agent: str | None
    idempotency_key: str | None
    lamport: int
    causation_id: str | None
    correlation_id: str | None
    trace_id: str | None
    recorded_at: Timestamp
    prev_hash: str
    hash: str


class EventListOut(Answer):
    results: list[EventOut]
    next_after_seq: int | None


class EventBatchOut(Answer):
    results: list[EventOut]


class LeaseClaimOut(Answer):
    task: TaskOut
    lease_epoch: int
    expires_at: Timestamp
    recovered: bool


class HeartbeatOut(Answer):
    expires_at: Timestamp


class ToolCallDispatchOutStatusEnum(enum.Enum):
    DISPATCHED = "dispatched"
    IN_FLIGHT = "in_flight"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ToolCallDispatchOut(Answer, kw_only=True):
    idempotency_key: str
    effect_key: str
    status: ToolCallDispatchOutStatusEnum
    dispatched_at: Timestamp | UnsetType = UNSET
    result: JSONObject | None | UnsetType = UNSET
    replayed: bool


class ToolCallOutStatusEnum(enum.Enum):
    IN_FLIGHT = "in_flight"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ToolCallOut(Answer):
    idempotency_key: str
    effect_key: str
    task_id: uuid.UUID
    step: int
    tool: str
    input: JSONObject
    compensation: JSONObject | None
    status: ToolCallOutStatusEnum
    result: JSONObject | None
    dispatched_at: Timestamp
    completed_at: Timestamp | None
    expires_at: Timestamp
    replayed: bool | UnsetType = UNSET


class SubtaskOut(Answer):
    task: TaskOut
    dispatch_key: str


class ToolInvokeOut(Answer):
    idempotency_key: str
    status: AnswerStatusEnum
    result: JSONObject
    replayed: bool


class ApprovalStatusEnum(enum.Enum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


class AwaitingApprovalStatusEnum(enum.Enum):
    AWAITING_APPROVAL = "awaiting_approval"


class AwaitingApprovalOut(Answer):
    """A gated call's dispatch: not made; its approval request, which the same dispatch finds again."""

    status: AwaitingApprovalStatusEnum
    approval_id: uuid.UUID
    idempotency_key: str
    argument_sha256: str
    policy_id: int
    policy_version: int
    group: str
    approvals_required: int
    expires_at: Timestamp


class ApprovalDecisionOut(Answer):
    by: str
    verdict: str
    reason: str
    at: Timestamp


class ApprovalOut(Answer):
    approval_id: uuid.UUID
    task_id: uuid.UUID
    step: int
    tool: str
    idempotency_key: str
    input: JSONObject
    argument_sha256: str
    reason: str
    requested_by: str
    requested_at: Timestamp
    policy_id: int
    policy_version: int
    status: ApprovalStatusEnum
    approvals_required: int
    group: str
    escalated: bool
    expires_at: Timestamp
    decided_at: Timestamp | None
    decisions: list[ApprovalDecisionOut]


class ApprovalListOut(Answer):
    results: list[ApprovalOut]


# --- signals ------------------------------------------------------------------------------------

class SignalWaitIn(Body):
    timeout_seconds: Annotated[int, Meta(ge=1, le=30 * 24 * 3600, description="how long to wait, 1 s to 30 days")]
    lease_epoch: Epoch | UnsetType = UNSET


class SignalSendIn(Body):
    payload: JSONObject


class SignalStatusEnum(enum.Enum):
    WAITING = "waiting"
    RECEIVED = "received"
    TIMED_OUT = "timed_out"


class SignalOut(Answer):
    task_id: uuid.UUID
    name: str
    status: SignalStatusEnum
    payload: JSONObject | None
    awaited_by: str
    awaited_at: Timestamp | None
    expires_at: Timestamp | None
    sent_by: str
    received_at: Timestamp | None
    timed_out_at: Timestamp | None


class SignalWaitOut(SignalOut):
    callback_url: Annotated[str, Meta(description="sends this one signal with no credentials: "
                                                  "POST it `{\"payload\": {…}}`")]


def answer_ref(answer_type: type[Answer]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{answer_type.__name__}"}


# --- checking a body ----------------------------------------------------------------------------


REQUIRED = "This field is required."
UNKNOWN = "Unknown field."
# msgspec's message for a value, and where in the value it is: "Expected `str`, got `int` - at `$[0].topic`".
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def checked(body_type: type[Body], data: Any) -> dict[str, Any]:
    """``data`` (parsed JSON) as ``body_type`` takes it, as a dict of the fields it holds (a UUID
    field as a ``uuid.UUID``); a ``ValidationError`` naming each field at fault if it does not."""
    data = _trimmer(body_type)(data)
    try:
        body = msgspec.convert(data, body_type, strict=True)
    except msgspec.ValidationError:
        raise exceptions.ValidationError(faults(body_type, data)) from None
    as_dict: dict[str, Any] = msgspec.to_builtins(body, builtin_types=(uuid.UUID,))
    return as_dict


def faults(body_type: type[Body], data: Any) -> dict[str, str]:
    """Every field of ``data`` that ``body_type`` refuses, by path, with why: msgspec stops at
    the first fault, and a client fixing a body should learn of all of them at once."""
    return _faults(body_type, data, "")


def _faults(value_type: Any, value: Any, path: str) -> dict[str, str]:
    try:
        msgspec.convert(value, value_type, strict=True)
    except msgspec.ValidationError as exc:
        match = _AT.match(str(exc))
        assert match is not None  # the pattern matches any text
        message, deeper = match["message"], bool(match["path"])
    else:
        return {}
    options = _options(value_type)
    struct = next((option for option in options if isinstance(option, type) and issubclass(option, Struct)), None)
    items = next((typing.get_args(option)[0] for option in options if typing.get_origin(option) is list), None)
    found: dict[str, str] = {}
    if type(value) is dict and struct is not None:
        found = _field_faults(struct, value, path)
    elif type(value) is list and items is not None and deeper:
        for index, item in enumerate(value):
            found.update(_faults(items, item, f"{path}[{index}]"))
    # The value's own fault (a list's length, a wrong type), or one its parts alone do not show.
    return found or {path or "body": message}


def _field_faults(struct: type[Struct], value: dict[str, Any], path: str) -> dict[str, str]:
    fields = {field.encode_name: field for field in msgspec.structs.fields(struct)}
    found = {_joined(path, name): UNKNOWN for name in sorted(set(value) - set(fields))}
    for name, field in fields.items():
        if name in value:
            found.update(_faults(field.type, value[name], _joined(path, name)))
        elif field.required:
            found[_joined(path, name)] = REQUIRED
    return found


def _joined(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _options(value_type: Any) -> list[Any]:
    """The types a declared type may be: ``Annotated`` unwrapped, a union's members."""
    origin = typing.get_origin(value_type)
    if origin is typing.Annotated:
        return _options(typing.get_args(value_type)[0])
    if origin is typing.Union or origin is pytypes.UnionType:
        return [option for member in typing.get_args(value_type) for option in _options(member)]
    return [value_type]


Trim = Callable[[Any], Any]


@functools.cache
def _trimmer(body_type: type[Body]) -> Trim:
    """The function that trims ``body_type``'s strings in a parsed body, built once per body."""
    return _trim_of(types.type_info(body_type)) or _as_sent


def _as_sent(value: Any) -> Any:
    return value


def _trim_of(value_type: types.Type) -> Trim | None:
    """A function returning a value with every string that ``value_type`` declares a string
    trimmed at its ends, in nested objects and lists too; None where it declares none. JSON
    objects declared as such (payloads, inputs) are left as sent, and so is a value of another
    type than declared (its check refuses it)."""
    options = value_type.types if isinstance(value_type, types.UnionType) else (value_type,)
    by_json_type: dict[type, Trim] = {}
    for option in options:
        option = option.type if isinstance(option, types.Metadata) else option  # a described type
        if isinstance(option, types.StrType):
            by_json_type[str] = str.strip
        elif isinstance(option, types.ListType) and (item := _trim_of(option.item_type)) is not None:
            by_json_type[list] = functools.partial(_trim_list, item)
        elif isinstance(option, types.StructType):
            fields = {field.encode_name: trim for field in option.fields
                      if (trim := _trim_of(field.type)) is not None}
            if fields:
                by_json_type[dict] = functools.partial(_trim_object, fields)
    if not by_json_type:
        return None
    return functools.partial(_trim_by_type, by_json_type)


def _trim_by_type(by_json_type: dict[type, Trim], value: Any) -> Any:
    trim = by_json_type.get(type(value))
    return value if trim is None else trim(value)


def _trim_list(item: Trim, value: list[Any]) -> list[Any]:
    return [item(element) for element in value]


def _trim_object(fields: dict[str, Trim], value: dict[str, Any]) -> dict[str, Any]:
    trimmed = dict(value)
    for name, trim in fields.items():
        if name in trimmed:
            trimmed[name] = trim(trimmed[name])
    return trimmed


# --- the OpenAPI document -----------------------------------------------------------------------

# Each body's component in the OpenAPI document: its class name and "Request", as drf-spectacular
# names the request half of a component it splits; an answer's, its class name.
REQUEST_SUFFIX = "Request"


def request_ref(body_type: type[Body]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{body_type.__name__}{REQUEST_SUFFIX}"}


BODIES: tuple[type[Body], ...] = (
    TaskCreateIn, EventAppendIn, EventBatchIn, LeaseClaimIn, LeaseEpochIn, ToolCallDispatchIn,
    ToolCallResultIn, SubtaskIn, ToolInvokeIn, TaskForkIn, SignalWaitIn, SignalSendIn,
)
ANSWERS: tuple[type[Answer], ...] = (
    TaskOut, TaskListOut, EventOut, EventListOut, EventBatchOut, LeaseClaimOut, HeartbeatOut,
    ToolCallDispatchOut, ToolCallOut, SubtaskOut, ToolInvokeOut, AwaitingApprovalOut, ApprovalOut,
    ApprovalListOut, SignalOut, SignalWaitOut,
)


def openapi_components() -> dict[str, dict[str, Any]]:
    """The bodies and answers (and the structs and enums inside them) as OpenAPI 3.0 schema
    components, by name: a body's named with ``REQUEST_SUFFIX``.

    msgspec writes JSON Schema 2020-12; OpenAPI 3.0 has no ``null`` type and says ``nullable``
    instead, and a ``$ref`` takes no siblings there, so a nullable reference is an ``allOf``."""
    _, components = msgspec.json.schema_components((*BODIES, *ANSWERS), ref_template="#/components/schemas/{name}")
    bodies = {name for name in components if _is_body(name)}
    named = {name: f"{name}{REQUEST_SUFFIX}" if name in bodies else name for name in components}
    refs = {f"#/components/schemas/{old}": f"#/components/schemas/{new}" for old, new in named.items()}
    return {named[name]: _openapi_30(schema, refs) for name, schema in components.items()}


def _is_body(name: str) -> bool:
    found = globals().get(name)
    return isinstance(found, type) and issubclass(found, Body)


def _openapi_30(schema: Any, refs: dict[str, str]) -> Any:
    if isinstance(schema, list):
        return [_openapi_30(item, refs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    # A title repeats the component's name; OpenAPI 3.0 wants a ``required`` list non-empty or absent.
    schema = {key: _openapi_30(value, refs) for key, value in schema.items() if key != "title" and value != []}
    if "$ref" in schema:
        schema["$ref"] = refs[schema["$ref"]]
    any_of = schema.get("anyOf")
    if any_of is not None and {"type": "null"} in any_of:
        others = [option for option in any_of if option != {"type": "null"}]
        del schema["anyOf"]
        only = others[0] if len(others) == 1 else {"anyOf": others}
        schema.update({"allOf": [only]} if "$ref" in only else only)
        schema["nullable"] = True
    if "enum" in schema and "type" not in schema and all(isinstance(item, str) for item in schema["enum"]):
        schema["type"] = "string"
    return schema
