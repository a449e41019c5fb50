"""Drift between two runs (backplane/eventlog/drift.py): alignment, comparison and the JSON shape.

Pure functions over lists of history entries: no database.
"""

from __future__ import annotations

from typing import Any

from backplane.eventlog.drift import (
    MISSING,
    HistoryEntry,
    drift_as_json,
    pair_as_json,
    runs_diff,
)

Event = tuple[str, dict[str, Any]]


def make_run(task_id: str, events: list[Event], first_seq: int = 1) -> list[HistoryEntry]:
    return [
        HistoryEntry(task_id=task_id, seq=first_seq + offset, type=event_type, payload=payload)
        for offset, (event_type, payload) in enumerate(events)
    ]


def lead_run(price: int = 10) -> list[Event]:
    """A short run: start, two reasoning steps around a tool call, completion."""
    return [
        ("TaskStarted", {"input": {"lead": "alice@example.com"}}),
        ("ReasoningStepCompleted", {"step": 1, "thought": "look up the lead"}),
        ("ToolCallResultReceived", {"step": 1, "tool": "crm.lookup", "result": {"currency": "EUR", "price": price}}),
        ("ReasoningStepCompleted", {"step": 2, "thought": "qualify"}),
        ("TaskCompleted", {"output": {"qualified": True}}),
    ]


def test_it_finds_no_drift_between_identical_runs() -> None:
    a, b = make_run("task-a", lead_run()), make_run("task-b", lead_run())

    drift = runs_diff(a, b)

    assert drift.first_divergence is None
    assert drift.counts == {"same": 5, "changed": 0, "only_in_a": 0, "only_in_b": 0}
    assert [(pair.a, pair.b, pair.kind) for pair in drift.pairs] == [(x, y, "same") for x, y in zip(a, b, strict=True)]
    assert drift_as_json(drift) == {"first_divergence": None, "counts": drift.counts}


def test_it_reports_the_path_and_values_of_a_changed_nested_field() -> None:
    a, b = make_run("task-a", lead_run(price=10)), make_run("task-b", lead_run(price=12))

    drift = runs_diff(a, b)

    first = drift.first_divergence
    assert first is not None
    assert (first.kind, first.path, first.a_value, first.b_value) == ("changed", "$.payload.result.price", 10, 12)
    assert (first.a, first.b) == (a[2], b[2])
    assert drift.counts == {"same": 4, "changed": 1, "only_in_a": 0, "only_in_b": 0}


