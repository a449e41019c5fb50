"""Drift: where two runs of an agent stop doing the same thing.

A run is a task's history, oldest first (a fork's history includes its source's events). Two
runs drift where their events differ once everything that differs between any two runs by
construction is set aside: ``TaskForked`` markers, lease bookkeeping (``NOT_BEHAVIOUR``) and
the run-specific payload keys below.

The runs are aligned before they are compared, so one extra or missing event shows up as one
``only_in_b`` or ``only_in_a`` pair instead of shifting every later event into a "changed" one.
The alignment key is the event's type with its payload's ``step``, ``tool`` and ``kind``: those
say *which* step or call an event belongs to, while the rest of the payload says what happened
in it. Events of the same step and tool are paired and their content compared; a step that
exists in only one run is an insertion or a deletion.

Pure: no Django, no database. Hazard: ``difflib.SequenceMatcher`` costs O(n * m) where keys
repeat (events with no step, tool or kind); only the common head and tail escape it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Final, Literal

from backplane.eventlog import event_types as et

# Type, step, tool, kind: which step or call an event belongs to.
_Key = tuple[str, int | None, str | None, str | None]
PairKind = Literal["same", "changed", "only_in_a", "only_in_b"]
KINDS: Final[tuple[PairKind, ...]] = ("same", "changed", "only_in_a", "only_in_b")

# Events that record who held a lease, never what the agent did: a fork's marker, a claim (a
# sandbox forked after its source's claim has one more), a lease given back, a child's claim
# seen from its parent. Their payloads hold only run-specific keys. A stall is kept: it is a
# crash, and two runs that crashed differently did drift.
NOT_BEHAVIOUR: Final = frozenset({et.TASK_FORKED, et.TASK_CLAIMED, et.LEASE_RELEASED, et.SUB_AGENT_ACCEPTED})

# Payload keys dropped at every depth before comparing: their values differ between any two
# runs by construction, so a difference in them says nothing about the agent's behaviour.
RUN_SPECIFIC_KEYS: Final = frozenset({
    # Derived from a task's id or naming a task: a rerun or a fork is another task.
    "idempotency_key", "effect_key", "dispatch_key", "child_task_id", "task_id", "parent_task_id",
    # Lease bookkeeping: which epoch, for how long, until when.
    "lease_epoch", "expires_at", "lease_seconds",
    # Wall-clock times.
    "dispatched_at",
    # Provenance of copied or replayed values: which task they came from.
    "inherited_from", "recorded_from",
    # Who ran it and whether it was retried or recovered, not what it did.
    "agent", "attempt", "recovered",
    # A model call's cost, settled by the backplane from its usage and the prices of the day it
    # was recorded (backplane/eventlog/costs.py): the usage is compared, the day's prices are not.
    "cost",
})


class _Missing:
    """The value on the side of a pair where a key or list item is absent."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    task_id: str  # the task whose log holds the event (a fork's history includes its source's events)
    seq: int  # the event's seq in that task's log
    type: str
    payload: Mapping[str, Any]  # JSON: dicts, lists, str, int, float, bool, None


@dataclass(frozen=True, slots=True)
class Pair:
    """One step of the alignment. For "changed", ``path`` names the first differing field (the
    type first, then the payload depth-first with keys sorted) and the values are the normalized
    ones found there, ``MISSING`` on a side that lacks it; otherwise path and values are None."""

    a: HistoryEntry | None
    b: HistoryEntry | None
    kind: PairKind
    path: str | None = None
    a_value: Any = None
    b_value: Any = None


@dataclass(frozen=True, slots=True)
class Drift:
    pairs: list[Pair]
    counts: dict[str, int]  # every kind in KINDS, zero included
    first_divergence: Pair | None


def runs_diff(a: Sequence[HistoryEntry], b: Sequence[HistoryEntry]) -> Drift:
    """Align two runs (by type, step, tool and kind) and compare the aligned events."""
    entries_a = [entry for entry in a if entry.type not in NOT_BEHAVIOUR]
    entries_b = [entry for entry in b if entry.type not in NOT_BEHAVIOUR]
    keys_a = [_alignment_key(entry) for entry in entries_a]
    keys_b = [_alignment_key(entry) for entry in entries_b]
    pairs: list[Pair] = []
    # One rule for every range: pair element-wise up to the shorter side, the rest of the
    # longer one is only on its side. "equal" ranges have equal lengths; "delete" and "insert"
    # pair nothing.
    for a_lo, a_hi, b_lo, b_hi in _aligned_ranges(keys_a, keys_b):
        paired = min(a_hi - a_lo, b_hi - b_lo)
        pairs.extend(_compare(entries_a[a_lo + i], entries_b[b_lo + i]) for i in range(paired))
        pairs.extend(Pair(a=entry, b=None, kind="only_in_a") for entry in entries_a[a_lo + paired : a_hi])
        pairs.extend(Pair(a=None, b=entry, kind="only_in_b") for entry in entries_b[b_lo + paired : b_hi])
    counts: dict[str, int] = dict.fromkeys(KINDS, 0)
    for pair in pairs:
        counts[pair.kind] += 1
    first_divergence = next((pair for pair in pairs if pair.kind != "same"), None)
    return Drift(pairs=pairs, counts=counts, first_divergence=first_divergence)


