"""Reads of the task list: a page of tasks, newest first, keyset-paginated behind an opaque cursor."""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import QuerySet

from backplane.eventlog.models import Task
from backplane.eventlog.selectors import TaskFilters, tasks_filtered, use_c_timestamp_loader

LIST_FIELDS = ("id", "namespace", "kind", "status", "attempts", "max_attempts", "lease_holder", "lease_expires_at",
               "last_seq", "parent_id", "created_at", "updated_at", "last_event_at", "forked_from_id", "forked_at_seq",
               "sandbox")


@dataclass(frozen=True)
class TaskPage:
    tasks: list[Task]
    next_cursor: str | None
    cursor: str | None


class BadCursor(ValueError):
    pass


def encode_cursor(task: Task) -> str:
    raw = f"{task.created_at.isoformat()}|{task.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        if len(cursor) > 200:  # ``encode_cursor`` writes about 80: refused before decoding
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, task_id = raw.split("|")
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:
            raise ValueError("naive time")
        return at, uuid.UUID(task_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadCursor("not a cursor of this list") from exc


# ``LIST_FIELDS`` in the model's order: ``Model.from_db`` reads the values of a partial row in that order.
_LISTED = tuple(field.attname for field in Task._meta.concrete_fields if field.attname in LIST_FIELDS)


def _load_listed(rows: QuerySet[Task, tuple[Any, ...]]) -> list[Task]:
    """The page's tasks (``LIST_FIELDS`` only, the rest deferred, as ``.only()`` loads them), read
    with psycopg's C timestamp loader and made into models directly: Django's own iteration (its
    Python timestamp loader, a converter pass per row) cost as much again as the query itself,
    and this list is the dashboard's most read page."""
    sql, params = rows.query.sql_with_params()
    database = connections[rows.db]
    with database.cursor() as db:
        use_c_timestamp_loader(db)
        db.execute(sql, params)
        return [Task.from_db(database.alias, _LISTED, row) for row in db.fetchall()]


def task_page(filters: TaskFilters, *, cursor: str | None = None, limit: int = 50) -> TaskPage:
    """One page of tasks, newest first: keyset pagination on (created_at, id), one query."""
    tasks = tasks_filtered(filters).order_by("-created_at", "-id")
    if cursor:
        created_at, task_id = decode_cursor(cursor)
        # A row comparison, so the (created_at, id) index starts right after the cursor.
        tasks = tasks.extra(where=["(backplane_task.created_at, backplane_task.id) < (%s, %s)"],
                            params=[created_at, task_id])
    rows = _load_listed(tasks.values_list(*_LISTED)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return TaskPage(tasks=rows, next_cursor=encode_cursor(rows[-1]) if more and rows else None, cursor=cursor)