def test_it_reports_the_first_difference_in_sorted_key_order() -> None:
    a = make_run("task-a", [("Quoted", {"z": 1, "result": {"price": 10, "currency": "EUR"}})])
    b = make_run("task-b", [("Quoted", {"z": 2, "result": {"price": 12, "currency": "USD"}})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    assert (first.path, first.a_value, first.b_value) == ("$.payload.result.currency", "EUR", "USD")


def test_it_reports_a_changed_type_at_the_type_path() -> None:
    events_b = lead_run()
    events_b[3] = ("LLMCalled", {"step": 2, "model": "m", "output": "qualify"})
    a, b = make_run("task-a", lead_run()), make_run("task-b", events_b)

    drift = runs_diff(a, b)

    first = drift.first_divergence
    assert first is not None
    assert (first.kind, first.path) == ("changed", "$.type")
    assert (first.a_value, first.b_value) == ("ReasoningStepCompleted", "LLMCalled")
    assert (first.a, first.b) == (a[3], b[3])
    assert drift.counts == {"same": 4, "changed": 1, "only_in_a": 0, "only_in_b": 0}


def test_it_pairs_a_replaced_range_up_to_the_shorter_side() -> None:
    a = make_run("task-a", [("Started", {}), ("Planned", {"step": 1}), ("Done", {})])
    b = make_run("task-b", [("Started", {}), ("Guessed", {"step": 1}), ("Guessed", {"step": 2}), ("Done", {})])

    drift = runs_diff(a, b)

    assert [(pair.kind, pair.a, pair.b, pair.path) for pair in drift.pairs] == [
        ("same", a[0], b[0], None),
        ("changed", a[1], b[1], "$.type"),
        ("only_in_b", None, b[2], None),
        ("same", a[2], b[3], None),
    ]


def test_it_reports_an_inserted_event_as_only_in_b() -> None:
    events_b = lead_run()
    events_b.insert(3, ("ToolCallResultReceived", {"step": 1, "tool": "web.search", "result": {"hits": 3}}))
    a, b = make_run("task-a", lead_run()), make_run("task-b", events_b)

    drift = runs_diff(a, b)

    first = drift.first_divergence
    assert first is not None
    assert (first.kind, first.a, first.b, first.path) == ("only_in_b", None, b[3], None)
    assert drift.counts == {"same": 5, "changed": 0, "only_in_a": 0, "only_in_b": 1}
    assert [pair.b for pair in drift.pairs] == b


def test_it_reports_a_removed_event_as_only_in_a() -> None:
    events_b = lead_run()
    del events_b[3]
    a, b = make_run("task-a", lead_run()), make_run("task-b", events_b)

    drift = runs_diff(a, b)

    first = drift.first_divergence
    assert first is not None
    assert (first.kind, first.a, first.b) == ("only_in_a", a[3], None)
    assert drift.counts == {"same": 4, "changed": 0, "only_in_a": 1, "only_in_b": 0}
    assert pair_as_json(first) == {
        "kind": "only_in_a",
        "path": None,
        "a": {"task_id": "task-a", "seq": 4, "type": "ReasoningStepCompleted"},
        "b": None,
        "a_value": None,
        "b_value": None,
    }


def test_it_ignores_run_specific_keys_at_every_depth() -> None:
    def dispatched(key: str, epoch: int, child: str) -> Event:
        return (
            "SubAgentDispatched",
            {
                "step": 3,
                "idempotency_key": key,
                "lease_epoch": epoch,
                "expires_at": f"2026-05-0{epoch}T00:00:00Z",
                "children": [{"child_task_id": child, "role": "researcher", "attempt": epoch}],
            },
        )

    a = make_run("task-a", [dispatched("key-a", 1, "child-a")])
    b = make_run("task-b", [dispatched("key-b", 2, "child-b")])

    drift = runs_diff(a, b)

    assert drift.first_divergence is None
    assert drift.counts == {"same": 1, "changed": 0, "only_in_a": 0, "only_in_b": 0}


def test_it_leaves_run_specific_keys_out_of_reported_values() -> None:
    a = make_run("task-a", [("Planned", {"items": [{"name": "x"}]})])
    b = make_run("task-b", [("Planned", {"items": [{"name": "x"}, {"name": "y", "effect_key": "e-1"}]})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    assert (first.path, first.a_value, first.b_value) == ("$.payload.items[1]", MISSING, {"name": "y"})


def test_it_skips_task_forked_on_both_sides() -> None:
    original = make_run("source", lead_run())
    # The fork's history: its own start, the source's events after the start up to seq 3, then
    # the fork's log from its TaskForked on.
    fork = [
        *make_run("fork", lead_run()[:1]),
        *original[1:3],
        HistoryEntry(task_id="fork", seq=2, type="TaskForked", payload={"source": "source", "at_seq": 3}),
        *make_run("fork", lead_run()[3:], first_seq=3),
    ]

    drift = runs_diff(original, fork)

    assert drift.first_divergence is None
    assert drift.counts == {"same": 5, "changed": 0, "only_in_a": 0, "only_in_b": 0}
    assert all(pair.b is not None and pair.b.type != "TaskForked" for pair in drift.pairs)


def test_it_names_list_items_by_index() -> None:
    a = make_run("task-a", [("Ranked", {"items": ["a", "b", "c"]})])
    b = make_run("task-b", [("Ranked", {"items": ["a", "b", "d"]})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    assert (first.path, first.a_value, first.b_value) == ("$.payload.items[2]", "c", "d")


def test_it_reports_a_key_missing_on_one_side() -> None:
    a = make_run("task-a", [("Answered", {"answer": 42, "note": "checked twice"})])
    b = make_run("task-b", [("Answered", {"answer": 42})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    assert (first.path, first.a_value, first.b_value) == ("$.payload.note", "checked twice", MISSING)
    assert pair_as_json(first) == {
        "kind": "changed",
        "path": "$.payload.note",
        "a": {"task_id": "task-a", "seq": 1, "type": "Answered"},
        "b": {"task_id": "task-b", "seq": 1, "type": "Answered"},
        "a_value": "checked twice",
        "b_value": None,
        "a_missing": False,
        "b_missing": True,
    }


def test_it_tells_an_explicit_null_from_a_missing_key() -> None:
    a = make_run("task-a", [("Answered", {"note": None})])
    b = make_run("task-b", [("Answered", {"note": "n/a"})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    shaped = pair_as_json(first)
    assert (shaped["a_value"], shaped["b_value"]) == (None, "n/a")
    assert "a_missing" not in shaped and "b_missing" not in shaped


def test_it_compares_numbers_by_value_but_not_booleans_as_numbers() -> None:
    a = make_run("task-a", [("Scored", {"score": 1, "ok": True})])
    same_numbers = make_run("task-b", [("Scored", {"score": 1.0, "ok": True})])
    bool_for_int = make_run("task-b", [("Scored", {"score": 1, "ok": 1})])

    assert runs_diff(a, same_numbers).first_divergence is None
    first = runs_diff(a, bool_for_int).first_divergence
    assert first is not None
    assert (first.path, first.a_value, first.b_value) == ("$.payload.ok", True, 1)


def test_it_brackets_keys_that_are_not_identifiers() -> None:
    a = make_run("task-a", [("Fetched", {"headers": {"content-type": "text/html"}})])
    b = make_run("task-b", [("Fetched", {"headers": {"content-type": "application/json"}})])

    first = runs_diff(a, b).first_divergence

    assert first is not None
    assert first.path == '$.payload.headers["content-type"]'


def test_it_summarises_a_drift_as_json() -> None:
    a, b = make_run("task-a", lead_run(price=10)), make_run("task-b", lead_run(price=12))

    assert drift_as_json(runs_diff(a, b)) == {
        "first_divergence": {
            "kind": "changed",
            "path": "$.payload.result.price",
            "a": {"task_id": "task-a", "seq": 3, "type": "ToolCallResultReceived"},
            "b": {"task_id": "task-b", "seq": 3, "type": "ToolCallResultReceived"},
            "a_value": 10,
            "b_value": 12,
        },
        "counts": {"same": 4, "changed": 1, "only_in_a": 0, "only_in_b": 0},
    }


def long_run(task_id: str, size: int) -> list[Event]:
    """``size`` events cycling through a reasoning step, a tool call and its result."""
    cycle = ["ReasoningStepCompleted", "ToolCallDispatched", "ToolCallResultReceived"]
    return [
        (cycle[i % 3], {"step": i // 3, "tool": "crm.lookup", "idempotency_key": f"{task_id}-{i}", "result": {"n": i}})
        for i in range(size)
    ]


def test_it_diffs_two_runs_of_ten_thousand_events() -> None:
    events_a = long_run("task-a", 10_000)
    events_b = long_run("task-b", 10_000)
    events_b[5_000] = (events_b[5_000][0], {**events_b[5_000][1], "result": {"n": -1}})
    events_b.insert(9_990, ("LLMCalled", {"step": 3_330, "model": "m", "output": "extra"}))
    a, b = make_run("task-a", events_a), make_run("task-b", events_b)

    drift = runs_diff(a, b)

    assert drift.counts == {"same": 9_999, "changed": 1, "only_in_a": 0, "only_in_b": 1}
    first = drift.first_divergence
    assert first is not None
    assert (first.a, first.b) == (a[5_000], b[5_000])
    assert (first.path, first.a_value, first.b_value) == ("$.payload.result.n", 5_000, -1)
    extra = [pair for pair in drift.pairs if pair.kind == "only_in_b"]
    assert [(pair.a, pair.b) for pair in extra] == [(None, b[9_990])]
