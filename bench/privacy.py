"""What sealing personal data costs an append, in process, in alternating rounds (docs/privacy.md):

    .venv/bin/python bench/privacy.py [--rounds 6] [--appends 200]

Each round times ``--appends`` appends (``POST /api/v1/tasks/{id}/events/``, one event each,
with an agent's bearer token) through the real agent front (api/agent_front.py: its Starlette
routes over ``httpx.ASGITransport``, on an event loop of this script's, as
tests/api/test_agent_front.py serves them), three ways, against the first:

1. in clear: ``{"email": ..., "name": {"first", "last"}, "score": 87, "step": n}``;
2. personal, known subject: the same payload with ``email`` and ``name`` each a ``$personal``
   marker of one subject whose key exists (made before timing): one more statement (the
   subject's key read), a key unwrap and two AES-GCM seals;
3. personal, new subject: the same, each append naming a subject never seen before: its key is
   made on the way, by the same one statement (which then inserts a row and commits it).

No marker asks for ``lookup`` (the blind index is not timed). Each way writes the same number of
events, spread over new tasks of its own each round (``APPENDS_PER_TASK`` to a task), so no
chain grows through the run. The ways' order is reversed every other round so the machine's
drift falls on all of them alike; a way's ratio is the median of the rounds' ratios of its time
to the clear way's.

Target (issue 44): an append carrying personal values costs <= 1.3 x the same append in clear.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _support import bench_database

WAYS = ("in clear", "known subject", "new subject")
TARGET = 1.3
APPENDS_PER_TASK = 10
NAMESPACE = "bench"
KNOWN_SUBJECT = "lead:8812"
EMAIL = "ada@example.com"
NAME = {"first": "Ada", "last": "Lovelace"}


def personal(subject: str, value: Any) -> dict[str, Any]:
    return {"$personal": {"subject": subject, "value": value}}


def payload(way: str, step: int, subject: str) -> dict[str, Any]:
    if way == "in clear":
        return {"email": EMAIL, "name": NAME, "score": 87, "step": step}
    return {"email": personal(subject, EMAIL), "name": personal(subject, NAME), "score": 87, "step": step}


class Front:
    """The agent routes over ASGI on this script's event loop; writes the loop hands off run on
    its threads, as the web process runs them on its own (backplane/asgi.py)."""

    def __init__(self, token: str) -> None:
        import httpx
        from starlette.routing import Router

        from api import agent_front

        self.loop = asyncio.new_event_loop()
        self.threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="bench-front")
        self.app = Router(routes=agent_front.agent_routes(self.threads), redirect_slashes=False)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://testserver",
                                      headers={"Authorization": f"Bearer {token}"})

    def append_all(self, appends: list[tuple[str, dict[str, Any]]]) -> float:
        """Seconds to make ``appends`` (task id, payload), one after the other; each must be 201."""

        async def run() -> float:
            started = time.perf_counter()
            for task_id, body in appends:
                answer = await self.http.post(f"/api/v1/tasks/{task_id}/events/",
                                              json={"type": "LeadQualified", "payload": body})
                if answer.status_code != 201:
                    raise RuntimeError(f"append answered {answer.status_code}: {answer.text[:300]}")
            return time.perf_counter() - started

        return self.loop.run_until_complete(run())

    def last_event(self, task_id: str) -> dict[str, Any]:
        async def read() -> dict[str, Any]:
            answer = await self.http.get(f"/api/v1/tasks/{task_id}/events/")
            assert answer.status_code == 200, answer.text[:300]
            body = answer.json()
            return (body["results"] if isinstance(body, dict) else body)[-1]

        return self.loop.run_until_complete(read())

    def close(self) -> None:
        from backplane.runtime.async_pool import async_pool_close
        from dashboard.live import publisher

        # The dashboard's live notices (a thread of their own here) stop before the database does.
        publisher.close()
        self.loop.run_until_complete(self.http.aclose())
        self.loop.run_until_complete(async_pool_close())
        self.loop.close()
        self.threads.shutdown(wait=True)


def setup_fleet() -> dict[str, Any]:
    from backplane.eventlog import services
    from backplane.privacy.sealing import seal_personal

    name = f"bench-{uuid.uuid4().hex[:6]}"
    created = services.agent_create(name=name, namespace=NAMESPACE)
    # The known subject's key, made before anything is timed.
    seal_personal(NAMESPACE, {"email": personal(KNOWN_SUBJECT, EMAIL)})
    return {"agent": name, "token": created.token}


def new_tasks(fleet: dict[str, Any], count: int) -> list[str]:
    from backplane.eventlog import services

    return [str(services.task_create(namespace=NAMESPACE, kind="lead-qualification", input={},
                                     agent=fleet["agent"]).task.pk) for _ in range(count)]


def planned(fleet: dict[str, Any], way: str, appends: int, *, number: int) -> list[tuple[str, dict[str, Any]]]:
    """The way's appends of one round, on new tasks of its own: (task id, payload)."""
    tasks = new_tasks(fleet, max(1, -(-appends // APPENDS_PER_TASK)))
    run = uuid.uuid4().hex[:8]
    return [(tasks[n % len(tasks)],
             payload(way, n, KNOWN_SUBJECT if way == "known subject" else f"lead:{run}-{number}-{n}"))
            for n in range(appends)]


def one_round(front: Front, fleet: dict[str, Any], appends: int, *, number: int) -> dict[str, float]:
    """Per-append seconds of each way; the ways' order reversed every other round."""
    plans = {way: planned(fleet, way, appends, number=number) for way in WAYS}
    order = WAYS if number % 2 == 0 else tuple(reversed(WAYS))
    return {way: front.append_all(plans[way]) / appends for way in order}


def check_sealed(front: Front, fleet: dict[str, Any]) -> None:
    """The personal ways' events hold envelopes, not the values (else this bench times nothing)."""
    for way in WAYS[1:]:
        (task_id, body), = planned(fleet, way, 1, number=-1)
        front.append_all([(task_id, body)])
        stored = front.last_event(task_id)["payload"]
        for field in ("email", "name"):
            marker = stored[field].get("$personal", {}) if isinstance(stored[field], dict) else {}
            assert "sealed" in marker and "value" not in marker, f"{way}: {field} was not sealed: {stored[field]!r}"
        assert EMAIL not in str(stored) and NAME["last"] not in str(stored), f"{way}: clear value stored"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--appends", type=int, default=200)
    args = parser.parse_args()
    # Per token, the product's default (600/s) could answer 429 to one fast client.
    os.environ["BACKPLANE_RATE_LIMIT"] = "1000000/s"
    with bench_database():
        fleet = setup_fleet()
        front = Front(fleet["token"])
        try:
            check_sealed(front, fleet)
            one_round(front, fleet, 20, number=0)  # warm up
            rounds = [one_round(front, fleet, args.appends, number=n) for n in range(args.rounds)]
        finally:
            front.close()
    print(f"privacy bench: {args.rounds} rounds of {args.appends} appends each way "
          f"({APPENDS_PER_TASK} a task), through the agent front, in process")
    ratio = {way: [r[way] / r["in clear"] for r in rounds] for way in WAYS}
    for way in WAYS:
        mean_ms = statistics.fmean(r[way] for r in rounds) * 1000
        line = f"  {way:13s} {mean_ms:6.3f} ms an append ({1000 / mean_ms:5.0f}/s)"
        if way != "in clear":
            median = statistics.median(ratio[way])
            line += (f"  ratio {median:.2f} (rounds {min(ratio[way]):.2f}-{max(ratio[way]):.2f})"
                     f"  target <= {TARGET}: " + ("met" if median <= TARGET else "NOT met"))
        print(line)
    print(f"privacy bench: sealed/clear ratio known subject {statistics.median(ratio['known subject']):.2f}, "
          f"new subject {statistics.median(ratio['new subject']):.2f} (target <= {TARGET})")


if __name__ == "__main__":
    main()
