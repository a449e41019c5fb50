"""Real servers for the SDK's tests (tests/client/test_sdk_*.py): no mock of the backplane.

- ``sdk_server``: the product's web process (tests/support/live_server.py) against the test
  database, one for the package's tests (it stops before pytest-django drops the database).
- ``fleet``: a fresh namespace with agents and their tokens, created in the committed test
  database the server reads; ``agents``: their clients, and the moves the tests repeat.
- ``tool_server``: the end-to-end tests' tool (tests/e2e/conftest.py), for the gateway.
- ``FaultProxy``: a TCP proxy in front of the server that misbehaves on chosen requests the
  way networks do: it answers 503 itself, or forwards a request and then drops the connection
  before relaying the answer (the server did the work; the client never hears of it).
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone

from backplane.eventlog import services
from backplane_client import AgentClient, RetryPolicy, TaskSession
from recovery.detector import lease_expire_stalled
from tests.e2e.conftest import tool_server  # noqa: F401 (the e2e tests' tool, as a fixture here too)
from tests.support.live_server import WebProcess

FORWARD = "forward"
DROP_ANSWER = "drop-answer"  # forward, read the whole answer, close without relaying a byte
UNAVAILABLE = "503"  # answer 503 in the contract's shape without forwarding, no Retry-After


@pytest.fixture(scope="package")
def sdk_server(django_db_setup: None) -> Iterator[WebProcess]:
    server = WebProcess(name="sdk-server")
    try:
        yield server.start()
    finally:
        server.close()


@dataclass
class Fleet:
    """A namespace of agents: ``planner`` creates and observes, ``worker``/``other`` claim
    ``KIND``, ``child`` claims ``CHILD_KIND``."""

    namespace: str
    tokens: dict[str, str]

    KIND = "sdk-work"
    CHILD_KIND = "sdk-child"


@pytest.fixture
def fleet(committed_db: None) -> Fleet:
    namespace = f"sdk-{uuid.uuid4().hex[:8]}"
    tokens = {
        name: services.agent_create(name=name, namespace=namespace, kinds=kinds).token
        for name, kinds in (
            ("planner", ()),
            ("worker", (Fleet.KIND,)),
            ("other", (Fleet.KIND,)),
            ("child", (Fleet.CHILD_KIND,)),
        )
    }
    return Fleet(namespace=namespace, tokens=tokens)


QUICK = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)


class Crash(Exception):
    """What an agent dies of in these tests."""


class Agents:
    """Clients of one fleet against one server, and the moves the tests repeat."""

    def __init__(self, server: WebProcess, fleet: Fleet) -> None:
        self.fleet = fleet
        self.planner = AgentClient(server.url, fleet.tokens["planner"], retry=QUICK)
        self.worker = AgentClient(server.url, fleet.tokens["worker"], retry=QUICK)
        self.other = AgentClient(server.url, fleet.tokens["other"], retry=QUICK)
        self.child = AgentClient(server.url, fleet.tokens["child"], retry=QUICK)

    def close(self) -> None:
        for bp in (self.planner, self.worker, self.other, self.child):
            bp.close()

    def task(self, **input: Any) -> str:
        task_id: str = self.planner.create_task(Fleet.KIND, input or {"lead": "alice"})["task_id"]
        return task_id

    def claim(
        self, bp: AgentClient, *, lease_seconds: int = 30, heartbeat_interval: float | None = None
    ) -> TaskSession:
        session = bp.claim_session([Fleet.KIND], lease_seconds=lease_seconds, heartbeat_interval=heartbeat_interval)
        assert session is not None, "nothing to claim"
        return session

    def expire(self, seconds_ahead: float = 3600) -> None:
        """The stall detector's sweep, as if the clock were ``seconds_ahead`` later."""
        sweep = lease_expire_stalled(now=timezone.now() + timedelta(seconds=seconds_ahead))
        assert sweep.expired == 1, sweep

    def types(self, task_id: str) -> Counter[str]:
        return Counter(event["type"] for event in self.planner.iter_events(task_id))

    def last_seq(self, task_id: str) -> int:
        return int(self.planner.get_task(task_id)["last_seq"])


@pytest.fixture
def agents(sdk_server: WebProcess, fleet: Fleet) -> Iterator[Agents]:
    agents = Agents(sdk_server, fleet)
    try:
        yield agents
    finally:
        agents.close()


@dataclass
class FaultProxy:
    """Forwards HTTP/1.1 requests to ``upstream`` one per connection, applying ``faults`` in order
    (one per request; plain forwarding once they run out). ``seen`` lists ``(method, path,
    what was done)`` for every request that arrived."""

    upstream: tuple[str, int]
    faults: deque[str] = field(default_factory=deque)
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, *faults: str) -> None:
        with self.lock:
            self.faults.extend(faults)

    def requests_to(self, path_part: str) -> list[tuple[str, str, str]]:
        with self.lock:
            return [entry for entry in self.seen if path_part in entry[1]]

    def handle(self, conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            if request is None:
                return
            head, body = request
            method, path = head.split(b" ", 2)[:2]
            with self.lock:
                fault = self.faults.popleft() if self.faults else FORWARD
                self.seen.append((method.decode(), path.decode(), fault))
            if fault == UNAVAILABLE:
                payload = json.dumps({"error": {"code": "unavailable", "message": "proxy says no", "details": {}}})
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload.encode()))
                return
            answer = self._forward(head, body)
            if fault == DROP_ANSWER:
                return  # the server has answered; the client gets a closed connection instead
            conn.sendall(answer)

    def _forward(self, head: bytes, body: bytes) -> bytes:
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        with socket.create_connection(self.upstream, timeout=30) as upstream:
            upstream.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)
            chunks = []
            while chunk := upstream.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def _read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head, body


@pytest.fixture
def fault_proxy(sdk_server: WebProcess) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream=(sdk_server.host, sdk_server.port))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    proxy.port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(30)
            threading.Thread(target=proxy.handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


class CountingTransport(httpx.HTTPTransport):
    """A real transport that counts the requests it was asked to send (connected or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        return super().handle_request(request)
