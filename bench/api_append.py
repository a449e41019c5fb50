"""Appends over HTTP through the real ASGI server, with concurrent clients.

    .venv/bin/python bench/api_append.py [--clients 16] [--seconds 10] [--workers 2]

Starts uvicorn on the product's ASGI app against a throw-away embedded PostgreSQL (or
DATABASE_URL), gives every client its own agent token and task, then measures
  1. single-event appends (POST /tasks/{id}/events/),
  2. 100-event batch appends (POST /tasks/{id}/events/batch/),
and, in the same run on the same server, `bench/append.py`'s in-process rate
(event_append without HTTP) as the baseline the HTTP figures are compared with.
Server, database and load generator share this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
from _support import ROOT, bench_database, describe

TARGET_SINGLE = 1000.0
TARGET_BATCH = 10000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, workers: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["BACKPLANE_RATE_LIMIT"] = "1000000/s"
    env.setdefault("BACKPLANE_DB_POOL", "1")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "backplane.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers), "--no-access-log", "--lifespan", "off", "--log-level", "warning"],
        cwd=ROOT, env=env, start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("server did not start")


async def drive(base: str, clients: list[tuple[str, str]], seconds: float, batch: int) -> tuple[int, list[float]]:
    """Each client appends to its own task as fast as the server answers, for ``seconds``."""
    latencies: list[float] = []
    events = 0
    stop_at = time.monotonic() + seconds

    async def client(http: aiohttp.ClientSession, token: str, task_id: str) -> None:
        nonlocal events
        headers = {"Authorization": f"Bearer {token}"}
        n = 0
        while time.monotonic() < stop_at:
            if batch == 1:
                url, body = f"{base}/api/v1/tasks/{task_id}/events/", {
                    "type": "ReasoningStepCompleted", "payload": {"step": n, "thought": "bench"}}
            else:
                url, body = f"{base}/api/v1/tasks/{task_id}/events/batch/", {"events": [
                    {"type": "ReasoningStepCompleted", "payload": {"step": n + i, "thought": "bench"}}
                    for i in range(batch)]}
            started = time.perf_counter()
            async with http.post(url, json=body, headers=headers) as response:
                text = await response.text()
                if response.status != 201:
                    raise RuntimeError(f"{response.status}: {text[:300]}")
            latencies.append((time.perf_counter() - started) * 1000)
            events += batch
            n += batch

    started = time.monotonic()
    # aiohttp, not httpx: measured here, httpx's async client tops out near 250 requests/s
    # against a trivial server, aiohttp near 3,700, so it does not hide the server's rate.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await asyncio.gather(*(client(http, token, task_id) for token, task_id in clients))
    elapsed = time.monotonic() - started
    return int(events / elapsed), latencies


def in_process_rate(seconds: float) -> float:
    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft

    task = services.task_create(namespace="bench-inproc", kind="bench", input={}, agent="bench").task
    count = 0
    stop_at = time.monotonic() + seconds
    started = time.monotonic()
    while time.monotonic() < stop_at:
        services.event_append(namespace="bench-inproc", task_id=task.pk, agent="bench",
                              draft=EventDraft(type="ReasoningStepCompleted", payload={"step": count}))
        count += 1
    return count / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()

    with bench_database():
        from backplane.eventlog import services

        clients = []
        for n in range(args.clients):
            token = services.agent_create(name=f"bench-{n}", namespace="bench").token
            task = services.task_create(namespace="bench", kind="bench", input={}, agent=f"bench-{n}").task
            clients.append((token, str(task.pk)))
        inproc = in_process_rate(min(args.seconds, 5))

        port = free_port()
        server = start_server(port, args.workers)
        try:
            base = f"http://127.0.0.1:{port}"
            asyncio.run(drive(base, clients, 2, 1))  # warm-up: connections, imports, caches
            single_rate, single_lat = asyncio.run(drive(base, clients, args.seconds, 1))
            batch_rate, batch_lat = asyncio.run(drive(base, clients, args.seconds, args.batch))
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)

    print(f"api_append bench: {args.clients} concurrent clients, {args.workers} uvicorn worker(s), "
          f"{args.seconds:.0f} s per phase, {os.cpu_count()} CPUs shared by server, PostgreSQL and load generator")
    print(f"  in-process event_append (no HTTP, 1 thread): {inproc:8.0f} events/s")
    print(f"  HTTP single-event appends:                   {single_rate:8.0f} events/s  ({describe(single_lat)})"
          f"  ratio to in-process {single_rate / inproc:.2f}  target >= {TARGET_SINGLE:.0f}/s, p99 < 50 ms")
    print(f"  HTTP {args.batch}-event batch appends:               {batch_rate:8.0f} events/s  "
          f"({describe(batch_lat)} per batch)  target >= {TARGET_BATCH:.0f}/s")


if __name__ == "__main__":
    main()
