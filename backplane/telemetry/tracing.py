"""Traces: OpenTelemetry spans from an agent's request to the messages and recoveries it causes.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (or a test installs an exporter with
``tracing_install``). Off, nothing is instrumented and the helpers here return at their first
line, so tracing costs nothing (``bench/append.py`` measures both ways in one run); a
``traceparent`` an agent sends is still read by ``TraceContextMiddleware``, so its events carry
its trace id either way.

On, the maintained instrumentations make the spans of each process: Django (the server span of
every request, its parent taken from the request's ``traceparent``), Celery (the worker's runs)
and httpx (the gateway's calls to tools and the webhook POSTs, each carrying a ``traceparent`` to
the far side); one span per SQL statement comes from telemetry/statements.py, at half the cost of
psycopg's instrumentation. The backplane adds what no library
knows about, with the ``backplane.*`` attributes of docs/observability.md:

- the writer stores, with every event, the trace and span that wrote it (``Event.trace_id``,
  public and hashed; ``Event.span_id``, neither), and puts that context in the ``traceparent``
  of the event's outbox messages;
- the relay's publish span (``publish_span``) is a child of that context, and the message
  goes out carrying the publish span's own ``traceparent``, so a consumer continues the trace;
- the stall detector's recovery of a task (``task_span``) is a child of the task's last event,
  so one trace shows the crashed agent's work, the stall and the recovery.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from backplane.telemetry import gen_ai

logger = logging.getLogger(__name__)

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_propagator = TraceContextTextMapPropagator()
_lock = threading.Lock()
_enabled = False
_provider: Any = None
# Each exporter's processor, added to the provider once however often tracing is installed.
_processors: dict[int, Any] = {}
_tracer: trace.Tracer = trace.NoOpTracer()


def tracing_enabled() -> bool:
    return _enabled


def tracing_configure(*, endpoint: str, service_name: str, disabled: Iterable[str] = ()) -> bool:
    """Start tracing when an OTLP/HTTP endpoint is given (settings.OTEL_EXPORTER_OTLP_ENDPOINT):
    spans go to ``<endpoint>/v1/traces`` in batches, from a thread, so no request waits for the
    collector. The exporter reads the other standard ``OTEL_EXPORTER_OTLP_*`` variables itself
    (headers, timeout, compression)."""
    if not endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The generic endpoint names the collector; the signal's path goes after it (the OTLP spec).
    exporter = OTLPSpanExporter(endpoint=f"{endpoint.rstrip('/')}/v1/traces")
    tracing_install(exporter, service_name=service_name, batch=True, disabled=disabled)
    return True


# The instrumentations by the names OpenTelemetry gives them (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS).
INSTRUMENTATIONS = ("django", "psycopg", "celery", "httpx")


def _instrumentors() -> dict[str, Any]:
    """The instrumentations of the libraries the product's spans come from (each a process-wide
    singleton): imported only when tracing is turned on."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    from backplane.telemetry.statements import statement_spans

    # The statements' spans are the backplane's own, for their cost (telemetry/statements.py), under
    # the name operators know them by.
    return {"django": DjangoInstrumentor(), "psycopg": statement_spans, "celery": CeleryInstrumentor(),
            "httpx": HTTPXClientInstrumentor()}


def tracing_install(exporter: Any, *, service_name: str = "agent-backplane", batch: bool = False,
                    disabled: Iterable[str] = ()) -> None:
    """Install the SDK with ``exporter`` and instrument Django, psycopg, Celery and httpx (less
    the ``disabled`` ones, by their names in ``INSTRUMENTATIONS``), once per process. Tests pass
    an in-memory exporter (``batch=False``: each span is exported as it ends).

    Called before Django builds its request handler (``AppConfig.ready``, or a test before its
    first request): the Django instrumentation adds its middleware to ``settings.MIDDLEWARE``.
    """
    global _enabled, _provider, _tracer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    # The stable HTTP and database conventions (http.request.method, http.response.status_code,
    # db.query.text …), not the old names the instrumentations still default to. Read once per
    # process, when the first instrumentation is installed; an operator's own choice stands.
    os.environ.setdefault("OTEL_SEMCONV_STABILITY_OPT_IN", "http,database")
    with _lock:
        if _provider is None:
            _provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
            # Global, so that the instrumentations and any library the product calls find it.
            trace.set_tracer_provider(_provider)
        if id(exporter) not in _processors:
            _processors[id(exporter)] = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
            _provider.add_span_processor(_processors[id(exporter)])
        _tracer = _provider.get_tracer("backplane")
        unknown = set(disabled) - set(INSTRUMENTATIONS)
        if unknown:
            raise ValueError(f"no instrumentation named {sorted(unknown)}; the names are {INSTRUMENTATIONS}")
        for name, instrumentor in _instrumentors().items():
            if name not in disabled and not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(tracer_provider=_provider)
        _enabled = True


