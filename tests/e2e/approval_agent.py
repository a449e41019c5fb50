"""A real agent process for the approval tests, written only against ``backplane_client``: it
claims one task of ``--kind``, then pays through the session's ``call_tool`` (a gated call: it
waits there for people's decision, ``--patience`` seconds at most, then gives the task back and
exits 4), calling the tool's URL with the call's ``Idempotency-Key``, and completes the task; a
denied or expired request fails the task for good (exit 5); nothing to claim is exit 3. Every
step is printed as one JSON line, flushed, for the test to read.
The token comes from ``BACKPLANE_TOKEN``; the task input is ``{"tool_url": ..., "payment": {...}}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx

from backplane_client import AgentClient, ApprovalDenied, ApprovalExpired, AwaitingApproval

PAY_STEP = 2


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--claim-timeout", type=float, default=10.0)
    parser.add_argument("--patience", type=float, default=3600.0, help="seconds to wait for people's decision")
    args = parser.parse_args()
    with AgentClient(args.base_url, os.environ["BACKPLANE_TOKEN"]) as bp:
        deadline = time.monotonic() + args.claim_timeout
        while (session := bp.claim_session([args.kind], lease_seconds=30, heartbeat_interval=1.0)) is None:
            if time.monotonic() > deadline:
                report("nothing to claim")
                return 3
            time.sleep(0.05)
        with session:
            task = session.task
            report("claimed", task_id=session.task_id, epoch=session.lease_epoch)

            def pay(key: str, body: dict[str, Any]) -> dict[str, Any]:
                report("paying", key=key)
                answer = httpx.post(task["input"]["tool_url"], json=body, headers={"Idempotency-Key": key},
                                    timeout=10)
                answer.raise_for_status()
                return dict(answer.json())

            report("dispatching", step=PAY_STEP)
            try:
                call = session.call_tool(PAY_STEP, "payments.transfer", task["input"]["payment"], pay,
                                         reason="the October invoice", approval_timeout=args.patience)
            except AwaitingApproval as waiting:
                # Out of patience: the task goes back and waits without us (no claim hands it out).
                session.release()
                report("gave back", approval_id=waiting.approval_id)
                return 4
            except (ApprovalDenied, ApprovalExpired) as refused:
                session.fail(f"payment not approved: {refused.code}", retryable=False)
                report("refused", code=refused.code)
                return 5
            report("paid", key=call.key, replayed=call.replayed, status=call.status)
            session.complete({"paid": call.result})
            report("completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
