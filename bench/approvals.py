"""What a tool policy costs a dispatch, in process, in alternating rounds (docs/approvals.md):

    .venv/bin/python bench/approvals.py [--rounds 6] [--calls 200]

Each round times ``tool_call_dispatch`` of ``--calls`` new calls (one step each, on tasks of their
own, under their leases) four ways, against the first:

1. ungated: the tool has no policy (the baseline);
2. let through: a policy is in force and its condition (``amount > 1000``) does not hold;
3. asked: the policy gates the call; the dispatch writes its request and ``ApprovalRequested``
   (and answers 202);
4. approved: the same call dispatched again once its request was granted: made, under the
   approval (the grant itself, a person's decision, is not timed).

Target (issue 43): a gated dispatch at most 1.5 × an ungated one. Rounds alternate the ways so
the machine's drift falls on all of them alike; the figure is the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from _support import bench_database

WAYS = ("ungated", "let through", "asked", "approved")


def setup_fleet(calls: int) -> dict[str, Any]:
    from django.contrib.auth.models import Group, User

    from backplane.eventlog import services
    from recovery import approvals

    group, _ = Group.objects.get_or_create(name="Approvers")
    approver = User.objects.create_user(f"approver-{uuid.uuid4().hex[:6]}", is_staff=True)
    approver.groups.add(group)
    approvals.tool_policy_set(tool="pay", condition="amount > 1000", field_types={"amount": "number"},
                              approver_group="Approvers", set_by="user:bench", reason="bench")
    agent = services.agent_create(name=f"bench-{uuid.uuid4().hex[:6]}", namespace="bench").agent
    return {"agent": agent, "approver": approver}


def leased_tasks(fleet: dict[str, Any], count: int) -> list[tuple[uuid.UUID, int]]:
    from backplane.eventlog import services
    from recovery import leases

    tasks = []
    for _ in range(count):
        task = services.task_create(namespace="bench", kind="pay", input={}, agent="planner").task
        claim = leases.lease_claim(agent=fleet["agent"], kinds=None, lease_seconds=600, task_id=task.pk)
        assert claim is not None
        tasks.append((task.pk, claim.lease_epoch))
    return tasks


def dispatch_all(fleet: dict[str, Any], tasks: list[tuple[uuid.UUID, int]], *, tool: str, amount: int,
                 gated: bool) -> float:
    from recovery import tool_calls
    from recovery.errors import ApprovalPending

    name = fleet["agent"].name
    started = time.perf_counter()
    for task_id, epoch in tasks:
        try:
            tool_calls.tool_call_dispatch(namespace="bench", task_id=task_id, step=1, tool=tool,
                                          input={"amount": amount, "payee": "ACME GmbH"}, agent=name,
                                          lease_epoch=epoch, reason="bench")
        except ApprovalPending:
            assert gated
    return time.perf_counter() - started


def approve_all(fleet: dict[str, Any]) -> None:
    from recovery import approvals
    from recovery.models import ApprovalRequest

    for approval_id in ApprovalRequest.objects.filter(status="pending").values_list("pk", flat=True):
        approvals.approval_decide(approval_id=approval_id, user=fleet["approver"], verdict="approve", reason="ok")


def one_round(fleet: dict[str, Any], calls: int, *, number: int) -> dict[str, float]:
    """Per-call seconds of each way; the ungated and let-through ways swap places every other round."""
    seconds: dict[str, float] = {}
    plain, through, gated = (leased_tasks(fleet, calls) for _ in range(3))
    first = [("ungated", plain, "search", 5000), ("let through", through, "pay", 10)]
    for way, tasks, tool, amount in first if number % 2 == 0 else reversed(first):
        seconds[way] = dispatch_all(fleet, tasks, tool=tool, amount=amount, gated=False) / calls
    seconds["asked"] = dispatch_all(fleet, gated, tool="pay", amount=5000, gated=True) / calls
    approve_all(fleet)
    seconds["approved"] = dispatch_all(fleet, gated, tool="pay", amount=5000, gated=False) / calls
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with bench_database():
        fleet = setup_fleet(args.calls)
        one_round(fleet, 20, number=0)  # warm up
        rounds = [one_round(fleet, args.calls, number=n) for n in range(args.rounds)]
    print(f"approvals bench: {args.rounds} rounds of {args.calls} dispatches each way, in process")
    for way in WAYS:
        per_call_ms = [r[way] * 1000 for r in rounds]
        ratios = [r[way] / r["ungated"] for r in rounds]
        target = "" if way == "ungated" else (
            f"  ratio {statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})"
            + ("  target <= 1.5: " + ("met" if statistics.median(ratios) <= 1.5 else "NOT met")
               if way in ("let through", "approved") else ""))
        print(f"  {way:12s} {statistics.median(per_call_ms):6.3f} ms a dispatch "
              f"({1000 / statistics.median(per_call_ms):5.0f}/s){target}")


if __name__ == "__main__":
    main()