def tracing_uninstall() -> None:
    """Undo ``tracing_install``'s instrumentation (tests). The provider and its exporters stay
    (OpenTelemetry sets the global provider once per process), but nothing starts spans on it any
    more and the helpers here are off; a later ``tracing_install`` turns them on again. Spans still
    queued for export are flushed first."""
    global _enabled, _tracer

    with _lock:
        for instrumentor in _instrumentors().values():
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()
        for processor in _processors.values():
            processor.force_flush()
        _tracer = trace.NoOpTracer()
        _enabled = False


# --- what the event log stores --------------------------------------------------------------


def current_trace_ids() -> tuple[str | None, str | None]:
    """The trace and span id (lowercase hex) of the span running now, or of the ``traceparent``
    the request came with while tracing is off; ``(None, None)`` outside any trace."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def traceparent(trace_id: str, span_id: str, *, sampled: bool = True) -> str:
    """The W3C ``traceparent`` header naming a span."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of a well-formed version-00 ``traceparent``; None otherwise (and for
    the all-zero ids W3C calls invalid)."""
    match = _TRACEPARENT.fullmatch((value or "").strip().lower())
    if match is None or set(match[1]) == {"0"} or set(match[2]) == {"0"}:
        return None
    return match[1], match[2]


def _remote_context(trace_id: str | None, span_id: str | None) -> otel_context.Context | None:
    if not trace_id or not span_id or len(trace_id) != 32 or len(span_id) != 16:
        return None
    try:
        span_context = SpanContext(trace_id=int(trace_id, 16), span_id=int(span_id, 16), is_remote=True,
                                   trace_flags=TraceFlags(TraceFlags.SAMPLED))
    except ValueError:
        return None
    if not span_context.is_valid:
        return None
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context))


class TraceContextMiddleware:
    """While tracing is off, make a request's ``traceparent`` the current context, so the events
    the request writes carry the agent's trace id. While it is on, Django's instrumentation has
    already done this (and started the server span under it): nothing to add."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        # From META, not ``request.headers``: that mapping is built on first use, for every
        # header, and nothing else on the request path builds it.
        header = None if _enabled else request.META.get("HTTP_TRACEPARENT")
        if header is None:
            return self.get_response(request)
        token = otel_context.attach(_propagator.extract({"traceparent": header}))
        try:
            return self.get_response(request)
        finally:
            otel_context.detach(token)


# --- the backplane's own spans --------------------------------------------------------------


@contextmanager
def server_span(name: str, *, traceparent_header: str | None, attributes: Mapping[str, Any]) -> Iterator[None]:
    """A request the HTTP front serves itself (api/agent_front.py), as the server span Django's
    instrumentation makes of the requests Django serves: a child of the request's
    ``traceparent``, current for the block. While tracing is off, the ``traceparent`` alone is
    made current, as ``TraceContextMiddleware`` does, so the events the request writes carry it."""
    if not _enabled:
        if traceparent_header is None:
            yield
            return
        token = otel_context.attach(_propagator.extract({"traceparent": traceparent_header}))
        try:
            yield
        finally:
            otel_context.detach(token)
        return
    context = _propagator.extract({"traceparent": traceparent_header}) if traceparent_header else None
    with _tracer.start_as_current_span(name, context=context, kind=SpanKind.SERVER, attributes=dict(attributes)):
        yield


