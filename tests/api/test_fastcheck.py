"""The agent routes' compiled checks may only be stricter than the serializers they come from.

For every generated body: when the compiled check accepts it, the DRF serializer accepts it too
and validates it to exactly the same data. (When the check declines, the route runs the
serializer itself, so the answer is DRF's whatever the check thought.)
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework import serializers

from api import fastcheck
from api.serializers import EventAppendIn, EventBatchIn, StrictSerializer, TaskCreateIn

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63), st.floats(allow_nan=False,
                                                                                         allow_infinity=False),
    st.text(max_size=8), st.sampled_from(["", " ", " x", "x ", "LeadScored", "ReasoningStepCompleted", "TaskFailed",
                                          "x" * 255, "x" * 256, "lower", "Ab", "TaskStarted"]),
)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)

# Values near each field's edges: right and wrong types, bounds, blanks, whitespace, nulls.
field_values = st.one_of(
    json_values,
    st.integers(min_value=-2, max_value=2), st.just(2**62), st.just(2**62 + 1),
    st.dictionaries(st.sampled_from(["step", "output", "error", "retryable", "note"]), json_values, max_size=3),
)
outbox_items: st.SearchStrategy[dict[str, Any]] = st.dictionaries(st.sampled_from(["topic", "payload", "key", "extra"]),
                               st.one_of(field_values, st.just({}), st.just("t")), max_size=4)
event_fields = ["type", "payload", "idempotency_key", "lamport", "causation_id", "correlation_id", "trace_id",
                "outbox", "expected_seq", "lease_epoch", "unknown"]


def bodies(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    value = st.one_of(field_values, st.lists(outbox_items, max_size=2))
    return st.dictionaries(st.sampled_from(names), value, max_size=len(names))


def plausible_event() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly-valid events, so that acceptance (not only refusal) is exercised."""
    return st.fixed_dictionaries(
        {"type": st.sampled_from(["LeadScored", "ReasoningStepCompleted", "x", " LeadScored", "LeadScored "]),
         "payload": st.dictionaries(st.text(max_size=4), json_scalars, max_size=2)},
        optional={"idempotency_key": st.one_of(st.none(), st.text(max_size=6)),
                  "lamport": st.one_of(st.integers(min_value=-1, max_value=3), st.booleans()),
                  "trace_id": st.one_of(st.none(), st.text(max_size=3)),
                  "outbox": st.lists(st.fixed_dictionaries({"topic": st.text(max_size=3), "payload": st.just({})},
                                                           optional={"key": st.text(max_size=3)}), max_size=2),
                  "expected_seq": st.integers(min_value=-1, max_value=3),
                  "lease_epoch": st.one_of(st.none(), st.integers(min_value=-1, max_value=3))},
    )


def assert_never_looser(serializer_class: type[StrictSerializer], body: Any) -> bool:
    accepted = fastcheck.compile_check(serializer_class)(body)
    if accepted is None:
        return False
    serializer = serializer_class(data=body)
    assert serializer.is_valid(), (body, serializer.errors)
    assert _plain(serializer.validated_data) == accepted
    return True


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(bodies(event_fields))
def test_the_append_check_is_never_looser_than_its_serializer(body: dict[str, Any]) -> None:
    assert_never_looser(EventAppendIn, body)


@SETTINGS
@given(plausible_event())
def test_plausible_appends_are_judged_the_same(body: dict[str, Any]) -> None:
    assert_never_looser(EventAppendIn, body)


@SETTINGS
@given(st.fixed_dictionaries({"events": st.lists(plausible_event().map(
    lambda e: {k: v for k, v in e.items() if k not in {"expected_seq", "lease_epoch"}}), max_size=3)},
    optional={"expected_seq": st.integers(min_value=-1, max_value=2), "lease_epoch": st.integers(-1, 2),
              "extra": st.just(1)}))
def test_the_batch_check_is_never_looser_than_its_serializer(body: dict[str, Any]) -> None:
    assert_never_looser(EventBatchIn, body)


def test_it_accepts_the_common_bodies_itself() -> None:
    """Not a check that declines everything: the bodies agents send take the fast path."""
    check = fastcheck.compile_check(EventAppendIn)
    bodies: tuple[dict[str, Any], ...] = (
        {"type": "ReasoningStepCompleted", "payload": {"step": 3}, "idempotency_key": "k", "lease_epoch": 4},
        {"type": "LeadScored", "payload": {}, "expected_seq": 5, "outbox": [{"topic": "t", "payload": {}}]},
        {"type": "TaskCompleted", "payload": {"output": {}}, "trace_id": None},
    )
    for body in bodies:
        assert check(body) == body
        assert assert_never_looser(EventAppendIn, body)
    batch = {"events": [{"type": "LeadScored", "payload": {}}], "lease_epoch": 1}
    assert fastcheck.compile_check(EventBatchIn)(batch) == batch


@pytest.mark.parametrize(
    "body",
    [
        {"type": " LeadScored", "payload": {}},  # DRF trims: the serializer must decide
        {"type": "LeadScored", "payload": {}, "idempotency_key": "key "},
        {"type": "LeadScored", "payload": {}, "idempotency_key": ""},
        {"type": "LeadScored", "payload": {}, "lamport": True},
        {"type": "LeadScored", "payload": {}, "lamport": 2**62 + 1},
        {"type": "LeadScored", "payload": []},
        {"type": "lower", "payload": {}},
        {"type": "LeadScored"},
        {"type": "LeadScored", "payload": {}, "seq": 3},
        {"type": "LeadScored", "payload": {}, "outbox": [{"topic": "t"}]},
        {"type": "LeadScored", "payload": {}, "outbox": [{"topic": "t", "payload": {}}] * 1001},
        [],
    ],
)
def test_it_declines_what_the_serializer_refuses_or_normalises(body: Any) -> None:
    assert fastcheck.compile_check(EventAppendIn)(body) is None


