"""Model instances from hand-written SQL, without ``RawQuerySet``'s per-query set-up.

``Model.objects.raw()`` inspects the cursor's columns, builds converters and maps
names to fields on every call, which for a one-row SELECT on the append path costs more
than the query. A ``RowLoader`` does that work once per model:
it fixes the column list, and applies the same converters Django would (JSON columns
arrive as text and are decoded by the field) before ``Model.from_db``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import orjson
from django.db import connection
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)

_Converter = tuple[int, list[Callable[..., Any]], Any]


class RowLoader(Generic[M]):
    def __init__(self, model: type[M]) -> None:
        self.model = model
        self.fields = list(model._meta.concrete_fields)
        self.attnames = [field.attname for field in self.fields]
        # Qualified with the table, so the list also fits a SELECT with joins.
        table = model._meta.db_table
        self.columns = ", ".join(f'"{table}"."{field.column}"' for field in self.fields)
        self._converters: list[_Converter] | None = None

    def _converters_for_connection(self) -> list[_Converter]:
        if self._converters is None:
            found = []
            for index, field in enumerate(self.fields):
                column = field.get_col(self.model._meta.db_table)
                converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
                if converters:
                    found.append((index, converters, column))
            self._converters = found
        return self._converters

    def load(self, row: Sequence[Any]) -> M:
        values = list(row)
        for index, converters, column in self._converters_for_connection():
            for convert in converters:
                values[index] = convert(values[index], column, connection)
        return self.model.from_db(connection.alias, self.attnames, values)

    def fetch_one(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> M | None:
        """Run ``sql`` (which selects ``self.columns``) and load its first row, if any."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None if row is None else self.load(row)

    def fetch_all(self, sql: str, params: Sequence[Any]) -> list[M]:
        """Run ``sql`` (which selects ``self.columns``) and load every row."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return [self.load(row) for row in rows]


@dataclass(frozen=True)
class Recordset:
    """Some of a model's columns as a ``jsonb_to_recordset`` source: the hand-written bulk
    statements (events and projections, outbox rows, circuit breakers) take their rows as one
    JSON array, whose text the client-side binding quotes once, and read it back with these
    column names and SQL types, taken from the model so no statement keeps a copy of them."""

    columns: tuple[str, ...]
    attnames: tuple[str, ...]
    types: tuple[str, ...]

    @property
    def column_list(self) -> str:
        return ", ".join(self.columns)

    def definition(self, alias: str, *, extra: Sequence[tuple[str, str]] = ()) -> str:
        """``alias(column type, ...)``, the record type after ``jsonb_to_recordset(...) AS``;
        ``extra`` (name, type) pairs come first, for keys that are no column (an ordering key)."""
        pairs = [*extra, *zip(self.columns, self.types, strict=True)]
        return f"{alias}(" + ", ".join(f"{c} {t}" for c, t in pairs) + ")"


def _column_of(model: type[Model], name: str) -> tuple[str, str, str]:
    """(column, attname, SQL type) of the field ``name``. A foreign key gives its column and
    its target's type (rel_db_type), e.g. uuid for a task."""
    field = model._meta.get_field(name)
    if isinstance(field, Field) and field.column is not None and (sql_type := field.db_type(connection)) is not None:
        return field.column, field.attname, sql_type
    raise ValueError(f"{model.__name__}.{name} is not a column")


@functools.cache
def recordset(model: type[Model], field_names: tuple[str, ...]) -> Recordset:
    """The ``Recordset`` of ``field_names`` (model field names; a foreign key gives its column)."""
    columns = [_column_of(model, name) for name in field_names]
    return Recordset(
        columns=tuple(column for column, _, _ in columns),
        attnames=tuple(attname for _, attname, _ in columns),
        types=tuple(sql_type for _, _, sql_type in columns),
    )


def _whole_row(model: type[Model]) -> Recordset:
    return recordset(model, tuple(field.name for field in model._meta.concrete_fields))


@functools.cache
def row_insert_sql(model: type[Model], conflict: str = "") -> str:
    """The one INSERT of a whole ``model`` row (``row_insert_params``), on either driver; the
    hand-written creates (tasks, tool calls, approval requests) each run theirs. ``conflict``
    (``ON CONFLICT … RETURNING …``) follows it."""
    columns = _whole_row(model)
    return (f"INSERT INTO {model._meta.db_table} ({columns.column_list}) SELECT {columns.column_list} "
            f"FROM jsonb_to_recordset(%s::jsonb) AS {columns.definition('r')} {conflict}").rstrip()


def row_insert_params(instance: Model) -> list[str]:
    """``row_insert_sql``'s one parameter: ``instance``'s every column, as a one-row array."""
    return [recordset_json([{name: getattr(instance, name) for name in _whole_row(type(instance)).attnames}])]


def _as_json_value(value: Any) -> Any:
    """What neither encoder writes itself: a time (timestamptz reads the ISO form back to the
    microsecond) or anything else as its ``str`` (a UUID, a Decimal)."""
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def recordset_json(rows: Sequence[Any]) -> str:
    """``json_text`` of a ``Recordset`` statement's rows, as one parameter."""
    return json_text(rows)


def json_text(value: Any) -> str:
    """The JSON text of ``value`` (a ``Recordset`` statement's rows, a ``jsonb`` column's value).

    orjson writes it: it encodes UUIDs and times itself (in the same ISO form), where the
    standard library's encoder calls back into Python for each. orjson refuses integers beyond
    64 bits (a payload may hold one: JSON has no limit, and PostgreSQL's numeric keeps it
    exactly); the standard library writes those.
    """
    try:
        return orjson.dumps(value, default=_as_json_value).decode()
    except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits
        return json.dumps(value, default=_as_json_value)
