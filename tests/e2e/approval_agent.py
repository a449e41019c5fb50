"""A real agent process for the approval tests, written only against ``backplane_client``: it
claims one task of ``--kind``, then pays through the session's ``call_tool`` (a gated call: it
waits there for people's decision), calling the tool's URL with the call's ``Idempotency-Key``,
and completes the task. Every step is printed as one JSON line, flushed, for the test to read.
The token comes from ``BACKPLANE_TOKEN``; the task input is ``{"tool_url": ..., "payment": {...}}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import httpx

from backplane_client import AgentClient

PAY_STEP = 2


def report(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}, sort_keys=True), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--claim-timeout", type=float, default=10.0)
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
            call = session.call_tool(PAY_STEP, "payments.transfer", task["input"]["payment"], pay,
                                     reason="the October invoice")
            report("paid", key=call.key, replayed=call.replayed, status=call.status)
            session.complete({"paid": call.result})
            report("completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