def test_a_serializer_it_cannot_reproduce_is_refused_at_compile_time() -> None:
    class WithDefault(StrictSerializer):
        n = serializers.IntegerField(default=3)

    with pytest.raises(fastcheck.NotCompilable):
        fastcheck.compile_check(WithDefault)


def test_a_field_type_it_does_not_know_is_refused_at_compile_time() -> None:
    class WithTime(StrictSerializer):
        at = serializers.DateTimeField()  # parsing times is DRF's job

    with pytest.raises(fastcheck.NotCompilable):
        fastcheck.compile_check(WithTime)


@pytest.mark.parametrize("value", ["6B1C9A7E-3F1D-4C36-9D0E-2A5C8B7D4E11", "6b1c9a7e3f1d4c369d0e2a5c8b7d4e11",
                                   " 6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11", "6b1c9a7e", 7, None])
def test_a_uuid_in_any_other_form_than_the_printed_one_is_left_to_the_serializer(value: Any) -> None:
    assert fastcheck.compile_check(TaskCreateIn)({"kind": "k", "input": {}, "task_id": value}) is None


def test_a_printed_uuid_is_taken_as_the_serializer_takes_it() -> None:
    printed = "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"
    body = {"kind": "k", "input": {}, "task_id": printed}
    assert fastcheck.compile_check(TaskCreateIn)(body) == {**body, "task_id": uuid.UUID(printed)}
    assert assert_never_looser(TaskCreateIn, body)


tool_call_fields = st.dictionaries(
    st.sampled_from(["step", "tool", "input", "lease_epoch", "compensation", "status", "result", "kinds",
                     "lease_seconds", "task_id", "other"]),
    st.one_of(field_values, st.sampled_from(["succeeded", "failed", "dispatched", " succeeded",
                                             "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11",
                                             "6B1C9A7E-3F1D-4C36-9D0E-2A5C8B7D4E11"]),
              st.fixed_dictionaries({"tool": st.sampled_from(["undo", " undo", ""]), "input": st.just({})}),
              st.lists(st.sampled_from(["kind-a", " b", "", "x" * 101]), max_size=3)),
    max_size=6,
)


@SETTINGS
@given(tool_call_fields)
def test_the_lease_and_tool_call_checks_are_never_looser_than_their_serializers(body: dict[str, Any]) -> None:
    from api.recovery import LeaseClaimIn, LeaseEpochIn, ToolCallDispatchIn, ToolCallResultIn

    for serializer_class in (LeaseClaimIn, LeaseEpochIn, ToolCallDispatchIn, ToolCallResultIn):
        assert_never_looser(serializer_class, body)


def test_the_lease_and_tool_call_bodies_agents_send_take_the_fast_path() -> None:
    from api.recovery import LeaseClaimIn, LeaseEpochIn, ToolCallDispatchIn, ToolCallResultIn

    for serializer_class, body in (
        (LeaseClaimIn, {"kinds": ["lead-qualification"], "lease_seconds": 60}),
        (LeaseClaimIn, {"task_id": "6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11"}),
        (LeaseEpochIn, {"lease_epoch": 4}),
        (ToolCallDispatchIn, {"step": 3, "tool": "crm.lookup", "input": {"email": "a@b"}, "lease_epoch": 4,
                              "compensation": {"tool": "crm.forget", "input": {}}}),
        (ToolCallDispatchIn, {"step": 0, "tool": "t", "input": {}, "compensation": None}),
        (ToolCallResultIn, {"status": "succeeded", "result": {"ok": True}, "lease_epoch": 4}),
    ):
        assert assert_never_looser(serializer_class, body), serializer_class


fork_and_dispatch_fields = st.dictionaries(
    st.sampled_from(["at_seq", "reason", "input", "task_id", "sandbox", "tool_answers", "step", "kind",
                     "lease_epoch", "other"]),
    st.one_of(field_values, st.booleans(), st.sampled_from(["6b1c9a7e-3f1d-4c36-9d0e-2a5c8b7d4e11", " why", "why"]),
              st.lists(st.fixed_dictionaries({"step": st.integers(min_value=-1, max_value=2),
                                              "tool": st.sampled_from(["t", " t", ""]),
                                              "status": st.sampled_from(["succeeded", "failed", "x"]),
                                              "result": st.one_of(st.just({}), st.just([]))}), max_size=2)),
    max_size=6,
)


@SETTINGS
@given(fork_and_dispatch_fields)
def test_the_fork_sub_task_and_invoke_checks_are_never_looser_than_their_serializers(body: dict[str, Any]) -> None:
    from api.forks import TaskForkIn
    from api.recovery import SubtaskIn, ToolInvokeIn

    for serializer_class in (TaskForkIn, SubtaskIn, ToolInvokeIn, TaskCreateIn):
        assert_never_looser(serializer_class, body)


def test_a_fork_with_sandbox_and_tool_answers_takes_the_fast_path() -> None:
    from api.forks import TaskForkIn

    body = {"at_seq": 3, "reason": "replay", "sandbox": True,
            "tool_answers": [{"step": 2, "tool": "crm", "status": "succeeded", "result": {"n": 1}}]}
    assert fastcheck.compile_check(TaskForkIn)(body) is not None
    assert fastcheck.compile_check(TaskForkIn)({**body, "sandbox": 1}) is None
    assert assert_never_looser(TaskForkIn, body)