def pair_as_json(pair: Pair) -> dict[str, Any]:
    """The pair as JSON. ``MISSING`` becomes None; ``a_missing``/``b_missing`` are present only
    when a key or item was absent on one side, to tell that apart from an explicit null."""
    shaped: dict[str, Any] = {
        "kind": pair.kind,
        "path": pair.path,
        "a": _entry_as_json(pair.a),
        "b": _entry_as_json(pair.b),
        "a_value": _as_json_value(pair.a_value),
        "b_value": _as_json_value(pair.b_value),
    }
    if pair.a_value is MISSING or pair.b_value is MISSING:
        shaped["a_missing"] = pair.a_value is MISSING
        shaped["b_missing"] = pair.b_value is MISSING
    return shaped


def drift_as_json(drift: Drift) -> dict[str, Any]:
    first = drift.first_divergence
    return {"first_divergence": None if first is None else pair_as_json(first), "counts": dict(drift.counts)}


def _aligned_ranges(keys_a: list[_Key], keys_b: list[_Key]) -> Iterator[tuple[int, int, int, int]]:
    """SequenceMatcher's opcode ranges. A rerun or a fork shares long stretches with the run it is
    compared to, and the matcher costs O(n * m) where keys repeat (events with no step, tool or
    kind), so the common head and tail are matched here and only the middle goes to it."""
    limit = min(len(keys_a), len(keys_b))
    head = 0
    while head < limit and keys_a[head] == keys_b[head]:
        head += 1
    tail = 0
    while tail < limit - head and keys_a[-1 - tail] == keys_b[-1 - tail]:
        tail += 1
    yield 0, head, 0, head
    middle_a, middle_b = keys_a[head : len(keys_a) - tail], keys_b[head : len(keys_b) - tail]
    for _tag, a_lo, a_hi, b_lo, b_hi in SequenceMatcher(None, middle_a, middle_b, autojunk=False).get_opcodes():
        yield head + a_lo, head + a_hi, head + b_lo, head + b_hi
    yield len(keys_a) - tail, len(keys_a), len(keys_b) - tail, len(keys_b)


def _alignment_key(entry: HistoryEntry) -> _Key:
    step, tool, kind = entry.payload.get("step"), entry.payload.get("tool"), entry.payload.get("kind")
    return (
        entry.type,
        # bool is an int in Python; a step of ``true`` is no step.
        step if isinstance(step, int) and not isinstance(step, bool) else None,
        tool if isinstance(tool, str) else None,
        kind if isinstance(kind, str) else None,
    )


def _compare(a: HistoryEntry, b: HistoryEntry) -> Pair:
    if a.type != b.type:
        return Pair(a=a, b=b, kind="changed", path="$.type", a_value=a.type, b_value=b.type)
    difference = _first_difference(a.payload, b.payload)
    if difference is None:
        return Pair(a=a, b=b, kind="same")
    segments, a_value, b_value = difference
    return Pair(a=a, b=b, kind="changed", path=_json_path(segments), a_value=a_value, b_value=b_value)


# Path segments of the first difference (innermost first) and the two normalized values there.
_Difference = tuple[list[str | int], Any, Any]
_SCALARS = (str, int, float, bool, type(None))


def _first_difference(a: Any, b: Any) -> _Difference | None:
    """Depth-first, object keys sorted, run-specific keys skipped. Walks the raw payloads rather
    than normalized copies, and names the path only once a difference is found: this runs for
    every aligned pair, and scalars (most nodes) are checked first with concrete types."""
    if isinstance(a, _SCALARS) or isinstance(b, _SCALARS):
        # JSON numbers compare by value (1 and 1.0 are one number), but true is not 1.
        if isinstance(a, bool) != isinstance(b, bool) or a != b:
            return [], _normalized(a), _normalized(b)
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        for index, (a_item, b_item) in enumerate(zip(a, b, strict=False)):
            difference = _first_difference(a_item, b_item)
            if difference is not None:
                difference[0].append(index)
                return difference
        if len(a) == len(b):
            return None
        # The shorter list ends first: its side of the first extra item is missing.
        index = min(len(a), len(b))
        a_item = a[index] if index < len(a) else MISSING
        b_item = b[index] if index < len(b) else MISSING
        return [index], _normalized(a_item), _normalized(b_item)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted((a.keys() | b.keys()) - RUN_SPECIFIC_KEYS):
            if key not in a or key not in b:
                return [key], _normalized(a.get(key, MISSING)), _normalized(b.get(key, MISSING))
            difference = _first_difference(a[key], b[key])
            if difference is not None:
                difference[0].append(key)
                return difference
        return None
    # An object against an array, or values outside JSON: compare them as they are.
    return None if a == b else ([], _normalized(a), _normalized(b))


def _json_path(segments: list[str | int]) -> str:
    """``$.payload.result.items[2]``; a key that is no identifier is quoted: ``["content-type"]``."""
    path = "$.payload"
    for segment in reversed(segments):
        if isinstance(segment, int):
            path += f"[{segment}]"
        elif segment.isidentifier():
            path += f".{segment}"
        else:
            path += f"[{json.dumps(segment)}]"
    return path


def _normalized(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _normalized(item) for key, item in value.items() if key not in RUN_SPECIFIC_KEYS}
    if isinstance(value, list | tuple):
        return [_normalized(item) for item in value]
    return value


def _entry_as_json(entry: HistoryEntry | None) -> dict[str, Any] | None:
    return None if entry is None else {"task_id": entry.task_id, "seq": entry.seq, "type": entry.type}


def _as_json_value(value: Any) -> Any:
    return None if value is MISSING else value
