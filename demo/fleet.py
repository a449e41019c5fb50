"""The demo fleet: set up its agents and tools, run agent processes, feed them leads.

``manage.py demo`` (demo/management/commands/demo.py) drives it:

- :func:`fleet_prepare` registers, idempotently, the demo namespace's agents (fresh tokens each
  start), the gateway tool ``crm-lookup``, the webhook subscription the relay uses to ask the
  demo to run compensations, the retention rule that prunes finished demo tasks, and (running
  until stopped) the tool policy that makes an enterprise charge wait for a reviewer;
- :class:`Fleet` runs the tool service (demo/toolservice.py) in threads and the agents as
  separate processes (demo/agent.py), each restarted when it dies — which they do on purpose;
- :func:`lead` makes the feeder's leads: deterministic from the seed and a counter.

Everything the agents do goes through the REST API with the SDK. The fleet itself works on the
database directly only to set up (above), to count open tasks (backpressure), to decide its own
dead letters nobody decided (``demo_dead_letters_decide``) and to forget the ledger rows of pruned
tasks; the report reads it to check the outcome.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from backplane.delivery.models import DeadLetter, DeadLetterSource, DeadLetterStatus, Ordering, WebhookSubscription
from backplane.eventlog import services as eventlog_services
from backplane.eventlog.errors import BackplaneError
from backplane.eventlog.models import Agent, Task, TaskStatus
from backplane.runtime.supervisor import die_with_parent
from backplane_client import AgentClient, BackplaneAPIError, RetryPolicy
from demo import llm
from demo.agent import KINDS, ORCHESTRATOR, RESEARCHER
from demo.models import LedgerEntry, Observation
from demo.toolservice import BOUNCING_DOMAIN, Faults, ToolWorld, make_server
from recovery.approvals import tool_policy_set
from recovery.dead_letters import dead_letter_discard
from recovery.models import Tool, ToolPolicy
from recovery.retention import retention_rule_ensure

logger = logging.getLogger(__name__)

BASE_DIR = Path(__file__).resolve().parent.parent
# Decided by the demo itself after this long, so its tasks can finish and be pruned (below).
DEAD_LETTER_PATIENCE = timedelta(minutes=10)
FEEDER, COMPENSATOR = "demo-feeder", "demo-compensator"
OPEN_STATUSES = (TaskStatus.PENDING, TaskStatus.RUNNING)
_COMPANIES = ("Acme Robotics", "Globex", "Initech", "Umbrella Health", "Stark Logistics", "Wayne Fintech",
              "Hooli", "Vandelay Imports", "Soylent Foods", "Tyrell Systems", "Cyberdyne", "Wonka Retail")


@dataclass(frozen=True)
class FleetConfig:
    base_url: str
    namespace: str = "demo-fleet"
    seed: int = 7
    crash_rate: float = 0.2
    orchestrators: int = 3
    researchers: int = 2
    lease_seconds: int = 5
    max_attempts: int = 3
    keep_seconds: int = 900
    # Running until stopped, the fleet prunes (a retention rule) and decides its own old dead
    # letters; a batch keeps everything for its report.
    tidy: bool = True
    # Running until stopped, an enterprise charge waits for a person (PAYMENT_POLICY), and this
    # login may decide it; a batch has nobody to ask, so no policy gates its calls.
    approver: str | None = None
    faults: Faults = field(default_factory=Faults)


@dataclass(frozen=True)
class Prepared:
    tokens: Mapping[str, str]  # agent name -> token (fresh)
    webhook_secret: str


def agent_names(config: FleetConfig) -> dict[str, list[str]]:
    return {
        ORCHESTRATOR: [f"demo-orchestrator-{i + 1}" for i in range(config.orchestrators)],
        RESEARCHER: [f"demo-researcher-{i + 1}" for i in range(config.researchers)],
        "": [FEEDER, COMPENSATOR],
    }


def fleet_prepare(config: FleetConfig, *, tools_url: str) -> Prepared:
    """Agents with fresh tokens, the gateway tool, the compensation webhook, the retention rule."""
    tokens: dict[str, str] = {}
    for kind, names in agent_names(config).items():
        for name in names:
            existing = Agent.objects.filter(namespace=config.namespace, name=name).first()
            if existing is None:
                created = eventlog_services.agent_create(name=name, namespace=config.namespace,
                                                         kinds=[kind] if kind else [])
            else:
                created = eventlog_services.agent_rotate_token(agent_id=existing.pk)
            tokens[name] = created.token
    secret = secrets.token_urlsafe(24)
    with transaction.atomic(durable=True):
        Tool.objects.update_or_create(
            namespace=config.namespace, name="crm-lookup",
            defaults={"url": f"{tools_url}/tools/crm-lookup", "timeout_seconds": 5, "is_active": True})
        # One subscription per fleet (namespace): two fleets beside each other each run their own.
        WebhookSubscription.objects.update_or_create(
            name=f"{config.namespace}-compensations",
            defaults={"topic_pattern": "backplane.compensations.*", "url": f"{tools_url}/compensations",
                      "secret": secret, "is_active": True, "timeout_seconds": 10,
                      "ordering": Ordering.BEST_EFFORT, "retry_base_seconds": 1, "retry_max_delay_seconds": 30})
    # The demo never grows the database without bound: the product's retention prunes its
    # finished tasks once they are old enough, sealed and exported (docs/operations.md, "Retention").
    if config.tidy:
        retention_rule_ensure(namespace=config.namespace, keep_seconds=config.keep_seconds)
    if config.approver is not None:
        payment_policy_ensure(namespace=config.namespace, approver=config.approver)
    return Prepared(tokens=tokens, webhook_secret=secret)


# The demo's gated call (docs/approvals.md): a charge over 1,000.00 waits for a member of the
# Approvers group; undecided for 15 minutes, it is denied and the saga undoes the lead's steps.
PAYMENT_POLICY: dict[str, Any] = {
    "tool": "payments-charge", "condition": "amount_cents > 100000", "field_types": {"amount_cents": "number"},
    "approver_group": "Approvers", "open_seconds": 900, "on_expiry": "deny",
    "reason": "demo: a charge over 1,000.00 waits for a reviewer",
}


def payment_policy_ensure(*, namespace: str, approver: str) -> None:
    """Gate the namespace's charges over 1,000.00, unless a policy for them exists already (a
    person's change to it stands), and let the login ``approver`` (``make run``'s, when there is
    one) decide them as a member of the Approvers group."""
    if not ToolPolicy.objects.filter(namespace=namespace, tool=PAYMENT_POLICY["tool"]).exists():
        tool_policy_set(namespace=namespace, set_by="demo-fleet", **PAYMENT_POLICY)
    user = get_user_model().objects.filter(username=approver).first()
    if user is not None:
        user.groups.add(Group.objects.get(name=PAYMENT_POLICY["approver_group"]))


def demo_prune_own_records(*, older_than: timedelta) -> int:
    """The demo's ledger rows and observations whose task the retention has pruned, once they
    are older than ``older_than``: the outside world forgets too, so nothing grows for ever."""
    cutoff = timezone.now() - older_than
    task_exists = Exists(Task.objects.filter(pk=OuterRef("task_id")))
    ledger, _ = LedgerEntry.objects.filter(created_at__lt=cutoff).exclude(task_exists).delete()
    observed, _ = Observation.objects.filter(at__lt=cutoff).exclude(task_exists).delete()
    return ledger + observed


def demo_dead_letters_decide(*, namespace: str, older_than: timedelta = DEAD_LETTER_PATIENCE,
                             limit: int = 100) -> int:
    """Discard the fleet's dead letters nobody decided within ``older_than`` (a task's with its
    compensations run). Under make run nobody may be watching, and a task with a pending dead
    letter is never pruned: without this, every poison lead would stay for ever. Returns how
    many were decided."""
    cutoff = timezone.now() - older_than
    waiting = list(DeadLetter.objects.filter(status=DeadLetterStatus.PENDING, task__namespace=namespace,
                                             created_at__lt=cutoff).values_list("pk", "source")[:limit])
    decided = 0
    for pk, source in waiting:
        try:
            dead_letter_discard(dead_letter_id=pk, decided_by="demo-fleet", compensate=source == DeadLetterSource.TASK,
                                reason=f"demo fleet: nobody decided within {older_than}, so it gives up itself")
        except BackplaneError as exc:  # decided meanwhile by a person, say
            logger.info("demo: dead letter %s left alone: %s", pk, exc)
            continue
        decided += 1
    return decided


def open_root_tasks(namespace: str) -> int:
    return Task.objects.filter(namespace=namespace, kind=ORCHESTRATOR, status__in=OPEN_STATUSES).count()


def lead(seed: int, run: str, n: int) -> dict[str, Any]:
    """The n-th lead of a run.

    Every 20th, from the 7th, wants the annual enterprise plan: its charge is over the threshold of
    the demo's payment policy, so under ``make run`` it waits on the Approvals page. Every 25th,
    from the 3rd, is a poison message: imported without an email address, it makes the
    orchestrator's code raise and its process die on every attempt, so the stall detector
    dead-letters it after the last one — a dead letter to review within the first minute. Every
    25th from the 10th writes from a domain whose mail never goes through: the task fails
    retryably until its attempts run out, then for good, and the saga undoes what it did.
    """
    r = llm.rng(seed, run, n, "lead")
    company = r.choice(_COMPANIES)
    domain = BOUNCING_DOMAIN if n % 25 == 10 else company.lower().replace(" ", "-") + ".example"
    found: dict[str, Any] = {"id": f"L-{run}-{n:05d}", "company": company, "email": f"buyer{n}@{domain}",
                             "amount_cents": r.choice([4900, 9900, 19900])}
    if n % 20 == 7:
        found.update(amount_cents=480000, plan="enterprise")
    if n % 25 == 3:
        del found["email"]
        found["notes"] = "imported from a legacy CSV without a contact column"
    return found


class Fleet:
    """The tool service and the agent processes of one ``manage.py demo``."""

    def __init__(self, config: FleetConfig, *, log_dir: Path | None = None) -> None:
        self.config = config
        self.log_dir = log_dir
        self.run = uuid.uuid4().hex[:6]
        self.world: ToolWorld | None = None
        self.server: Any = None
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.kinds: dict[str, str] = {}
        self.started_at: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.delays: dict[str, float] = {}
        self.stopped = False
        self.restarts = 0
        self.prepared: Prepared | None = None
        self.compensator: AgentClient | None = None
        self.feeder: AgentClient | None = None
        self.created = 0

    @property
    def tools_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.world = ToolWorld(self.config.faults, record_compensation=self._record_compensation,
                               owns_compensation=self._owns_compensation)
        # The secret is set by fleet_prepare; the handler reads it through this holder.
        self.server = make_server(self.world, webhook_secret_of=lambda: self.prepared.webhook_secret
                                  if self.prepared else "")
        threading.Thread(target=self.server.serve_forever, name="demo-tools", daemon=True).start()
        self.prepared = fleet_prepare(self.config, tools_url=self.tools_url)
        retry = RetryPolicy(attempts=10, max_delay=5.0)
        self.compensator = AgentClient(self.config.base_url, self.prepared.tokens[COMPENSATOR], retry=retry)
        self.feeder = AgentClient(self.config.base_url, self.prepared.tokens[FEEDER], retry=retry)
        for kind in KINDS:
            for name in agent_names(self.config)[kind]:
                self._spawn(name, kind)
        logger.info("demo fleet up: %d agent processes, tools at %s", len(self.processes), self.tools_url)

    def _record_compensation(self, key: str, status: str, result: dict[str, Any]) -> None:
        assert self.compensator is not None
        self.compensator.record_tool_result(key, status, result)

    def _owns_compensation(self, key: str) -> bool:
        """Whether the compensation is one of this fleet's tasks' (another namespace's is a 404)."""
        assert self.compensator is not None
        try:
            self.compensator.get_tool_call(key)
        except BackplaneAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _spawn(self, name: str, kind: str) -> None:
        assert self.prepared is not None
        c = self.config
        argv = [sys.executable, "-m", "demo.agent", "--base-url", c.base_url, "--tools-url", self.tools_url,
                "--kind", kind, "--name", name, "--seed", str(c.seed), "--crash-rate", str(c.crash_rate),
                "--lease-seconds", str(c.lease_seconds)]
        env = {**os.environ, "BACKPLANE_TOKEN": self.prepared.tokens[name]}
        log = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / f"{name}.log"
            # Poison leads leave a traceback each: start the file again past 5 MB.
            mode = "wb" if path.exists() and path.stat().st_size > 5_000_000 else "ab"
            log = open(path, mode)  # noqa: SIM115 (the child keeps it)
        self.kinds[name] = kind
        self.started_at[name] = time.monotonic()
        self.processes[name] = subprocess.Popen(
            argv, cwd=BASE_DIR, env=env, stdout=log or subprocess.DEVNULL, stderr=log or None,
            preexec_fn=die_with_parent(signal.SIGKILL))
        if log is not None:
            log.close()

    def tend(self) -> int:
        """Restart every agent process that died (crashed on purpose, mostly); how many."""
        restarted = 0
        now = time.monotonic()
        for name, process in list(self.processes.items()):
            if process.poll() is None:
                continue
            due = self.restart_at.get(name)
            if due is None:
                # A process that dies within a second of starting is not crashing on purpose (a
                # broken environment, say): back off, doubling up to 30 s, and say so.
                quick = now - self.started_at[name] < 1.0
                self.delays[name] = min(30.0, max(0.5, 2 * self.delays.get(name, 0.0))) if quick else 0.0
                if quick:
                    logger.warning("demo: agent %s exited %s right after starting; next start in %.1f s",
                                   name, process.returncode, self.delays[name])
                due = self.restart_at[name] = now + self.delays[name]
            if now < due:
                continue
            del self.restart_at[name]
            self._spawn(name, self.kinds[name])
            restarted += 1
        self.restarts += restarted
        return restarted

    def create_leads(self, count: int) -> list[str]:
        """Create ``count`` lead-qualification tasks through the API; their ids."""
        assert self.feeder is not None
        ids = []
        for _ in range(count):
            self.created += 1
            task = self.feeder.create_task(ORCHESTRATOR, {"lead": lead(self.config.seed, self.run, self.created)},
                                           max_attempts=self.config.max_attempts,
                                           metadata={"demo_run": self.run})
            ids.append(task["task_id"])
        return ids

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for client in (self.compensator, self.feeder):
            if client is not None:
                client.close()


def default_base_url() -> str:
    host = os.environ.get("BACKPLANE_HOST", "127.0.0.1")
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, host)
    return f"http://{host}:{os.environ.get('BACKPLANE_PORT', '8000')}"

