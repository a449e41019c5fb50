"""Statement spans: one OpenTelemetry client span per SQL statement Django runs.

They are made through Django's own database instrumentation hook (``execute_wrappers`` on each
connection, installed as a connection opens) rather than by OpenTelemetry's psycopg
instrumentation, for what they cost. That instrumentation wraps every cursor of the DB-API and
makes each statement's span the current one, records two histograms and sets its attributes one
by one, for every statement (``bench/append.py`` measures the cost of tracing). The span here is
started once with all its attributes and is never made current (nothing runs inside a
statement). Names and attributes are those of OpenTelemetry's stable database conventions, as
the psycopg instrumentation writes them: the span is named after the statement's first keyword,
with ``db.system.name``, ``db.namespace``, ``db.query.text``, ``server.address`` and
``server.port`` (when it is not 5432); a failed statement also gets ``error.type`` and an error
status.

Only statements through Django are traced: the few connections the product opens with psycopg
itself (the relay's LISTEN, the database gate's probe, the Channels layer) have no spans.
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=psycopg`` turns these spans off, the name operators
know the database spans by.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider

# The statement's first keyword, past leading comments and white space, without copying the
# statement (a batch insert's text is tens of kilobytes).
_FIRST_KEYWORD = re.compile(r"\s*(?:(?:/\*.*?\*/|--[^\n]*(?:\n|$))\s*)*([A-Za-z]+)", re.DOTALL)


class StatementSpans:
    """The database spans of every Django connection to PostgreSQL, by the interface of
    OpenTelemetry's instrumentors (``instrument``, ``uninstrument``,
    ``is_instrumented_by_opentelemetry``), so tracing installs it like theirs. One per process."""

    def __init__(self) -> None:
        self._tracer: Tracer | None = None
        self._lock = threading.Lock()

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return self._tracer is not None

    def instrument(self, *, tracer_provider: TracerProvider) -> None:
        with self._lock:
            self._tracer = tracer_provider.get_tracer("backplane.db")
            connection_created.connect(self._on_connection_created, dispatch_uid=__name__)
            # Connections this thread opened before tracing started; other threads' connections
            # are traced from the next time they open (each thread has its own).
            for connection in connections.all(initialized_only=True):
                self._attach(connection)

    def uninstrument(self) -> None:
        with self._lock:
            connection_created.disconnect(dispatch_uid=__name__)
            for connection in connections.all(initialized_only=True):
                if self.execute in connection.execute_wrappers:
                    connection.execute_wrappers.remove(self.execute)
            # Other threads' connections keep the wrapper until they close; it passes straight
            # through once there is no tracer.
            self._tracer = None

    def _on_connection_created(self, sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
        self._attach(connection)

    def _attach(self, connection: BaseDatabaseWrapper) -> None:
        # A connection opens again and again over a thread's life (per request, or from the pool):
        # the wrapper is added once.
        if connection.vendor == "postgresql" and self.execute not in connection.execute_wrappers:
            connection.execute_wrappers.append(self.execute)

    def execute(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                context: dict[str, Any]) -> Any:
        """Django's wrapper signature: run the statement inside its span."""
        tracer = self._tracer
        if tracer is None:
            return execute(sql, params, many, context)
        settings = context["connection"].settings_dict
        keyword = _FIRST_KEYWORD.match(sql) if isinstance(sql, str) else None
        attributes: dict[str, Any] = {"db.system.name": "postgresql", "db.namespace": settings["NAME"] or "",
                                      "db.query.text": str(sql), "server.address": settings["HOST"] or "localhost"}
        port = int(settings["PORT"] or 5432)
        if port != 5432:  # the conventions ask for the port only when it is not PostgreSQL's own
            attributes["server.port"] = port
        span = tracer.start_span(keyword[1].upper() if keyword else "postgresql", kind=SpanKind.CLIENT,
                                 attributes=attributes)
        try:
            return execute(sql, params, many, context)
        except Exception as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"))
            raise
        finally:
            span.end()


statement_spans = StatementSpans()
