"""Reads of the diff page: two tasks' histories side by side, as ``tasks_drift`` aligns them
(backplane/eventlog/lineage.py), with runs of same events folded and the rows paged."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from backplane.eventlog import lineage
from backplane.eventlog.drift import HistoryEntry
from backplane.eventlog.models import Task
from dashboard.selectors.task_detail import event_href
from dashboard.text import diff_value

# The diff page shows a difference with this many same events on each side; a longer run of
# same events is one fold ("N same events"), which opens up to DIFF_EXPAND_MAX at a time. A
# page holds DIFF_PAGE_ITEMS rows and folds: two histories of 10,000 events that differ
# everywhere are paged, never drawn at once.
DIFF_CONTEXT = 3
DIFF_MIN_FOLD = 5
DIFF_EXPAND_MAX = 200
DIFF_PAGE_ITEMS = 250

_DIFF_TASK_FIELDS = ("id", "namespace", "kind", "status", "last_seq", "forked_from_id", "forked_at_seq", "sandbox",
                     "created_at")


@dataclass(frozen=True)
class DiffSide:
    task_id: str
    seq: int
    type: str
    payload: Any
    href: str
    elsewhere: bool  # recorded in another task's log than the one compared (a fork's source)


@dataclass(frozen=True)
class DiffRow:
    index: int
    kind: str
    a: DiffSide | None
    b: DiffSide | None
    path: str | None
    a_value: str | None  # compact JSON of the differing value; None where the side has none
    b_value: str | None
    first: bool
    is_fold: bool = False


@dataclass(frozen=True)
class DiffFold:
    start: int  # the first pair folded
    end: int  # after the last pair folded
    is_fold: bool = True

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def expand_end(self) -> int:
        return min(self.end, self.start + DIFF_EXPAND_MAX)

    @property
    def expand_count(self) -> int:
        return self.expand_end - self.start


@dataclass(frozen=True)
class DriftPage:
    a: Task
    b: Task
    counts: dict[str, int]
    total: int
    first: DiffRow | None  # the first divergence
    first_page: int | None
    items: list[DiffRow | DiffFold]
    page: int
    pages: int


def drift_page(*, a_id: uuid.UUID, b_id: uuid.UUID, page: int | None = None,
               expand: tuple[int, int] | None = None) -> DriftPage:
    """Two tasks' histories side by side, aligned as ``tasks_drift`` pairs them, with runs of
    same events folded and the rows paged (``page`` 1-based; by default the one with the first
    divergence). ``expand`` unfolds the pairs ``start``..``end - 1``. Raises ``NotFound``.

    Queries: the drift's (each task, its sources, its history in chunks) and one for the tasks
    the events are recorded in."""
    drift = lineage.tasks_drift(namespace=None, a_id=a_id, b_id=b_id)
    pairs = drift.pairs
    task_ids = {a_id, b_id}
    for pair in pairs:
        task_ids.update(uuid.UUID(side.task_id) for side in (pair.a, pair.b) if side is not None)
    tasks = Task.objects.only(*_DIFF_TASK_FIELDS).in_bulk(task_ids)
    last_seqs = {str(pk): task.last_seq for pk, task in tasks.items()}

    shown = [False] * len(pairs)
    first_index = None
    for index, pair in enumerate(pairs):
        if pair.kind != "same":
            first_index = index if first_index is None else first_index
            for near in range(max(0, index - DIFF_CONTEXT), min(len(pairs), index + DIFF_CONTEXT + 1)):
                shown[near] = True
    if expand is not None:
        for index in range(max(0, expand[0]), min(len(pairs), expand[1], expand[0] + DIFF_EXPAND_MAX)):
            shown[index] = True
    # Rows are pair indices, folds (start, end) ranges; a run of hidden pairs too short to be
    # worth a fold is shown instead.
    plan: list[int | tuple[int, int]] = []
    index = 0
    while index < len(pairs):
        if shown[index]:
            plan.append(index)
            index += 1
            continue
        end = index
        while end < len(pairs) and not shown[end]:
            end += 1
        if end - index < DIFF_MIN_FOLD:
            plan.extend(range(index, end))
        else:
            plan.append((index, end))
        index = end
    pages = max(1, -(-len(plan) // DIFF_PAGE_ITEMS))
    first_page = None
    if first_index is not None:
        position = next(n for n, item in enumerate(plan) if item == first_index)
        first_page = position // DIFF_PAGE_ITEMS + 1
    page = min(max(1, page or first_page or 1), pages)

    def side(entry: HistoryEntry | None, compared: uuid.UUID) -> DiffSide | None:
        if entry is None:
            return None
        return DiffSide(task_id=entry.task_id, seq=entry.seq, type=entry.type, payload=entry.payload,
                        href=event_href(entry.task_id, entry.seq, last_seqs.get(entry.task_id, entry.seq)),
                        elsewhere=entry.task_id != str(compared))

    def row(index: int) -> DiffRow:
        pair = pairs[index]
        changed = pair.kind == "changed"
        return DiffRow(index=index, kind=pair.kind, a=side(pair.a, a_id), b=side(pair.b, b_id), path=pair.path,
                       a_value=diff_value(pair.a_value) if changed else None,
                       b_value=diff_value(pair.b_value) if changed else None,
                       first=index == first_index)

    window = plan[(page - 1) * DIFF_PAGE_ITEMS : page * DIFF_PAGE_ITEMS]
    items: list[DiffRow | DiffFold] = [DiffFold(*item) if isinstance(item, tuple) else row(item) for item in window]
    return DriftPage(a=tasks[a_id], b=tasks[b_id], counts=dict(drift.counts), total=len(pairs),
                     first=None if first_index is None else row(first_index), first_page=first_page,
                     items=items, page=page, pages=pages)
