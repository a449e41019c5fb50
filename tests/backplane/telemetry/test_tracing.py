"""Traces (backplane/telemetry/tracing.py): an agent's traceparent through the append, the
database, the relay's publish and the message sent; a crash's stall and recovery in the task's
trace; nothing recorded while tracing is off; log lines that name their trace.

Spans go to OpenTelemetry's in-memory exporter; the database, the broker and the requests are
real (the filesystem broker the tests use, Django's test client through every middleware)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from backplane.delivery import relay
from backplane.delivery.models import OutboxMessage
from backplane.delivery.sinks import Sinks
from backplane.eventlog import services
from backplane.eventlog.models import Event
from backplane.telemetry import tracing
from recovery.detector import lease_expire_stalled
from recovery.models import Tool
from tests.api.conftest import AgentClient, create_task
from tests.backplane.telemetry.conftest import LocalTool, span_exporter

REPO = Path(__file__).resolve().parents[3]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"

def agent(name: str) -> AgentClient:
    created = services.agent_create(name=name, namespace="acme", kinds=())
    client = AgentClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created.token}")
    return client


def hexes(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else format(span.parent.span_id, "016x")


def in_trace(exporter: InMemorySpanExporter, trace_id: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if hexes(span)[0] == trace_id]


def server_span(exporter: InMemorySpanExporter, trace_id: str, route_part: str) -> ReadableSpan:
    found = [s for s in in_trace(exporter, trace_id) if s.kind == SpanKind.SERVER and route_part in s.name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def traced_claim(client: AgentClient, trace_id: str, **body: Any) -> dict[str, Any]:
    response = client.post("/api/v1/leases/", body, format="json", HTTP_TRACEPARENT=f"00-{trace_id}-{PARENT}-01")
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_an_append_with_a_traceparent_is_one_trace_from_request_to_the_message_sent(
        spans: InMemorySpanExporter, broker_queue: Any) -> None:
    alice: AgentClient = agent("alice")
    task = create_task(alice)
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "LeadScored", "payload": {"score": 7},
        "outbox": [{"topic": "leads.scored", "payload": {"score": 7}}],
    }, format="json", HTTP_TRACEPARENT=f"00-{TRACE}-{PARENT}-01")
    assert response.status_code == 201, response.content

    server = server_span(spans, TRACE, "events")
    assert parent_of(server) == PARENT and attributes(server)["http.response.status_code"] == 201
    _, server_id = hexes(server)
    database = [s for s in in_trace(spans, TRACE) if s.kind == SpanKind.CLIENT
                and attributes(s).get("db.system.name") == "postgresql"]
    assert database and {parent_of(s) for s in database} == {server_id}
    assert any("INSERT INTO backplane_event" in str(attributes(s).get("db.query.text")) for s in database)

    # The event carries the agent's trace and the span that wrote it; its message names that span.
    event = Event.objects.get(task_id=task["task_id"], seq=response.json()["seq"])
    assert (response.json()["trace_id"], event.span_id) == (TRACE, server_id)
    message = OutboxMessage.objects.get(topic="leads.scored")
    assert message.headers["traceparent"] == f"00-{TRACE}-{server_id}-01"

    sent: list[dict[str, Any]] = []
    sinks = Sinks()

    def publish(outgoing: OutboxMessage, body: dict[str, Any]) -> None:
        sent.append(body)
        sinks(outgoing, body)

    try:
        # The task's lifecycle message goes first (one key, in order), then the event's.
        relay.outbox_relay_until_idle(publish=publish, budget_seconds=30)
    finally:
        sinks.close()
    (publish_span,) = [s for s in in_trace(spans, TRACE) if s.name == "publish leads.scored"]
    assert publish_span.kind == SpanKind.PRODUCER and parent_of(publish_span) == server_id
    assert attributes(publish_span)["messaging.destination.name"] == "leads.scored"
    assert attributes(publish_span)["messaging.message.id"] == str(message.message_id)
    assert attributes(publish_span)["backplane.task_id"] == task["task_id"]
    # The message goes out naming the publish span, not the stored context, not a random id.
    (body,) = [b for b in sent if b["topic"] == "leads.scored"]
    assert body["headers"]["traceparent"] == f"00-{TRACE}-{hexes(publish_span)[1]}-01"


def test_the_gateways_call_to_a_tool_is_a_client_span_in_the_agents_trace(
        spans: InMemorySpanExporter, local_tool: LocalTool) -> None:
    Tool.objects.create(name="send-email", url=local_tool.url, timeout_seconds=5)
    alice = agent("alice")
    task = create_task(alice)
    response = alice.post("/api/v1/tools/send-email/invoke/", {"task_id": task["task_id"], "step": 1, "input": {}},
                          format="json", HTTP_TRACEPARENT=f"00-{TRACE}-{PARENT}-01")
    assert response.status_code == 200, response.content
    server = server_span(spans, TRACE, "invoke")
    (call,) = [s for s in in_trace(spans, TRACE)
               if s.kind == SpanKind.CLIENT and "http.request.method" in attributes(s)]
    assert parent_of(call) == hexes(server)[1] and attributes(call)["http.request.method"] == "POST"
    # The tool is told the trace: its side of the call can join it.
    assert local_tool.header("traceparent") == [f"00-{TRACE}-{hexes(call)[1]}-01"]
    dispatched, answered = Event.objects.filter(task_id=task["task_id"], type__startswith="ToolCall").order_by("seq")
    assert dispatched.trace_id == answered.trace_id == TRACE


def test_a_request_without_a_traceparent_starts_a_trace_its_events_carry(
        spans: InMemorySpanExporter) -> None:
    alice: AgentClient = agent("alice")
    task = create_task(alice)
    started = Event.objects.get(task_id=task["task_id"], seq=1)
    creation = [s for s in spans.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert len(creation) == 1 and creation[0].parent is None
    assert (started.trace_id, started.span_id) == hexes(creation[0])
    # A trace id the client puts in the body is its own choice and is kept as sent.
    response = alice.post(f"/api/v1/tasks/{task['task_id']}/events/", {
        "type": "ReasoningStepCompleted", "payload": {"step": 1}, "trace_id": "not-a-w3c-trace"}, format="json")
    assert response.json()["trace_id"] == "not-a-w3c-trace"
    assert Event.objects.get(task_id=task["task_id"], seq=2).span_id is None


def test_an_idempotent_retry_in_another_trace_is_still_a_replay(
        spans: InMemorySpanExporter) -> None:
    alice: AgentClient = agent("alice")
    task = create_task(alice)
    body = {"type": "EmailSent", "payload": {"to": "bob"}, "idempotency_key": "email-1"}
    url = f"/api/v1/tasks/{task['task_id']}/events/"
    first = alice.post(url, body, format="json", HTTP_TRACEPARENT=f"00-{TRACE}-{PARENT}-01")
    again = alice.post(url, body, format="json", HTTP_TRACEPARENT=f"00-{OTHER_TRACE}-{PARENT}-01")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json() and first.json()["trace_id"] == TRACE


def test_a_stall_and_its_recovery_continue_the_crashed_agents_trace(
        spans: InMemorySpanExporter) -> None:
    alice: AgentClient = agent("alice")
    bob: AgentClient = agent("bob")
    task = create_task(alice)
    claimed = traced_claim(alice, TRACE, lease_seconds=5)
    crashed_claim = server_span(spans, TRACE, "leases")

    # alice dies holding the lease; the detector takes the task back.
    sweep = lease_expire_stalled(now=timezone.now() + timedelta(seconds=10))
    assert sweep.expired == 1
    (stall,) = [s for s in spans.get_finished_spans() if s.name == "stall task"]
    assert hexes(stall)[0] == TRACE and parent_of(stall) == hexes(crashed_claim)[1]
    assert attributes(stall)["backplane.task_id"] == task["task_id"]
    assert attributes(stall)["backplane.lease_epoch"] == claimed["lease_epoch"]
    stalled = Event.objects.get(task_id=task["task_id"], type="TaskStalled")
    assert (stalled.trace_id, stalled.span_id) == hexes(stall)

    # bob claims it in a trace of his own: the recovery is in the task's trace, linked to bob's.
    recovered = traced_claim(bob, OTHER_TRACE)
    assert recovered["recovered"] is True
    (recovery,) = [s for s in spans.get_finished_spans() if s.name == "recover task"]
    assert hexes(recovery)[0] == TRACE and parent_of(recovery) == hexes(stall)[1]
    bob_claim = server_span(spans, OTHER_TRACE, "leases")
    assert [format(link.context.span_id, "016x") for link in recovery.links] == [hexes(bob_claim)[1]]
    reclaimed = Event.objects.filter(task_id=task["task_id"], type="TaskClaimed").latest("seq")
    assert (reclaimed.trace_id, reclaimed.span_id) == hexes(recovery)
    assert reclaimed.agent == "bob"


def test_with_tracing_off_nothing_is_instrumented_and_the_agents_trace_id_is_still_kept(
        committed_db: None) -> None:
    assert not tracing.tracing_enabled()
    assert not any("opentelemetry" in name for name in django_settings.MIDDLEWARE)
    span_exporter.clear()
    alice: AgentClient = agent("alice")
    task = alice.post("/api/v1/tasks/", {"kind": "lead-qualification", "input": {}}, format="json",
                      HTTP_TRACEPARENT=f"00-{TRACE}-{PARENT}-01").json()
    untraced = create_task(alice)
    assert Event.objects.get(task_id=task["task_id"], seq=1).trace_id == TRACE
    assert Event.objects.get(task_id=untraced["task_id"], seq=1).trace_id is None
    assert span_exporter.get_finished_spans() == ()


def test_json_log_lines_carry_the_trace_and_span_ids() -> None:
    script = (
        "import logging\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from backplane.telemetry import tracing\n"
        "logging.getLogger('backplane.check').warning('outside')\n"
        "tracing.tracing_install(InMemorySpanExporter())\n"
        "with tracing.task_span('checking', trace_id=None, span_id=None, attributes={}):\n"
        "    print('ids', *tracing.current_trace_ids(), flush=True)\n"
        "    logging.getLogger('backplane.check').warning('inside %s', 'a span')\n"
    )
    env = {**os.environ, "LOG_FORMAT": "json", "DJANGO_SETTINGS_MODULE": "backplane.settings"}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ((trace_id, span_id),) = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("ids ")]
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    by_message = {line["message"]: line for line in lines if line["logger"] == "backplane.check"}
    assert by_message["outside"]["trace_id"] is None and by_message["outside"]["level"] == "WARNING"
    inside = by_message["inside a span"]
    assert (inside["trace_id"], inside["span_id"]) == (trace_id, span_id)
    assert inside["time"].endswith("Z") and {"process", "thread"} <= set(inside)


def test_with_an_otlp_endpoint_set_the_spans_go_to_the_collector(local_tool: LocalTool) -> None:
    """The product as deployed: OTEL_EXPORTER_OTLP_ENDPOINT names a collector (here a local
    stand-in that keeps what it is sent) and a request's span arrives there by OTLP/HTTP."""
    script = (
        "from django.test import Client\n"
        "from opentelemetry import trace\n"
        f"assert Client().get('/login/', HTTP_TRACEPARENT='00-{TRACE}-{PARENT}-01').status_code == 200\n"
        "assert trace.get_tracer_provider().force_flush(10_000)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backplane.settings",
           "OTEL_EXPORTER_OTLP_ENDPOINT": local_tool.base_url, "OTEL_SERVICE_NAME": "backplane-under-test"}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(local_tool.paths) == {"/v1/traces"}
    assert local_tool.header("content-type")[0] == "application/x-protobuf"
    spans_sent = []
    for body in local_tool.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            spans_sent += [(service, span.trace_id.hex(), span.parent_span_id.hex(), span.kind)
                           for scope in resource_spans.scope_spans for span in scope.spans]
    assert ("backplane-under-test", TRACE, PARENT, ProtoSpan.SpanKind.SPAN_KIND_SERVER) in spans_sent


def test_an_instrumentation_left_off_by_name_records_no_spans(committed_db: None) -> None:
    """OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=psycopg (settings): the requests are traced, the
    statements are not, and the events still carry the request's trace."""
    connection.close()
    tracing.tracing_install(span_exporter, service_name="backplane-test", disabled=("psycopg",))
    span_exporter.clear()
    try:
        alice: AgentClient = agent("alice")
        task = alice.post("/api/v1/tasks/", {"kind": "lead-qualification", "input": {}}, format="json",
                          HTTP_TRACEPARENT=f"00-{TRACE}-{PARENT}-01").json()
        (server,) = in_trace(span_exporter, TRACE)
        assert server.kind == SpanKind.SERVER
        assert Event.objects.get(task_id=task["task_id"], seq=1).trace_id == TRACE
        with pytest.raises(ValueError, match="no instrumentation named"):
            tracing.tracing_install(span_exporter, disabled=("sqlite",))
    finally:
        tracing.tracing_uninstall()
        connection.close()
