"""The outbound guard (backplane/delivery/outbound.py): which addresses webhook and tool calls may
reach, checked on the address actually connected to, the setting that widens it, and a refused
webhook going through the normal retry and dead-letter path. Real HTTP servers on 127.0.0.1 stand
in for the endpoints; an empty allow list makes 127.0.0.1 as forbidden as any private address."""

from __future__ import annotations

import ast
import ipaddress
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from backplane.delivery import outbox, relay
from backplane.delivery.models import DeadLetter, OutboxDestination, OutboxMessage, WebhookSubscription
from backplane.delivery.outbound import OutboundRefused, address_refusal, outbound_client
from backplane.delivery.sinks import WebhookSink
from backplane.runtime.env import ImproperlyConfiguredEnv, env_networks

ROOT = Path(__file__).resolve().parents[3]
SETTING = "BACKPLANE_OUTBOUND_ALLOWED_NETWORKS"

# --- which addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "kind"), [
    ("10.0.0.5", "a private address"),
    ("172.16.0.1", "a private address"),
    ("172.31.255.254", "a private address"),
    ("192.168.1.1", "a private address"),
    ("169.254.169.254", "a link-local address"),
    ("127.0.0.1", "a loopback address"),
    ("::1", "a loopback address"),
    ("fe80::1", "a link-local address"),
    ("fc00::1", "a private address"),
    ("::ffff:127.0.0.1", "a loopback address"),
    ("::ffff:10.0.0.5", "a private address"),
    ("100.64.0.1", "a shared (carrier-grade NAT) address"),
    ("0.0.0.0", "an unspecified address"),
    ("::", "an unspecified address"),
    ("224.0.0.1", "a multicast address"),
    ("ff0e::1", "a multicast address"),
    ("240.0.0.1", "a reserved address"),
    ("192.0.2.1", "a reserved address"),
    ("2001:db8::1", "a reserved address"),
])
def test_it_refuses_addresses_that_are_not_public(address: str, kind: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), allowed=[]) == kind


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800::1", "::ffff:93.184.216.34", "8.8.8.8"])
def test_it_allows_public_addresses(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), allowed=[]) is None


def test_the_allow_list_opens_its_networks_and_nothing_else() -> None:
    allowed = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8")]
    for address in ("10.0.0.5", "::ffff:10.0.0.5", "fd12::1"):
        assert address_refusal(ipaddress.ip_address(address), allowed=allowed) is None
    for address in ("192.168.1.1", "169.254.169.254", "fc00::1"):
        assert address_refusal(ipaddress.ip_address(address), allowed=allowed) is not None


# --- the setting -------------------------------------------------------------------------------


def test_the_setting_reads_comma_separated_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SETTING, " 10.0.0.0/8, fd00::/8,192.168.1.7 ")
    assert env_networks(SETTING, []) == [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"),
                                         ipaddress.ip_network("192.168.1.7/32")]
    monkeypatch.setenv(SETTING, "")
    assert env_networks(SETTING, ["127.0.0.0/8"]) == []


