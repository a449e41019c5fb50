"""Fixtures the telemetry tests share."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backplane.telemetry import tracing

# One exporter for the whole run: OpenTelemetry sets the global provider once per process.
span_exporter = InMemorySpanExporter()


@pytest.fixture
def spans(committed_db: None) -> Iterator[InMemorySpanExporter]:
    """Tracing on, as with OTEL_EXPORTER_OTLP_ENDPOINT set, exporting to memory. The connection
    is closed first, as it would be in a process that starts traced."""
    connection.close()
    tracing.tracing_install(span_exporter, service_name="backplane-test")
    span_exporter.clear()
    try:
        yield span_exporter
    finally:
        tracing.tracing_uninstall()
        connection.close()
        span_exporter.clear()


@dataclass
class LocalTool:
    """A tool on 127.0.0.1: its URL, and each request's path, headers and body, in order."""

    url: str
    requests: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.url.removesuffix("/send")

    def header(self, name: str) -> list[str | None]:
        return [headers.get(name.lower()) for headers in self.requests]


@pytest.fixture
def local_tool() -> Iterator[LocalTool]:
    """An external tool (a fake is fine: it is not the product) that answers every POST with 200
    and a JSON object."""
    tool = LocalTool(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            tool.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            tool.paths.append(self.path)
            tool.requests.append({name.lower(): value for name, value in self.headers.items()})
            body = b'{"sent": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    tool.url = f"http://127.0.0.1:{server.server_address[1]}/send"
    try:
        yield tool
    finally:
        server.shutdown()
        server.server_close()
