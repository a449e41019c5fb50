"""Two durable-execution peers on the same PostgreSQL server, 1 worker: what one durable step costs.

    .venv/bench/bin/python bench/peers.py --database-url postgresql://postgres@/postgres?host=SOCKDIR&port=PORT
        [--duration 15] [--only dbos|langgraph] [--langgraph-durability sync] [--json PATH]

Needs requirements-bench.txt (``make bench`` installs it into .venv/bench; bench/http_bench.py
runs this file with that venv's Python). ``--database-url`` is a superuser URL of the server:
each peer gets a scratch database of its own there (dropped and created again).

- DBOS: a workflow of 10 steps, each a ``@DBOS.step()``, called one after another (one worker,
  no queue) for ``--duration`` seconds; DBOS checkpoints every step's output in its system
  database before the next step runs.
- LangGraph: a linear ``StateGraph`` of 10 nodes compiled with ``PostgresSaver``, invoked on a
  new thread each time, ``durability="sync"`` by default (each step's checkpoint is written
  before the next step starts, as a durable append is acknowledged after its commit).

Each step carries a small JSON-able value (about the size of an event's payload). Prints
``dbos_steps_per_s=<x>`` and ``langgraph_steps_per_s=<y>``; ``--json PATH`` writes both with
the libraries' versions. Each peer runs in a child process of its own, so one's background
threads (DBOS's) do not share the other's interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

STEPS = 10
PEERS = ("dbos", "langgraph")
WARMUP_SECONDS = 1.0


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def recreate_database(admin_url: str, database: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    return with_database(admin_url, database)


def payload(i: int) -> dict[str, Any]:
    return {"step": i, "note": "load", "data": "x" * 64}


def timed_loop(run_once: Any, duration: float) -> tuple[int, float]:
    """Run ``run_once()`` (one 10-step run) for WARMUP_SECONDS, then count runs for ``duration``."""
    warm_until = time.monotonic() + WARMUP_SECONDS
    while time.monotonic() < warm_until:
        run_once()
    runs = 0
    started = time.perf_counter()
    stop_at = time.monotonic() + duration
    while time.monotonic() < stop_at:
        run_once()
        runs += 1
    return runs, time.perf_counter() - started


def measure_dbos(url: str, duration: float) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig

    @DBOS.step()
    def step(i: int, value: dict[str, Any]) -> dict[str, Any]:
        return {**value, "step": i}

    @DBOS.workflow()
    def ten_steps() -> int:
        value = payload(0)
        for i in range(STEPS):
            value = step(i + 1, value)
        return int(value["step"])

    config: DBOSConfig = {
        "name": "bp-bench-peers",
        "system_database_url": url,
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        def once() -> None:
            if ten_steps() != STEPS:
                raise RuntimeError("the DBOS workflow did not run its 10 steps")

        runs, elapsed = timed_loop(once, duration)
    finally:
        DBOS.destroy()
    return {"library": "dbos", "version": version("dbos"), "workflows": runs, "steps": runs * STEPS,
            "seconds": round(elapsed, 3), "steps_per_s": round(runs * STEPS / elapsed, 1)}


def measure_langgraph(url: str, duration: float, durability: str) -> dict[str, Any]:
    from typing import TypedDict

    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        step: int
        note: str
        data: str

    def node(state: State) -> dict[str, Any]:
        return {"step": state["step"] + 1}

    builder = StateGraph(State)
    names = [f"step_{i + 1}" for i in range(STEPS)]
    for name in names:
        builder.add_node(name, node)
    builder.add_edge(START, names[0])
    for before, after in zip(names, names[1:], strict=False):
        builder.add_edge(before, after)
    builder.add_edge(names[-1], END)

    with PostgresSaver.from_conn_string(url) as checkpointer:
        checkpointer.setup()
        graph = builder.compile(checkpointer=checkpointer)

        def once() -> None:
            config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            result = graph.invoke(payload(0), config, durability=durability)
            if result["step"] != STEPS:
                raise RuntimeError("the LangGraph graph did not run its 10 nodes")

        runs, elapsed = timed_loop(once, duration)
    return {"library": "langgraph", "version": version("langgraph"),
            "checkpointer": f"langgraph-checkpoint-postgres {version('langgraph-checkpoint-postgres')}",
            "durability": durability, "threads": runs, "steps": runs * STEPS, "seconds": round(elapsed, 3),
            "steps_per_s": round(runs * STEPS / elapsed, 1)}


def run_one(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    """In this process: a scratch database, then the measurement."""
    url = recreate_database(args.database_url, f"{args.database_prefix}_{peer}")
    if peer == "dbos":
        return measure_dbos(url, args.duration)
    return measure_langgraph(url, args.duration, args.langgraph_durability)


def run_isolated(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    """In a child process of its own; a failure is reported, not raised."""
    with tempfile.TemporaryDirectory(prefix="bp-peers-") as tmp:
        out = Path(tmp) / f"{peer}.json"
        argv = [sys.executable, __file__, "--database-url", args.database_url, "--duration", str(args.duration),
                "--database-prefix", args.database_prefix, "--langgraph-durability", args.langgraph_durability,
                "--only", peer, "--in-process", "--json", str(out)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=args.duration + 300)
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
            return {"library": peer, "error": f"exit {done.returncode}: " + " | ".join(tail)}
        return dict(json.loads(out.read_text())[peer])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("PEERS_DATABASE_URL", ""),
                        help="a superuser URL of the PostgreSQL server (scratch databases are made there)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per peer (after 1 s warm-up)")
    parser.add_argument("--only", choices=PEERS, action="append", help="measure only this peer (repeatable)")
    parser.add_argument("--langgraph-durability", choices=("sync", "async", "exit"), default="sync")
    parser.add_argument("--database-prefix", default="bp_bench_peer")
    parser.add_argument("--in-process", action="store_true", help="measure in this process (no child per peer)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url is required")

    results: dict[str, Any] = {}
    for peer in args.only or PEERS:
        results[peer] = run_one(peer, args) if args.in_process else run_isolated(peer, args)
        figure = results[peer].get("steps_per_s")
        print(f"{peer}_steps_per_s={figure if figure is not None else 'nan'}", flush=True)
        if "error" in results[peer]:
            print(f"{peer} failed: {results[peer]['error']}", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