@contextmanager
def publish_span(*, topic: str, message_id: str, destination: str, headers: Mapping[str, Any],
                 attempt: int) -> Iterator[str | None]:
    """The relay's delivery of one outbox message, as a messaging ``send`` span under the context
    the message was written in (its stored ``traceparent``). Yields the ``traceparent`` the
    message must go out with: the publish span's own while tracing is on, so a consumer's span is
    the publish span's child; the stored one (or None) while it is off."""
    stored = headers.get("traceparent")
    if not _enabled:
        yield stored
        return
    parent = parse_traceparent(stored)
    parent_context = _remote_context(*parent) if parent else None
    attributes: dict[str, Any] = {
        "messaging.system": "webhook" if destination == "webhook" else "kombu",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": topic,
        "messaging.message.id": message_id,
        "backplane.delivery.attempt": attempt,
    }
    if "task_id" in headers:
        attributes["backplane.task_id"] = str(headers["task_id"])
    if "seq" in headers:
        attributes["backplane.seq"] = headers["seq"]
    with _tracer.start_as_current_span(f"publish {topic}", context=parent_context, kind=SpanKind.PRODUCER,
                                       attributes=attributes, record_exception=True) as span:
        context = span.get_span_context()
        yield traceparent(format(context.trace_id, "032x"), format(context.span_id, "016x"))


@dataclass(frozen=True)
class TaskSpan:
    """A span of the backplane's own work on a task, opened by ``task_span_start``."""

    span: trace.Span
    trace_id: str
    span_id: str

    def end(self, *, error: str | None = None) -> None:
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()


def task_span_start(name: str, *, trace_id: str | None, span_id: str | None,
                    attributes: Mapping[str, Any]) -> TaskSpan | None:
    """Open (not make current) a span of the backplane's own work on a task, a child of the span
    that wrote the task's last event when that is known, so the task's trace goes on through it;
    without one, a child of the current span. The caller stores its ids on the events it writes
    (``EventDraft.trace_id``/``span_id``) and ends it. None while tracing is off."""
    if not _enabled:
        return None
    links = []
    current = trace.get_current_span().get_span_context()
    parent_context = _remote_context(trace_id, span_id)
    if parent_context is not None and current.is_valid:
        # The work that found the task (the detector's run, an agent's claim) is another trace.
        links.append(Link(current, {"backplane.link": "caused_by"}))
    span = _tracer.start_span(name, context=parent_context, kind=SpanKind.INTERNAL, links=links,
                              attributes=dict(attributes))
    context = span.get_span_context()
    return TaskSpan(span=span, trace_id=format(context.trace_id, "032x"), span_id=format(context.span_id, "016x"))


@contextmanager
def task_span(name: str, *, trace_id: str | None, span_id: str | None,
              attributes: Mapping[str, Any]) -> Iterator[None]:
    """``task_span_start`` as the current span for the block: the events written inside it
    carry its trace (the writer reads the current span)."""
    opened = task_span_start(name, trace_id=trace_id, span_id=span_id, attributes=attributes)
    if opened is None:
        yield
        return
    with trace.use_span(opened.span, end_on_exit=True, record_exception=True):
        yield


def span_annotate_write(*, task_id: object, kind: str, seq: int, events: Sequence[Any], agent: str | None,
                        lease_epoch: int) -> None:
    """Name the task a request wrote to on its span (the ``backplane.*`` attributes of
    docs/observability.md; for a model call, the ``gen_ai.*`` ones of ``gen_ai.span_attributes``).
    A request that writes to several tasks (a sub-task's claim reports to its parent) keeps the
    first as attributes, and each later write becomes a span event. The
    common case (one write) costs one ``set_attributes``: this runs on every append, so the task's
    id comes as it is (a UUID) and is written as text only for a span that records."""
    if not _enabled:
        return
    span = trace.get_current_span()
    if not span.is_recording():
        return
    attributes: dict[str, Any] = {"backplane.task_id": str(task_id), "backplane.task.kind": kind, "backplane.seq": seq,
                                  "backplane.event.type": events[-1].type if events else "",
                                  "backplane.event.count": len(events), "backplane.lease_epoch": lease_epoch}
    if agent:
        attributes["backplane.agent"] = agent
    # A model call's write carries what the GenAI conventions name a call by (telemetry/gen_ai.py).
    attributes.update(gen_ai.span_attributes(events))
    if "backplane.task_id" in (getattr(span, "attributes", None) or {}):
        span.add_event("backplane.events_written", attributes)
    else:
        span.set_attributes(attributes)
