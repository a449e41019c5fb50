"""A real agent process for the cancel and pause tests, written only against ``backplane_client.agent``.

``--mode work``: claim one task of ``--kinds`` (waiting up to ``--claim-timeout`` seconds), then
record a reasoning step every 0.1 s, as a long-running agent does, until the backplane refuses a
write; the refusal (status, code, details) is reported and the process exits 0. A cooperative
agent stops at its next step once its task is cancelled.

``--mode drain``: claim tasks of ``--kinds`` and complete each at once, until a claim finds
nothing (``204``); then exit 0.

Every decision is printed to stdout as one JSON line (flushed). The token comes from
``BACKPLANE_TOKEN``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from backplane_client.agent import AgentClient, BackplaneAPIError

LEASE_SECONDS = 30


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def work(bp: AgentClient, kinds: list[str], claim_timeout: float) -> int:
    deadline = time.monotonic() + claim_timeout
    lease = bp.claim(kinds=kinds, lease_seconds=LEASE_SECONDS)
    while lease is None and time.monotonic() < deadline:
        time.sleep(0.1)
        lease = bp.claim(kinds=kinds, lease_seconds=LEASE_SECONDS)
    if lease is None:
        report("nothing to claim")
        return 2
    task_id = lease.task["task_id"]
    report("claimed", task_id=task_id, kind=lease.task["kind"], lease_epoch=lease.lease_epoch)
    step = 0
    while step < 600:  # a minute of steps at most: the test cancels long before
        step += 1
        try:
            bp.append(task_id, "ReasoningStepCompleted", {"step": step}, lease_epoch=lease.lease_epoch)
        except BackplaneAPIError as exc:
            report("refused", step=step, status=exc.status, code=exc.code, details=dict(exc.details))
            return 0
        report("step", step=step)
        time.sleep(0.1)
    report("never refused")
    return 3


def drain(bp: AgentClient, kinds: list[str]) -> int:
    while True:
        lease = bp.claim(kinds=kinds, lease_seconds=LEASE_SECONDS)
        if lease is None:
            report("idle")
            return 0
        task_id = lease.task["task_id"]
        bp.append(task_id, "TaskCompleted", {"output": {"done": True}}, lease_epoch=lease.lease_epoch)
        report("completed", task_id=task_id, kind=lease.task["kind"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--mode", choices=["work", "drain"], required=True)
    parser.add_argument("--kinds", required=True, help="comma-separated")
    parser.add_argument("--claim-timeout", type=float, default=10.0)
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    with AgentClient(args.base_url, os.environ["BACKPLANE_TOKEN"]) as bp:
        if args.mode == "work":
            return work(bp, kinds, args.claim_timeout)
        return drain(bp, kinds)


if __name__ == "__main__":
    sys.exit(main())
