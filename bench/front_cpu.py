"""The web process's CPU per single-event append, layer by layer, in one process on uvloop, without
a server or a load generator (issue 40: where the agent ingress's time goes).

    .venv/bin/python bench/front_cpu.py [--appends 4000] [--tasks 16]

``--tasks`` coroutines append to a task each, against a throw-away PostgreSQL, and this process's CPU
time per append (``time.process_time``: the event loop's Python, psycopg's client side and the
threads the writes start, such as the dashboard's live notices; not the database's work) is
reported for each layer, alternating the layers round by round:

1. ``round trips``: five statements as an append makes them (one in autocommit, then ``BEGIN``,
   a row locked, a row written, ``COMMIT``), trivial ones on a scratch table, through psycopg's
   async pool: the floor of any append on this driver and loop;
2. ``write path``: the token's statement (``AGENT_COUNTED_SQL``) and ``event_append_batch_async``,
   the product's own statements, numbering, hash and reduction;
3. ``write path + answer``: the same and the event rendered as the API answers it;
4. ``agent route``: the request through the front's routes (api/agent_front.py) as an ASGI call:
   the checks, the body's declaration, the rate limit, metrics and the answer, with no HTTP parsing
   (uvicorn's share is not in any layer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _support import bench_database

BODY = {"type": "ReasoningStepCompleted", "payload": {"step": 1, "thought": "x" * 100}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=4000, help="appends per layer and round")
    parser.add_argument("--tasks", type=int, default=16, help="concurrent appenders, a task each")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ["BACKPLANE_RATE_LIMIT"] = "1000000/s"
    with bench_database():
        import uvloop

        from backplane.eventlog import services

        token = services.agent_create(name="cpu", namespace="bench").token
        tasks = [services.task_create(namespace="bench", kind="cpu", agent="cpu", input={}).task.pk
                 for _ in range(args.tasks)]
        uvloop.install()
        figures = asyncio.run(measure(args, token, tasks))
    floor = statistics.median(figures["round trips"])
    print(f"CPU of the web process per single-event append, {args.appends} appends by {args.tasks} "
          f"coroutines, median of {args.rounds} rounds (uvloop, psycopg's async pool):")
    for name, samples in figures.items():
        value = statistics.median(samples)
        print(f"  {name:24} {value * 1000:6.3f} ms  ({', '.join(f'{s * 1000:.3f}' for s in samples)})  "
              f"{value / floor:4.1f} x the round trips")


async def measure(args: argparse.Namespace, token: str, tasks: list[Any]) -> dict[str, list[float]]:
    from starlette.routing import Router

    from api import agent_front
    from api.authentication import AGENT_COUNTED_SQL, agent_lookup
    from backplane.eventlog.async_services import event_append_batch_async
    from backplane.eventlog.chain import event_as_api_dict
    from backplane.eventlog.writer import EventDraft
    from backplane.runtime.async_pool import async_pool_close, pooled_connection

    async with pooled_connection() as conn:
        await conn.execute("CREATE TABLE bench_round_trips (id int PRIMARY KEY, n int NOT NULL)")
        await conn.execute("INSERT INTO bench_round_trips SELECT g, 0 FROM generate_series(0, %s) g", [args.tasks])

    async def round_trips(index: int) -> None:
        async with pooled_connection() as conn:
            await (await conn.execute("SELECT %s::int", [index])).fetchone()
            async with conn.transaction():
                await (await conn.execute("SELECT * FROM bench_round_trips WHERE id = %s FOR UPDATE",
                                          [index])).fetchone()
                await (await conn.execute("UPDATE bench_round_trips SET n = n + 1 WHERE id = %s RETURNING n",
                                          [index])).fetchall()

    async def write_path(index: int, *, render: bool = False) -> None:
        async with pooled_connection() as conn:
            lookup = agent_lookup(token)
            principal, _ = lookup.principal(await (await conn.execute(AGENT_COUNTED_SQL, lookup.params)).fetchone())
            assert principal.name is not None
            outcome = await event_append_batch_async(
                conn, namespace="bench", task_id=tasks[index],
                drafts=[EventDraft(type=BODY["type"], payload=dict(BODY["payload"]))], agent=principal.name)
            if render:
                json.dumps(event_as_api_dict(outcome.events[0]))

    threads = ThreadPoolExecutor(max_workers=4)
    app = Router(routes=agent_front.agent_routes(threads), redirect_slashes=False)
    body = json.dumps(BODY).encode()
    headers = [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json"),
               (b"host", b"localhost"), (b"content-length", str(len(body)).encode())]

    async def agent_route(index: int) -> None:
        path = f"/api/v1/tasks/{tasks[index]}/events/"
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": headers, "client": ("127.0.0.1", 40000), "server": ("localhost", 80), "state": {}}
        received = False
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            nonlocal received
            if received:  # the app never asks again once the body is in
                raise AssertionError("the body was asked for twice")
            received = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(scope, receive, send)
        if statuses != [201]:
            raise SystemExit(f"the append was answered {statuses}")

    layers: dict[str, Callable[[int], Awaitable[None]]] = {
        "round trips": round_trips,
        "write path": write_path,
        "write path + answer": lambda index: write_path(index, render=True),
        "agent route": agent_route,
    }

    async def run(layer: Callable[[int], Awaitable[None]], appends: int) -> float:
        async def appender(index: int, count: int) -> None:
            for _ in range(count):
                await layer(index)

        per_task = max(1, appends // args.tasks)
        started = time.process_time()
        await asyncio.gather(*(appender(index, per_task) for index in range(args.tasks)))
        return (time.process_time() - started) / (per_task * args.tasks)

    figures: dict[str, list[float]] = {name: [] for name in layers}
    try:
        for layer in layers.values():  # warm-up: connections, prepared statements, imports
            await run(layer, args.tasks * 20)
        for _ in range(args.rounds):
            for name, layer in layers.items():
                figures[name].append(await run(layer, args.appends))
    finally:
        await async_pool_close()
        threads.shutdown(wait=True)
    return figures


if __name__ == "__main__":
    main()
