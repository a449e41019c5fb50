"""A real agent process for the failure-zone tests, written only against ``backplane_client.agent``.

It claims one task of ``--kind``, reads the recovery context and works through the task's plan
(the task input), skipping whatever the context says is already done:

1. ``ReasoningStepCompleted`` step 1 (the decision to call the tool);
2. the tool call, step 2: recorded through the proxy (``POST /tasks/{id}/tool-calls/``) before it
   is made, then made by this process against the tool's URL with ``Idempotency-Key:
   <effect_key>`` (the call's key, or in a fork its source's), then its answer recorded;
3. optionally a sub-agent, step 3: dispatched, then awaited until its result is in this task's log;
4. ``ReasoningStepCompleted`` (the final step, recording what was learnt) and ``TaskCompleted``,
   in one batch.

``--crash-at zoneN`` SIGKILLs the process at the exact point of failure zone N (docs/design.md):

- ``zone1``: after the decision (step 1 appended), before the dispatch;
- ``zone2``: after the dispatch and after the request left for the tool, before any answer is read;
- ``zone3``: after the tool's answer arrived, before it is recorded;
- ``zone4``: after the sub-agent's result is in this task's log, before anything is recorded about it.

Every decision is printed to stdout as one JSON line (flushed, so it survives the SIGKILL),
for the test to check what the process did. The token comes from ``BACKPLANE_TOKEN``.

Task input::

    {"tool": "send-email", "tool_url": "http://127.0.0.1:PORT/send-email", "tool_input": {...},
     "subagent": {"kind": "research", "input": {...}}}          # "subagent" optional
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from backplane_client.agent import AgentClient, Lease, event_draft

ZONES = ("zone1", "zone2", "zone3", "zone4")
TOOL_STEP = 2
SUBAGENT_STEP = 3
TERMINAL_CHILD = {"completed", "failed", "dead_lettered"}
LEASE_SECONDS = 30
HEARTBEAT_SECONDS = 1.0  # while waiting for a sub-agent; far below the lease, so it is exercised


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def crash_here(zone: str, crash_at: str | None, **fields: Any) -> None:
    if crash_at == zone:
        report("crash", zone=zone, **fields)
        os.kill(os.getpid(), signal.SIGKILL)


def claim(bp: AgentClient, kind: str, timeout: float) -> Lease | None:
    deadline = time.monotonic() + timeout
    while True:
        lease = bp.claim(kinds=[kind], lease_seconds=LEASE_SECONDS)
        if lease is not None or time.monotonic() > deadline:
            return lease
        time.sleep(0.05)


def call_tool(url: str, key: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url, json=body, headers={"Idempotency-Key": key}, timeout=10)
    response.raise_for_status()
    return response.json()


def send_tool_request_without_reading(url: str, key: str, body: dict[str, Any]) -> None:
    """Put the whole request on the wire and return without reading a byte of the answer."""
    parts = urlsplit(url)
    assert parts.hostname, f"no host in {url}"
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    payload = json.dumps(body).encode()
    connection.request(
        "POST",
        parts.path or "/",
        body=payload,
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )


def run(bp: AgentClient, *, kind: str, crash_at: str | None, claim_timeout: float) -> int:
    lease = claim(bp, kind, claim_timeout)
    if lease is None:
        report("nothing-to-claim", kind=kind)
        return 2
    task_id, epoch = lease.task_id, lease.lease_epoch
    plan = lease.task["input"]
    report("claimed", task_id=task_id, lease_epoch=epoch, recovered=lease.recovered)

    context = bp.recovery_context(task_id)
    report(
        "context",
        attempt=context["attempt"],
        recovery_point_seq=context["recovery_point_seq"],
        completed_steps=[s["step"] for s in context["completed_steps"]],
        tool_calls={c["idempotency_key"]: c["status"] for c in context["tool_calls"]},
        in_flight=[c["idempotency_key"] for c in context["in_flight_tool_calls"]],
        subtasks={s["child_task_id"]: s["status"] for s in context["subtasks"]},
    )
    done_steps = {s["step"] for s in context["completed_steps"]}

    # Step 1: decide. Keyed, so even a blind repeat would be answered from the log.
    if 1 in done_steps:
        report("skip-step", step=1)
    else:
        bp.append(
            task_id,
            "ReasoningStepCompleted",
            {"step": 1, "decision": f"call {plan['tool']}"},
            idempotency_key=f"{task_id}:reasoning:1",
            lease_epoch=epoch,
        )
        report("step-done", step=1)
    crash_here("zone1", crash_at)

    # Step 2: the tool call, through the idempotency proxy.
    tool, tool_url, tool_input = plan["tool"], plan["tool_url"], plan["tool_input"]
    answered = [c for c in context["tool_calls"] if c["status"] in ("succeeded", "failed")]
    recorded = next((c for c in answered if c["step"] == TOOL_STEP and c["tool"] == tool), None)
    if recorded is not None:
        tool_result = recorded["result"]
        report("tool-result-from-context", key=recorded["idempotency_key"])
    else:
        dispatch = bp.dispatch_tool_call(task_id, TOOL_STEP, tool, tool_input, lease_epoch=epoch)
        key = dispatch["idempotency_key"]
        if dispatch["status"] in ("succeeded", "failed"):
            tool_result = dispatch["result"]
            report("tool-result-from-proxy", key=key)
        else:
            # The key the tool must see: the effect's (in a fork, a step its source left in flight
            # is asked again under the source's key, so the tool acts once across both).
            effect_key = dispatch.get("effect_key") or key
            report("tool-dispatch", key=key, effect_key=effect_key, status=dispatch["status"],
                   replayed=dispatch["replayed"])
            if crash_at == "zone2":
                send_tool_request_without_reading(tool_url, effect_key, tool_input)
                crash_here("zone2", crash_at, key=key)
            tool_result = call_tool(tool_url, effect_key, tool_input)
            report("tool-answered", key=key, result=tool_result)
            crash_here("zone3", crash_at, key=key)
            bp.record_tool_result(key, "succeeded", tool_result, lease_epoch=epoch)
            report("tool-result-recorded", key=key, replayed=bp.last_replayed)

    # Step 3 (optional): hand work to a sub-agent and wait for its result in this task's log.
    subagent_output: dict[str, Any] | None = None
    final_step = SUBAGENT_STEP
    sub_plan = plan.get("subagent")
    if sub_plan is not None:
        final_step = SUBAGENT_STEP + 1
        known = next(
            (s for s in context["subtasks"] if s.get("kind") == sub_plan["kind"] and s["status"] in TERMINAL_CHILD),
            None,
        )
        if known is not None:
            report("subagent-result-from-context", child_task_id=known["child_task_id"], status=known["status"])
            subagent_output = known["output"]
        else:
            handed = bp.dispatch_subtask(task_id, SUBAGENT_STEP, sub_plan["kind"], sub_plan["input"], lease_epoch=epoch)
            child_id = handed["task"]["task_id"]
            report("subagent-dispatched", child_task_id=child_id, replayed=bp.last_replayed)
            result = wait_for_child(bp, task_id, child_id, epoch)
            report("subagent-result-in-log", child_task_id=child_id, status=result["status"])
            subagent_output = result["output"]
        crash_here("zone4", crash_at)

    # Final: record what was learnt and complete, all or nothing.
    output = {"tool_result": tool_result, "subagent_output": subagent_output}
    bp.append_batch(
        task_id,
        [
            event_draft(
                "ReasoningStepCompleted",
                {"step": final_step, "summary": output},
                idempotency_key=f"{task_id}:reasoning:{final_step}",
            ),
            event_draft("TaskCompleted", {"output": output}, idempotency_key=f"{task_id}:completed"),
        ],
        lease_epoch=epoch,
    )
    report("completed", task_id=task_id, output=output)
    return 0


def wait_for_child(bp: AgentClient, task_id: str, child_id: str, epoch: int, timeout: float = 30) -> dict[str, Any]:
    """Poll this task's recovery context until the child's result is in the log; keep the lease alive."""
    deadline = time.monotonic() + timeout
    next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
    while time.monotonic() < deadline:
        for sub in bp.recovery_context(task_id)["subtasks"]:
            if sub["child_task_id"] == child_id and sub["status"] in TERMINAL_CHILD:
                return sub
        if time.monotonic() > next_heartbeat:
            bp.heartbeat(task_id, epoch)
            next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        time.sleep(0.05)
    raise TimeoutError(f"sub-agent task {child_id} gave no result within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--crash-at", choices=ZONES)
    parser.add_argument("--claim-timeout", type=float, default=0.0, help="keep trying to claim for this long")
    args = parser.parse_args()
    with AgentClient(args.base_url, os.environ["BACKPLANE_TOKEN"]) as bp:
        code = run(bp, kind=args.kind, crash_at=args.crash_at, claim_timeout=args.claim_timeout)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in {"django", "backplane", "recovery"})
    report("modules", django_free=not leaked, leaked=leaked[:5])
    return code


if __name__ == "__main__":
    sys.exit(main())
