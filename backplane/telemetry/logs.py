"""Log records that name their trace: ``LOG_FORMAT=json`` writes one JSON object a line
(python-json-logger) with the trace and span ids of the span the line was written in, so a log
search and a trace view meet on the same ids. The default stays the plain line people read in a
terminal (``make run``)."""

from __future__ import annotations

import logging
import time

from pythonjsonlogger.json import JsonFormatter

from backplane.telemetry.tracing import current_trace_ids

# The record's attributes each JSON line carries, in order, under the names log pipelines expect.
JSON_FIELDS = ("asctime", "levelname", "name", "message", "process", "threadName", "trace_id", "span_id")
JSON_RENAMED = {"asctime": "time", "levelname": "level", "name": "logger", "threadName": "thread"}


class TraceIdsFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (lowercase hex, or null outside a trace) to every record.
    A filter on the handler, not on a logger, so lines from every library get them too."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id, record.span_id = current_trace_ids()
        return True


def json_formatter() -> JsonFormatter:
    """The formatter ``settings.LOGGING`` names for ``LOG_FORMAT=json``: UTC ISO 8601 times."""
    formatter = JsonFormatter(list(JSON_FIELDS), rename_fields=JSON_RENAMED)
    formatter.converter = time.gmtime
    formatter.default_time_format = "%Y-%m-%dT%H:%M:%S"
    formatter.default_msec_format = "%s.%03dZ"
    return formatter
