"""Real processes for the end-to-end tests: the product's web server, agent processes and a tool.

- ``backplane_server``: ``uvicorn backplane.asgi:application`` in a child process, on a free
  port, against pytest-django's test database (so tests using ``committed_db`` see each other's
  commits). One per module: it must stop before pytest-django drops the test database.
- ``tool_server``: a small, well-behaved HTTP tool on 127.0.0.1 (``http.server`` in a thread)
  that dedupes by ``Idempotency-Key`` and counts requests and side effects per key.
- ``run_agent``: starts ``agent_worker.py`` (Django-free, ``backplane_client.agent`` only).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from backplane_client.agent import AgentClient
from recovery.detector import lease_expire_stalled
from tests.support.live_server import WebProcess as BackplaneServer

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "agent_worker.py"


# --- the product's web server (tests/support/live_server.py, shared with tests/browser) ----------


@pytest.fixture(scope="module")
def backplane_server(django_db_setup: None) -> Iterator[BackplaneServer]:
    server = BackplaneServer(name="e2e-server")
    try:
        yield server.start()
    finally:
        server.close()


# --- the external tool ----------------------------------------------------------------------


@dataclass
class ToolServer:
    """A well-behaved tool: acts once per ``Idempotency-Key``, answers a repeat with the same answer."""

    port: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    effects: Counter[str] = field(default_factory=Counter)
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, tool: str) -> str:
        return f"http://127.0.0.1:{self.port}/{tool}"

    def handle(self, path: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests[key] += 1
            if key not in self.answers:
                self.effects[key] += 1  # the side effect: an email sent, a payment made
                self.paths[key] = path
                self.answers[key] = {"tool": path.strip("/"), "effect_id": uuid.uuid4().hex, "input": body}
            return self.answers[key]

    def wait_for_request(self, key: str, count: int = 1, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while self.requests[key] < count:
            assert time.monotonic() < deadline, f"the tool never saw {count} request(s) with key {key}"
            time.sleep(0.01)


def _handler_for(tool: ToolServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            key = self.headers.get("Idempotency-Key")
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not key:
                self._answer(400, {"error": "Idempotency-Key header required"})
                return
            self._answer(200, tool.handle(self.path, key, json.loads(raw or b"{}")))

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the caller died before reading (zone 2): the effect already happened

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def tool_server() -> Iterator[ToolServer]:
    tool = ToolServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(tool))
    httpd.daemon_threads = True
    tool.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield tool
    finally:
        httpd.shutdown()
        httpd.server_close()


# --- agent processes ------------------------------------------------------------------------


@dataclass
class AgentRun:
    process: subprocess.Popen[str]
    stdout: str = ""
    stderr: str = ""

    def wait(self, timeout: float = 30) -> int:
        try:
            self.stdout, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.stdout, self.stderr = self.process.communicate()
            raise AssertionError(f"agent process still running after {timeout} s\n{self.describe()}") from None
        return self.process.returncode

    @property
    def reports(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def reported(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.reports if r["event"] == event]

    def describe(self) -> str:
        return f"exit {self.process.returncode}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-4000:]}"


def kill_those_still_running(agents: Iterable[AgentRun]) -> None:
    """Agent processes a test started and left running are killed, so none works on into the next."""
    for agent in agents:
        if agent.process.poll() is None:
            agent.process.kill()
            agent.process.communicate()


def sweep_once_the_lease_ran_out(observer: AgentClient, task_id: str, *, lease_seconds: float) -> None:
    """What the stall detector's beat duty does, run here once a dead run's lease has expired."""
    deadline = time.monotonic() + 4 * lease_seconds
    while lease_expire_stalled().expired == 0:
        assert time.monotonic() < deadline, observer.get_task(task_id)
        time.sleep(0.1)


@pytest.fixture
def run_agent(backplane_server: BackplaneServer) -> Iterator[Callable[..., AgentRun]]:
    started: list[AgentRun] = []

    def run(token: str, kind: str, *, crash_at: str | None = None, claim_timeout: float = 0.0) -> AgentRun:
        env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}}
        env["PYTHONPATH"] = str(ROOT)
        env["BACKPLANE_TOKEN"] = token
        argv = [sys.executable, str(WORKER), "--base-url", backplane_server.url, "--kind", kind,
                "--claim-timeout", str(claim_timeout)]
        if crash_at:
            argv += ["--crash-at", crash_at]
        agent = AgentRun(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        started.append(agent)
        return agent

    yield run
    kill_those_still_running(started)
