"""The demo's outside world: a small HTTP service whose tools have real, counted side effects.

It stands in for a CRM, a mail provider and a payment processor, the way such APIs behave:

- every call must carry an ``Idempotency-Key`` (400 without one), and the first call with a key
  acts and writes one ledger row (``demo.models.LedgerEntry``); any later call with that key
  answers the stored response and counts a replay (the Stripe model);
- some calls fail *transiently* (503 before acting: the caller should retry with the same key),
  some *permanently* (a declined card is a 402 that is itself the recorded answer), and a mail
  domain that always bounces keeps answering 503 so the task fails once its attempts are spent;
- a CRM revert sometimes finds the record edited by a person (409, before acting): the
  compensation becomes a dead letter, and a reviewer's requeue then succeeds;
- ``crm-lookup`` can have outage windows (every ``outage_every`` seconds, ``outage_seconds``
  long), so the backplane's per-tool circuit breaker opens and half-opens.

It also receives what agents report about themselves (``POST /observations``) and the relay's
signed webhooks for compensations (``POST /compensations``): the compensating agent is this
service, which runs the compensation and reports its outcome with the SDK.

The ledger's ``subject`` is the effect's business identity, worked out here from the request,
not taken from the caller: ``<tool>:<lead id>``. Each lead is one task, and each tool acts at most
once for it, so two rows with one subject are a duplicate side effect, whatever keys were used.

The service runs in threads of the ``manage.py demo`` process; each request uses the ORM on its
thread's own connection, closed when the request ends.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.db import IntegrityError, close_old_connections, connection, transaction
from django.db.models import F
from django.utils import timezone

from backplane_client.signing import SIGNATURE_HEADER, SignatureError, verify
from demo import llm
from demo.models import LedgerEntry, Observation

logger = logging.getLogger(__name__)

# Tools the agents call directly (the proxy records the call; the agent makes it) ...
DIRECT_TOOLS = ("web-enrich", "crm-write", "email-send", "payments-charge")
# ... the one the backplane's gateway calls for them (``POST /tools/crm-lookup/invoke/``) ...
GATEWAY_TOOLS = ("crm-lookup",)
# ... and the compensations the sagas ask for, with the tool each one undoes.
COMPENSATIONS = {"crm-revert": "crm-write", "email-recall": "email-send", "payments-refund": "payments-charge"}
BOUNCING_DOMAIN = "bounce.example"


@dataclass(frozen=True)
class Faults:
    """How often the outside world misbehaves. Rates are per call (per key), decided by a
    seeded generator, so a run is reproducible."""

    seed: int = 7
    transient_rate: float = 0.1  # 503 on a key's first attempt, before acting
    decline_rate: float = 0.08  # payments-charge answers 402 (the card is declined)
    revert_failure_rate: float = 0.15  # crm-revert fails: the compensation becomes a dead letter
    outage_every: float = 0.0  # seconds between crm-lookup outages; 0 = none
    outage_seconds: float = 6.0
    latency_ms: tuple[int, int] = (5, 40)


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


class ToolWorld:
    """The tools' behaviour, apart from HTTP (tests drive it directly)."""

    def __init__(self, faults: Faults, *, record_compensation: Callable[[str, str, dict[str, Any]], None],
                 owns_compensation: Callable[[str], bool] = lambda key: True) -> None:
        self.faults = faults
        self.record_compensation = record_compensation
        self.owns_compensation = owns_compensation
        # Failed attempts per key, for the "fails on the first attempt only" faults. In memory:
        # a restarted service forgets them, and a key then simply fails once more. An entry goes
        # when its key acts, so only keys that never act again (a task given up) stay.
        self.started = time.monotonic()
        self._attempts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    # --- the tools -------------------------------------------------------------------------

    def call(self, tool: str, key: str, body: dict[str, Any]) -> Answer:
        if tool not in DIRECT_TOOLS + GATEWAY_TOOLS + tuple(COMPENSATIONS):
            return Answer(404, {"error": f"no tool {tool!r}"})
        known = self._replay(tool, key)
        if known is not None:
            return known
        with self._lock:
            self._attempts[(tool, key)] += 1
            attempt = self._attempts[(tool, key)]
        failure = self._failure(tool, key, body, attempt)
        if failure is not None:
            return failure
        with self._lock:
            self._attempts.pop((tool, key), None)
        status, response = self._act(tool, key, body)
        return self._record(tool, key, body, status, response)

    def _replay(self, tool: str, key: str) -> Answer | None:
        # Count first, then read: a row is never deleted while its task lives, so a row the
        # UPDATE counted is there for the GET.
        updated = LedgerEntry.objects.filter(tool=tool, idempotency_key=key).update(
            replays=F("replays") + 1, last_replay_at=timezone.now())
        if not updated:
            return None
        entry = LedgerEntry.objects.get(tool=tool, idempotency_key=key)
        return Answer(entry.status_code, {**entry.response, "replayed": True})

    def _failure(self, tool: str, key: str, body: dict[str, Any], attempt: int) -> Answer | None:
        """A failure that happens *before* the tool acts: nothing is written."""
        faults = self.faults
        if tool == "crm-lookup" and faults.outage_every > 0:
            phase = (time.monotonic() - self.started) % faults.outage_every
            if phase > faults.outage_every - faults.outage_seconds:
                return Answer(503, {"error": "crm is down for maintenance"})
        if tool == "email-send" and str(body.get("to", "")).endswith("@" + BOUNCING_DOMAIN):
            return Answer(503, {"error": f"mail relay for {BOUNCING_DOMAIN} is not answering"})
        if attempt == 1 and tool not in COMPENSATIONS and llm.rng(faults.seed, key, "transient").random() < \
                faults.transient_rate:
            return Answer(503, {"error": f"{tool} is briefly overloaded; retry with the same key"})
        if attempt == 1 and tool == "crm-revert" and llm.rng(faults.seed, key, "revert").random() < \
                faults.revert_failure_rate:
            return Answer(409, {"error": "the CRM record was edited by a person since; check it, then requeue"})
        return None

    def _act(self, tool: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = llm.rng(self.faults.seed, key, "act")
        lead = str(body.get("lead_id", ""))
        if tool == "crm-lookup":
            return 200, {"lead_id": lead, "employees": r.randint(5, 5000), "previous_contacts": r.randint(0, 4)}
        if tool == "web-enrich":
            return 200, {"company": body.get("company"), "employees": r.randint(5, 5000),
                         "industry": r.choice(["saas", "retail", "logistics", "fintech", "health"])}
        if tool == "crm-write":
            return 200, {"record": f"crm-{uuid.UUID(int=r.getrandbits(128)).hex[:12]}", "stage": body.get("stage")}
        if tool == "email-send":
            return 200, {"message_id": f"<{uuid.UUID(int=r.getrandbits(128)).hex}@mail.example>",
                         "to": body.get("to")}
        if tool == "payments-charge":
            if llm.rng(self.faults.seed, lead, "decline").random() < self.faults.decline_rate:
                return 402, {"error": "card_declined", "lead_id": lead}
            return 200, {"charge": f"ch_{uuid.UUID(int=r.getrandbits(128)).hex[:16]}",
                         "amount_cents": body.get("amount_cents")}
        return 200, {"undone": COMPENSATIONS.get(tool), "of": body}

    def _record(self, tool: str, key: str, body: dict[str, Any], status: int, response: dict[str, Any]) -> Answer:
        # The tool "works" for a few milliseconds before its effect is written: an agent killed
        # with its request in flight (zone 2) dies while the tool is still acting.
        ms = llm.rng(self.faults.seed, key, "latency").randint(*self.faults.latency_ms)
        time.sleep(ms / 1000)
        task_id = body.get("task_id")
        try:
            with transaction.atomic():
                LedgerEntry.objects.create(
                    tool=tool, idempotency_key=key, subject=f"{tool}:{body.get('lead_id') or key}"[:255],
                    task_id=uuid.UUID(task_id) if isinstance(task_id, str) else None, input=body,
                    status_code=status, response=response, created_at=timezone.now())
        except IntegrityError:
            # The same key arrived twice at once (an agent killed in flight and its successor):
            # the first one acted; this one is a replay of it.
            known = self._replay(tool, key)
            if known is None:
                raise RuntimeError(f"{tool} {key}: the insert collided, yet no row has the key") from None
            return known
        return Answer(status, response)

    # --- what the agents report ----------------------------------------------------------

    def observe(self, body: dict[str, Any]) -> Answer:
        Observation.objects.create(
            kind=body["kind"], task_id=uuid.UUID(body["task_id"]), agent=str(body.get("agent", ""))[:100],
            zone=body.get("zone"), step=body.get("step"), tool=str(body.get("tool") or "")[:100],
            lease_epoch=body.get("lease_epoch"), at=timezone.now())
        return Answer(201, {"recorded": True})

    # --- compensations (the relay's webhook) ---------------------------------------------

    def compensate(self, message: dict[str, Any]) -> Answer:
        payload = message.get("payload") or {}
        tool, key = payload.get("tool"), payload.get("compensation_key")
        if tool not in COMPENSATIONS or not key:
            return Answer(200, {"ignored": f"not a compensation this service runs: {tool!r}"})
        if not self.owns_compensation(key):
            # Another namespace's task (the subscription sees every compensation topic).
            return Answer(200, {"ignored": "not a compensation of this fleet's tasks"})
        body = {**(payload.get("input") or {}), "task_id": payload.get("task_id"),
                "ref": f"{payload.get('task_id')}:{payload.get('step')}:{tool}"}
        answer = self.call(tool, key, body)
        if answer.status >= 500:
            return Answer(503, {"error": "compensation tool unavailable; deliver again"})
        status = "succeeded" if answer.status < 300 else "failed"
        result = {k: v for k, v in answer.body.items() if k != "replayed"}
        # The outcome goes to the backplane like any agent's; a failure to record it raises, the
        # handler answers 500, and the relay delivers the message again (the ledger answers the
        # repeat).
        self.record_compensation(key, status, result)
        return Answer(200, {"recorded": status})


def make_server(world: ToolWorld, *, webhook_secret_of: Callable[[], str], host: str = "127.0.0.1",
                port: int = 0) -> ThreadingHTTPServer:
    """The HTTP face of ``world``; ``webhook_secret_of`` gives the subscription's current secret."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            close_old_connections()
            try:
                answer = self._route(raw)
            except Exception as exc:  # noqa: BLE001 (a tool service answers 500, it does not die)
                logger.exception("demo tool service: %s failed", self.path)
                answer = Answer(500, {"error": f"{exc.__class__.__name__}: {exc}"})
            finally:
                # One connection per handler thread, and a thread per request: close it now.
                connection.close()
            self._send(answer)

        def _route(self, raw: bytes) -> Answer:
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return Answer(400, {"error": "the body is not JSON"})
            if self.path.startswith("/tools/"):
                key = self.headers.get("Idempotency-Key")
                if not key:
                    return Answer(400, {"error": "Idempotency-Key is required"})
                return world.call(self.path.removeprefix("/tools/").strip("/"), key, body)
            if self.path == "/observations":
                return world.observe(body)
            if self.path == "/compensations":
                try:
                    verify(webhook_secret_of(), self.headers.get(SIGNATURE_HEADER, ""), raw)
                except SignatureError as exc:
                    return Answer(401, {"error": str(exc)})
                return world.compensate(body)
            return Answer(404, {"error": "no such path"})

        def _send(self, answer: Answer) -> None:
            data = json.dumps(answer.body).encode()
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the caller is gone (an agent killed in flight); the ledger has the effect

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("demo tool service: " + format, *args)

    server = _Server((host, port), Handler)
    server.daemon_threads = True
    return server


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # An agent killed with its request in flight leaves a reset connection behind: that is
        # the demo working, not a fault of the service.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        logger.exception("demo tool service: request from %s failed", client_address)
