"""Statement spans (backplane/telemetry/statements.py): one client span per SQL statement Django
runs, under the span it runs in, named and attributed by the database conventions; a failed
statement says so; a connection opened again and again is traced once; nothing after tracing
stops. Real PostgreSQL, spans to the in-memory exporter."""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backplane.eventlog.models import Task
from backplane.telemetry import tracing
from backplane.telemetry.statements import statement_spans
from tests.backplane.telemetry.conftest import span_exporter


def statements(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans()
            if span.kind == SpanKind.CLIENT and (span.attributes or {}).get("db.system.name") == "postgresql"]


def test_each_statement_is_one_client_span_of_the_span_it_runs_in(spans: InMemorySpanExporter) -> None:
    with trace.get_tracer("test").start_as_current_span("outer") as outer:
        with connection.cursor() as cursor:
            cursor.execute("/* the reason */\n  select %s", [1])
        assert not Task.objects.filter(kind="none").exists()

    select_one, orm_query = statements(spans)
    assert (select_one.name, orm_query.name) == ("SELECT", "SELECT")
    assert {s.parent.span_id for s in (select_one, orm_query) if s.parent} == {outer.get_span_context().span_id}
    attributes = dict(select_one.attributes or {})
    settings = connection.settings_dict
    assert attributes["db.namespace"] == settings["NAME"]
    assert attributes["db.query.text"] == "/* the reason */\n  select %s"
    assert attributes["server.address"] == (settings["HOST"] or "localhost")
    # The conventions want the port only when it is not PostgreSQL's default.
    assert attributes.get("server.port") == (None if int(settings["PORT"] or 5432) == 5432 else int(settings["PORT"]))
    assert "backplane_task" in str(dict(orm_query.attributes or {})["db.query.text"])
    assert select_one.status.status_code == StatusCode.UNSET


def test_a_failed_statement_has_an_error_status_and_its_type(spans: InMemorySpanExporter) -> None:
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT no_such_column FROM backplane_task")

    (failed,) = statements(spans)
    assert failed.status.status_code == StatusCode.ERROR
    assert dict(failed.attributes or {})["error.type"] == "ProgrammingError"
    assert [event.name for event in failed.events] == ["exception"]


def test_a_connection_opened_again_and_again_is_traced_once(spans: InMemorySpanExporter) -> None:
    for _ in range(3):
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    assert connection.execute_wrappers.count(statement_spans.execute) == 1
    assert len(statements(spans)) == 3


def test_another_threads_connection_is_traced_until_tracing_stops(spans: InMemorySpanExporter) -> None:
    """Each thread has its own connection: it is traced from when it opens, and its wrapper runs
    the statement untraced once tracing is off (it stays on the connection until it closes)."""
    go_on, traced = threading.Event(), threading.Event()

    def other_thread() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 'while on'")
                traced.set()
                go_on.wait(10)
                cursor.execute("SELECT 'after off'")
        finally:
            connection.close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert traced.wait(10)
    tracing.tracing_uninstall()
    go_on.set()
    thread.join(10)

    texts = [dict(span.attributes or {})["db.query.text"] for span in statements(spans)]
    assert texts == ["SELECT 'while on'"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'here, after off'")
    assert statement_spans.execute not in connection.execute_wrappers
    assert len(statements(span_exporter)) == 1