@pytest.mark.parametrize("value", ["10.0.0.1/8", "10.0.0.0/33", "intranet", "10.0.0.0/8,,nope"])
def test_the_setting_refuses_a_malformed_network(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(SETTING, value)
    with pytest.raises(ImproperlyConfiguredEnv, match=SETTING):
        env_networks(SETTING, [])


def test_a_malformed_network_stops_the_process_at_start(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    env.update(BACKPLANE_ENV="test", DATABASE_URL="postgresql://nobody@localhost/none",
               BACKPLANE_VAR_DIR=str(tmp_path), **{SETTING: "10.0.0.0/8,10.1.2.3/16"})
    done = subprocess.run([sys.executable, "-c", "import backplane.settings"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"ImproperlyConfiguredEnv: {SETTING}: '10.1.2.3/16' is not a network" in done.stderr


def test_development_and_tests_allow_loopback_by_default(settings: Any) -> None:
    assert settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS == [ipaddress.ip_network("127.0.0.0/8"),
                                                             ipaddress.ip_network("::1/128")]


# --- the connection ----------------------------------------------------------------------------


@dataclass
class Endpoint:
    """A real HTTP server on 127.0.0.1 that records what reaches it. ``/redirect`` answers 307 to
    the cloud metadata address; ``/hook`` answers 204. As a proxy it receives absolute URLs."""

    port: int = 0
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Host

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    yield from _serve()


@pytest.fixture
def proxy() -> Iterator[Endpoint]:
    yield from _serve()


def _serve() -> Iterator[Endpoint]:
    state = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append(("POST", self.path, self.headers.get("Host", "")))
            if self.path.endswith("/redirect"):
                self.send_response(307)
                self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            else:
                self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield state
    server.shutdown()
    server.server_close()


def test_a_literal_loopback_address_is_refused_before_connecting(endpoint: Endpoint, settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    with outbound_client() as client, pytest.raises(OutboundRefused) as refused:
        client.post(endpoint.url("/hook"), content=b"{}")
    assert str(refused.value) == f"refused: 127.0.0.1 is a loopback address; allow it with {SETTING}"
    assert endpoint.requests == []


def test_a_name_is_checked_on_the_address_it_resolves_to(endpoint: Endpoint, settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    with outbound_client() as client, pytest.raises(OutboundRefused) as refused:
        client.post(endpoint.url("/hook", host="localhost"), content=b"{}")
    message = str(refused.value)
    assert message.startswith("refused: localhost (") and f"is a loopback address; allow it with {SETTING}" in message
    assert endpoint.requests == []


def test_an_allowed_name_connects_to_a_checked_address_and_keeps_its_host_header(endpoint: Endpoint) -> None:
    # The test allow list (loopback, both families). When localhost resolves to ::1 as well, the
    # endpoint does not listen there, and the next checked address, 127.0.0.1, is tried.
    with outbound_client() as client:
        answer = client.post(endpoint.url("/hook", host="localhost"), content=b"{}")
    assert answer.status_code == 204
    assert endpoint.requests == [("POST", "/hook", f"localhost:{endpoint.port}")]


def test_a_redirect_is_not_followed(endpoint: Endpoint) -> None:
    with outbound_client() as client:
        answer = client.post(endpoint.url("/redirect"), content=b"{}")
    assert answer.status_code == 307 and len(endpoint.requests) == 1


def test_through_a_proxy_the_target_is_checked_before_the_proxy_is_asked(proxy: Endpoint, settings: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")

    with outbound_client() as client:
        with pytest.raises(OutboundRefused, match=r"^refused: 10\.0\.0\.5 is a private address"):
            client.post("http://10.0.0.5/hook", content=b"{}")
        assert proxy.requests == []
        # A public target goes to the proxy, which is the operator's own and is not checked.
        answer = client.post("http://93.184.216.34/hook", content=b"{}")
    assert answer.status_code == 204
    assert proxy.requests == [("POST", "http://93.184.216.34/hook", "93.184.216.34")]


# HTTP clients and one-shot calls of the libraries a product module could reach a URL with.
_HTTP_CALLS = {"httpx": {"Client", "AsyncClient", "HTTPTransport", "AsyncHTTPTransport", "request", "stream", "get",
                         "post", "put", "patch", "delete"},
               "httpcore": {"ConnectionPool", "AsyncConnectionPool", "request", "stream"}}
_OTHER_HTTP_MODULES = {"urllib.request", "http.client", "requests", "urllib3", "aiohttp"}


def test_no_other_module_of_the_product_makes_an_http_client() -> None:
    """Every outbound call to a URL goes through outbound_client, so none skips the check."""
    offenders: list[str] = []
    for path in sorted(p for part in ("backplane", "recovery", "dashboard") for p in (ROOT / part).rglob("*.py")):
        if path == ROOT / "backplane" / "delivery" / "outbound.py":
            continue
        where = f"{path.relative_to(ROOT)}"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name) \
                    and called.attr in _HTTP_CALLS.get(called.value.id, ()):
                offenders.append(f"{where}:{called.lineno} {called.value.id}.{called.attr}()")
            elif isinstance(node, ast.ImportFrom) and node.module in {*_HTTP_CALLS, *_OTHER_HTTP_MODULES}:
                offenders.append(f"{where}:{node.lineno} from {node.module} import")
            elif isinstance(node, ast.Import) and {a.name for a in node.names} & _OTHER_HTTP_MODULES:
                offenders.append(f"{where}:{node.lineno} import")
    assert offenders == []


# --- a refused webhook -------------------------------------------------------------------------


def webhooks_through(sink: WebhookSink) -> Callable[[OutboxMessage, dict[str, Any]], None]:
    """The relay's publisher for webhook rows through the production sink; broker rows are taken
    as delivered, since only the webhook is under test."""

    def publish(message: OutboxMessage, body: dict[str, Any]) -> None:
        if message.destination == OutboxDestination.WEBHOOK:
            sink.publish(message, body)

    return publish


def test_a_refused_webhook_is_retried_then_dead_lettered_and_never_sent(db: None, endpoint: Endpoint,
                                                                       settings: Any) -> None:
    settings.BACKPLANE_OUTBOUND_ALLOWED_NETWORKS = []
    WebhookSubscription.objects.create(name="crm", topic_pattern="leads.*", url=endpoint.url("/hook"), secret="s",
                                       max_attempts=2)
    with transaction.atomic():
        outbox.outbox_enqueue(topic="leads.scored", key="lead-1", payload={"score": 7}, headers={},
                              now=timezone.now())
    sink = WebhookSink()
    expected = f"webhook crm: refused: 127.0.0.1 is a loopback address; allow it with {SETTING}"

    step = relay.outbox_relay_once(publish=webhooks_through(sink))
    row = OutboxMessage.objects.get(destination="webhook")
    assert step.failed == 1 and (row.status, row.attempts, row.last_error) == ("pending", 1, expected)

    OutboxMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    step = relay.outbox_relay_once(publish=webhooks_through(sink))
    row.refresh_from_db()
    (dead_letter,) = DeadLetter.objects.filter(outbox_message=row)
    assert step.dead == 1 and row.status == "dead" and dead_letter.attempts == 2
    assert expected in dead_letter.error
    assert endpoint.requests == []
    sink.close()


# --- the admin ---------------------------------------------------------------------------------


@pytest.fixture
def admin_client(db: None) -> Client:
    client = Client()
    # force_login: the login check (django-axes) needs a request, which Client.login() does not pass.
    client.force_login(User.objects.create_superuser("root", "", "pw-for-tests-only"))
    return client


def subscription_form(url: str, name: str) -> dict[str, Any]:
    return {"name": name, "topic_pattern": "leads.*", "url": url, "secret": "s", "is_active": "on",
            "ordering": "strict", "timeout_seconds": 5, "max_concurrency": 2}


def test_the_admin_refuses_a_webhook_to_a_literal_address_the_relay_would_refuse(admin_client: Client) -> None:
    page = admin_client.post("/admin/backplane/webhooksubscription/add/",
                             subscription_form("http://169.254.169.254/latest/meta-data/", "metadata"))
    assert page.status_code == 200
    assert f"refused: 169.254.169.254 is a link-local address; allow it with {SETTING}" in page.content.decode()
    assert not WebhookSubscription.objects.exists()

    # Loopback is allowed in tests; a name is not resolved at save time (the connection checks it).
    for url, name in (("http://127.0.0.1:9/hook", "local"), ("https://hooks.internal.example/in", "named")):
        saved = admin_client.post("/admin/backplane/webhooksubscription/add/", subscription_form(url, name))
        assert saved.status_code == 302, saved.content.decode()[:2000]
    assert set(WebhookSubscription.objects.values_list("name", flat=True)) == {"local", "named"}
