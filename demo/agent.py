"""A demo agent process: claims tasks of one kind and works them with the SDK, crashing on purpose.

Run by ``manage.py demo`` (demo/fleet.py), one process per agent, restarted when it dies. It
imports only ``backplane_client``, ``httpx`` and the demo's LLM stand-in, like an agent
written by a customer: nothing here touches the database.

Two kinds:

``lead-qualification`` (the orchestrator)
    1. plan (``LLMCalled``, then ``ReasoningStepCompleted``); 2. ``crm-lookup`` through the backplane's gateway;
    3. hand the lead to a ``lead-research`` sub-agent and wait for its score; 4. decide;
    5. ``crm-write`` (qualified leads; compensated by ``crm-revert``); 6. ``email-send``
    (compensated by ``email-recall``); 7. ``payments-charge`` (leads who buy; compensated by
    ``payments-refund``); 8. summary and ``TaskCompleted``. A declined card fails the task for
    good, and the saga undoes steps 6 and 5; a mail relay that never answers fails it
    retryably until its attempts run out, then for good (and the saga undoes step 5). A lead
    without an email address (a poison message) kills the process on every attempt: the stall
    detector dead-letters it once the attempts are spent.
``lead-research`` (the sub-agent)
    1. think; 2. ``web-enrich``; 3. score and ``TaskCompleted``.

Decisions (the plan, the score, the qualification, the summary) are model calls: a prompt
rendered from a template in ``demo.llm``, answered by its stand-in through
``TaskSession.model_call``, so each is recorded (``LLMCalled``) and decided once across attempts,
and a sandbox replay (``backplane_client.replay``) can serve them from the record.

Tool inputs carry nothing of the task's own identity: a fork (docs/replay.md) asks the calls
its source made with the inputs they were made with. The tool service links an effect to the
task whose lead it is (``task_id`` in the body): for a fork, its first source.

Crashes: each attempt at a task is SIGKILLed with probability ``--crash-rate`` at one of the
failure zones its kind passes through (docs/design.md), chosen by a seeded generator:

- zone 1: after the decision, before the tool call is dispatched;
- zone 2: the call is dispatched and the request has left for the tool; no answer is read;
- zone 3: the tool answered; the answer is not recorded yet;
- zone 4 (orchestrator): the sub-agent's result is in this task's log; nothing recorded about it.

``--crash-zone N`` makes every crash strike in zone N (with ``--crash-rate 1``: every attempt).

Before dying, the agent tells the demo's tool service (``POST /observations``), which is how the
crash report knows when and where each crash happened.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from backplane_client import (
    AgentClient,
    ApprovalDenied,
    ApprovalExpired,
    AwaitingApproval,
    BackplaneAPIError,
    LeaseLost,
    RetryPolicy,
    TaskSession,
)
from demo import llm

logger = logging.getLogger("demo.agent")

ORCHESTRATOR = "lead-qualification"
RESEARCHER = "lead-research"
KINDS = (ORCHESTRATOR, RESEARCHER)
ZONES_OF = {ORCHESTRATOR: (1, 2, 3, 4), RESEARCHER: (1, 2, 3)}
# Where zones 1-3 strike: the orchestrator's mail, the researcher's enrichment.
CRASH_STEP = {ORCHESTRATOR: 6, RESEARCHER: 2}
TOOL_ATTEMPTS = 4  # a transient tool failure is retried this often (same key) before giving up
SUBTASK_TIMEOUT = 120.0
# How long an agent holds a task whose tool call waits for people before giving it back.
APPROVAL_PATIENCE = 20.0
# Errors that say "not now": the task goes back uncounted and someone tries again later.
TRANSIENT_CODES = frozenset({"rate_limited", "unavailable", "circuit_open", "tool_unavailable"})


class Stop(BaseException):
    """SIGTERM: finish nothing more; the task in hand is released, uncounted."""


class Agent:
    def __init__(self, *, bp: AgentClient, name: str, kind: str, tools_url: str, seed: int, crash_rate: float,
                 lease_seconds: int, crash_zone: int | None = None) -> None:
        if crash_zone is not None and crash_zone not in ZONES_OF[kind]:
            raise ValueError(f"a {kind} agent passes through zones {ZONES_OF[kind]}, not {crash_zone}")
        self.bp = bp
        self.name = name
        self.kind = kind
        self.tools_url = tools_url.rstrip("/")
        self.seed = seed
        self.crash_rate = crash_rate
        self.lease_seconds = lease_seconds
        self.http = httpx.Client(timeout=10)
        self.forced_zone = crash_zone
        self.crash_zone: int | None = None
        self._origins: dict[str, str] = {}

    # --- the loop ----------------------------------------------------------------------------

    def run_forever(self, *, idle: float = 0.1, max_idle: float = 1.0) -> None:
        # Nothing to claim: ask again after a wait that doubles up to ``max_idle``, so an idle
        # fleet costs the backplane a few claims a second, and a busy one finds work at once.
        wait = idle
        while True:
            try:
                session = self.bp.claim_session(kinds=[self.kind], lease_seconds=self.lease_seconds)
            except BackplaneAPIError as exc:
                # The agent's circuit is open (three failures in a row): wait as told.
                refused_for = min(exc.retry_after or 5.0, 30.0)
                logger.warning("%s: claim refused (%s); waiting %.0f s", self.name, exc.code, refused_for)
                time.sleep(refused_for)
                continue
            except httpx.TransportError as exc:
                logger.warning("%s: backplane unreachable (%s); retrying", self.name, exc)
                time.sleep(1.0)
                continue
            if session is None:
                time.sleep(wait)
                wait = min(max_idle, wait * 2)
                continue
            wait = idle
            with session:
                try:
                    self.work(session)
                except Stop:
                    # make run is stopping: hand the task back uncounted instead of letting the
                    # lease lapse (which would count an attempt against it).
                    self._give_back(session)
                    return

    def work(self, session: TaskSession) -> None:
        self.crash_zone = self._roll_crash(session)
        try:
            if self.kind == ORCHESTRATOR:
                self.qualify(session)
            else:
                self.research(session)
        except LeaseLost:
            logger.info("%s: lost the lease of %s; another agent has it", self.name, session.task_id)
        except BackplaneAPIError as exc:
            if exc.code == "task_closed":
                return
            logger.warning("%s: %s on task %s: %s", self.name, exc.code, session.task_id, exc.message)
            if exc.code in TRANSIENT_CODES:
                self._give_back(session)
            else:
                # A refusal that will not change (a 400, a 422): giving the task back uncounted
                # would loop for ever; a counted failure ends in a dead letter for a person.
                self._fail_quietly(session, f"{exc.code}: {exc.message}")
        except httpx.TransportError as exc:
            logger.warning("%s: transport error on task %s: %s", self.name, session.task_id, exc)
            self._give_back(session)
        except TimeoutError as exc:
            # The sub-agent is taking long (its own crashes, an open breaker): try again later.
            logger.warning("%s: %s on task %s", self.name, exc, session.task_id)
            self._give_back(session)

    def _fail_quietly(self, session: TaskSession, error: str) -> None:
        try:
            session.fail(error[:500], retryable=True)
        except (BackplaneAPIError, httpx.TransportError):
            pass  # the lease lapses and the stall detector counts the attempt instead

    def _give_back(self, session: TaskSession) -> None:
        """Release the task for another try later (no attempt counted); if even that fails, the
        lease lapses and the stall detector takes it back."""
        try:
            session.release()
        except (BackplaneAPIError, httpx.TransportError):
            pass

    def _roll_crash(self, session: TaskSession) -> int | None:
        r = llm.rng(self.seed, session.task_id, session.lease_epoch, "crash")
        if r.random() >= self.crash_rate:
            return None
        zone = r.choice(ZONES_OF[self.kind])
        return self.forced_zone or zone

    def crash_here(self, session: TaskSession, zone: int, *, step: int, tool: str = "") -> None:
        if self.crash_zone != zone:
            return
        self.observe("crash", session, zone=zone, step=step, tool=tool)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def observe(self, kind: str, session: TaskSession, **fields: Any) -> None:
        body = {"kind": kind, "task_id": session.task_id, "agent": self.name,
                "lease_epoch": session.lease_epoch, **fields}
        try:
            self.http.post(f"{self.tools_url}/observations", json=body, timeout=5)
        except httpx.HTTPError as exc:
            logger.warning("%s: could not report %s: %s", self.name, kind, exc)

    # --- the orchestrator --------------------------------------------------------------------

    def origin_task_id(self, s: TaskSession) -> str:
        """The task whose lead this is: the task itself, or for a fork its first source (read once).

        The tool service files effects under it; a fork must ask its source's calls with their
        recorded inputs, so an input never names the fork itself."""
        if s.task_id not in self._origins:
            task = s.task
            while task.get("forked_from"):
                task = self.bp.get_task(task["forked_from"]["task_id"])
            self._origins[s.task_id] = str(task["task_id"])
        return self._origins[s.task_id]

    def think(self, s: TaskSession, step: int, prompt: llm.Prompt, call: llm.ModelFunction, *,
              model: str = llm.MODEL) -> dict[str, Any]:
        """A decision of the model, recorded (``LLMCalled``, with its usage) and made once across attempts."""
        output: dict[str, Any] = s.model_call(step, model, prompt, call, provider=llm.PROVIDER)
        return output

    def qualify(self, s: TaskSession) -> None:
        lead = s.input["lead"]
        plan = self.think(s, 1, llm.plan_prompt(lead), llm.plan(self.seed, lead))
        s.reason(1, {**plan, "model": llm.MODEL})

        # 2. The CRM through the backplane's gateway: it calls the tool with the key, records
        #    both events and keeps the answer; its circuit breaker protects the CRM.
        crm = self.invoke_with_patience(s, 2, "crm-lookup", {"lead_id": lead["id"],
                                                             "task_id": self.origin_task_id(s)})
        if crm is None:
            return

        # 3. Research by a sub-agent: dispatch (idempotent per step and kind), then wait for its
        #    result to be in this task's log (written in the child's completing transaction).
        child = s.subtask(3, RESEARCHER, {"lead": lead, "crm": crm})
        sub = s.wait_for_subtask(child["task_id"], timeout=SUBTASK_TIMEOUT, poll=0.5)
        self.crash_here(s, 4, step=3)
        if sub["status"] != "completed":
            s.fail(f"research sub-agent ended {sub['status']}", retryable=False)
            return
        score = int((sub.get("output") or {}).get("score", 0))

        # 4. Decide.
        # Decided once: a later attempt goes on with the recorded answer, whatever a model
        # (a real one is not deterministic) would say now.
        decision = self.think(s, 4, llm.qualify_prompt(lead, score), llm.qualify(self.seed, lead, score))
        s.reason(4, {**decision, "model": llm.MODEL})
        qualified, buys = decision["decision"]["qualified"], decision["decision"]["buys"]
        outcome: dict[str, Any] = {"score": score, "qualified": qualified}

        if qualified:
            crm_write = self.tool(s, 5, "crm-write", {"lead_id": lead["id"], "stage": "qualified"},
                                  compensation={"tool": "crm-revert", "input": {"lead_id": lead["id"]}})
            if crm_write is None:
                return
            outcome["crm_record"] = crm_write.get("record")
        template = "welcome" if qualified else "nurture"
        # A lead without an email address raises here and kills the process, on every attempt:
        # the poison message the stall detector dead-letters once the attempts are spent.
        mail = self.tool(s, 6, "email-send", {"to": lead["email"], "template": template, "lead_id": lead["id"]},
                         compensation={"tool": "email-recall", "input": {"to": lead["email"], "lead_id": lead["id"]}})
        if mail is None:
            return
        outcome["email"] = mail.get("message_id")
        if buys:
            # Under make run, a charge over the demo's threshold waits for a person first
            # (demo/fleet.py's PAYMENT_POLICY): ``reason`` is what the Approvals page shows them.
            charge = self.tool(s, 7, "payments-charge", {"lead_id": lead["id"], "amount_cents": lead["amount_cents"]},
                               compensation={"tool": "payments-refund", "input": {"lead_id": lead["id"]}},
                               failed_is_final=True,
                               reason=f"{lead['company']} chose the {lead.get('plan', 'starter')} plan (fit score "
                                      f"{score}): charge {lead['amount_cents'] / 100:,.2f} to close lead {lead['id']}.")
            if charge is None:
                return
            outcome["charge"] = charge.get("charge")
        summary = self.think(s, 8, llm.summary_prompt(lead, outcome), llm.summary(lead, outcome), model=llm.SMALL_MODEL)
        s.complete(outcome, reasoning={"step": 8, **summary, "model": llm.SMALL_MODEL})

    def invoke_with_patience(self, s: TaskSession, step: int, tool: str,
                             input: dict[str, Any]) -> dict[str, Any] | None:
        """A gateway call; a tool that stays down, or whose breaker stays open, gives the task back."""
        for attempt in range(TOOL_ATTEMPTS):
            try:
                answer = s.invoke(step, tool, input)
            except BackplaneAPIError as exc:
                if exc.code not in ("tool_unavailable", "circuit_open"):
                    raise
                self.observe("breaker_wait" if exc.code == "circuit_open" else "tool_retry", s, step=step, tool=tool)
                time.sleep(min(exc.retry_after or 0.3 * 2 ** attempt, 5.0))
                continue
            if answer.get("replayed"):
                self.observe("proxy_replay", s, step=step, tool=tool)
            return dict(answer.get("result") or {})
        self._give_back(s)
        return None

    # --- the researcher ----------------------------------------------------------------------

    def research(self, s: TaskSession) -> None:
        lead = s.input["lead"]
        s.reason(1, {"thought": f"Enrich {lead['company']} before scoring.", "model": llm.MODEL})
        enrichment = self.tool(s, 2, "web-enrich", {"company": lead["company"], "lead_id": lead["id"]})
        if enrichment is None:
            return
        judgement = self.think(s, 3, llm.research_prompt(lead, enrichment), llm.research(self.seed, lead, enrichment))
        s.complete({"score": judgement["decision"]["score"], "signals": judgement["decision"]["signals"]},
                   reasoning={"step": 3, **judgement, "model": llm.MODEL})

    # --- one direct tool call, through the idempotency proxy --------------------------------

    def tool(self, s: TaskSession, step: int, tool: str, input: dict[str, Any], *,
             compensation: dict[str, Any] | None = None, failed_is_final: bool = False,
             reason: str | None = None) -> dict[str, Any] | None:
        """Write before you act, act only when the backplane says so, acknowledge before you advance.

        Returns the result, or None when the task was failed (a permanent failure, a tool that
        stayed unavailable, a call people denied) or given back to wait for people, and the
        caller must stop.
        """
        body = {**input, "task_id": self.origin_task_id(s)}
        if step == CRASH_STEP[self.kind] and not any(c["step"] == step and c["tool"] == tool
                                                     for c in s.context()["tool_calls"]):
            # Zone 1 is "decided, not yet dispatched": not true once an earlier attempt dispatched.
            self.crash_here(s, 1, step=step, tool=tool)
        try:
            with s.tool_call(step, tool, body, compensation=compensation, reason=reason,
                             approval_timeout=APPROVAL_PATIENCE) as call:
                if not call.needed:
                    self.observe("proxy_replay", s, step=step, tool=tool)
                else:
                    # The effect's key: in a fork, a call its source left in flight is asked
                    # again under the source's key, so the tool acts once across both.
                    if step == CRASH_STEP[self.kind] and self.crash_zone == 2:
                        self._send_without_reading(tool, call.effect_key, body)
                        self.crash_here(s, 2, step=step, tool=tool)
                    status, answer = self._call(s, step, tool, call.effect_key, body)
                    if status is None:
                        raise _Unavailable(answer)
                    if step == CRASH_STEP[self.kind]:
                        self.crash_here(s, 3, step=step, tool=tool)
                    # The tool's own "replayed" marker is about this request, not the answer.
                    answer = {k: v for k, v in answer.items() if k != "replayed"}
                    if status < 300:
                        call.succeeded(answer)
                    else:
                        call.failed({"status_code": status, **answer})
        except AwaitingApproval:
            # Nobody decided within our patience: give the task back. It waits durably, handed
            # to no agent until the decision (or the request's expiry), and the claim after that
            # finds the same request with the same key.
            logger.info("%s: %s step %d waits for people's approval; giving the task back", self.name, tool, step)
            self._give_back(s)
            return None
        except (ApprovalDenied, ApprovalExpired) as exc:
            # People said no (or nobody answered in time): the call is not made, and failing the
            # task for good has the saga undo the steps before it.
            s.fail(f"{tool} not approved: {exc.message}", retryable=False)
            return None
        except _Unavailable as exc:
            # Still unavailable after the retries: nothing is recorded, so the call stays in
            # flight (the next attempt repeats it with the same key) and the task fails retryably.
            s.fail(f"{tool} unavailable: {exc}", retryable=True)
            return None
        if call.status == "failed":
            if failed_is_final:
                s.fail(f"{tool} failed: {(call.result or {}).get('error', 'error')}", retryable=False)
            else:
                s.fail(f"{tool} failed", retryable=True)
            return None
        return dict(call.result or {})

    def _call(self, s: TaskSession, step: int, tool: str, key: str,
              body: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
        answer: dict[str, Any] = {}
        for attempt in range(TOOL_ATTEMPTS):
            try:
                response = self.http.post(f"{self.tools_url}/tools/{tool}", json=body,
                                          headers={"Idempotency-Key": key})
            except httpx.TransportError as exc:
                answer = {"error": str(exc)}
            else:
                answer = response.json()
                if response.status_code < 500:
                    return response.status_code, answer
            self.observe("tool_retry", s, step=step, tool=tool)
            time.sleep(0.2 * 2 ** attempt)
        return None, answer

    def _send_without_reading(self, tool: str, key: str, body: dict[str, Any]) -> None:
        """Put the whole request on the wire and return without reading a byte of the answer."""
        parts = urlsplit(f"{self.tools_url}/tools/{tool}")
        connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
        connection.request("POST", parts.path, body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json", "Idempotency-Key": key})
        time.sleep(0.05)  # let it arrive before the process dies with the socket


class _Unavailable(Exception):
    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer.get("error", "unavailable"))
        self.answer = answer


def _stop(signum: int, frame: object) -> None:
    raise Stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A demo agent process (started by manage.py demo).")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--tools-url", required=True)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--crash-rate", type=float, default=0.1)
    parser.add_argument("--lease-seconds", type=int, default=5)
    parser.add_argument("--crash-zone", type=int, choices=(1, 2, 3, 4),
                        help="every crash strikes in this zone (default: one of the kind's, at random)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s demo agent {args.name}: %(message)s")
    signal.signal(signal.SIGTERM, _stop)
    token = os.environ["BACKPLANE_TOKEN"]
    with AgentClient(args.base_url, token, retry=RetryPolicy(attempts=8, max_delay=5.0)) as bp:
        try:
            Agent(bp=bp, name=args.name, kind=args.kind, tools_url=args.tools_url, seed=args.seed,
                  crash_rate=args.crash_rate, lease_seconds=args.lease_seconds,
                  crash_zone=args.crash_zone).run_forever()
        except Stop:
            pass  # stopped between tasks
    return 0


if __name__ == "__main__":
    sys.exit(main())
