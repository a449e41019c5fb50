"""Two durable-execution peers on the same PostgreSQL server: what one durable step costs.

    .venv/bench/bin/python bench/peers.py --database-url postgresql://postgres@/postgres?host=SOCKDIR&port=PORT
        [--duration 15] [--workers 8] [--only dbos|langgraph] [--langgraph-durability sync] [--json PATH]

Needs requirements-bench.txt (``make bench`` installs it into .venv/bench; bench/http_bench.py
runs this file with that venv's Python). ``--database-url`` is a superuser URL of the server:
each peer gets a scratch database of its own there (dropped and created again).

``--workers`` threads (default 8) run workflows or graphs one after another, all at once, for
``--duration`` seconds after a warm-up; the figure is every thread's steps over the window.

- DBOS: a workflow of 10 steps, each a ``@DBOS.step()``, called by each thread again as soon
  as its last one returns (no queue); DBOS checkpoints every step's output in its system
  database before the next step runs. Its system database pool (20 connections by default)
  serves the threads.
- LangGraph: a linear ``StateGraph`` of 10 nodes compiled once with ``PostgresSaver`` over a
  connection pool of ``--workers`` connections (LangGraph's setup for concurrent use), each
  thread invoking it on a new thread id each time, ``durability="sync"`` by default (each step's
  checkpoint is written before the next step starts, as a durable append is acknowledged after
  its commit). PostgresSaver holds one lock around each of its queries: that is the library's own.

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
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
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


def timed_loop(run_once: Any, duration: float, workers: int) -> tuple[int, float]:
    """``run_once()`` (one 10-step run) from ``workers`` threads: each warms up for WARMUP_SECONDS,
    then all count their runs for ``duration``. Returns the runs and the window's seconds."""
    start = threading.Barrier(workers)

    def work() -> tuple[int, float, float]:
        try:
            warm_until = time.monotonic() + WARMUP_SECONDS
            while time.monotonic() < warm_until:
                run_once()
            start.wait()
        except BaseException:
            start.abort()  # the other threads stop waiting (BrokenBarrierError)
            raise
        runs, started = 0, time.perf_counter()
        stop_at = time.monotonic() + duration
        while time.monotonic() < stop_at:
            run_once()
            runs += 1
        return runs, started, time.perf_counter()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        counted = [future.result() for future in [pool.submit(work) for _ in range(workers)]]
    window = max(end for _, _, end in counted) - min(started for _, started, _ in counted)
    return sum(runs for runs, _, _ in counted), window


def measure_dbos(url: str, duration: float, workers: int) -> dict[str, Any]:
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

        runs, elapsed = timed_loop(once, duration, workers)
    finally:
        DBOS.destroy()
    return {"library": "dbos", "version": version("dbos"), "workers": workers, "workflows": runs,
            "steps": runs * STEPS, "seconds": round(elapsed, 3), "steps_per_s": round(runs * STEPS / elapsed, 1)}


def measure_langgraph(url: str, duration: float, durability: str, workers: int) -> dict[str, Any]:
    from typing import TypedDict

    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

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

    connection = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}  # as from_conn_string's
    with ConnectionPool(url, min_size=workers, max_size=workers, kwargs=connection) as pool:
        checkpointer = PostgresSaver(pool)
        checkpointer.setup()
        graph = builder.compile(checkpointer=checkpointer)

        def once() -> None:
            config = {"configurable": {"thread_id": str(uuid.uuid4())}}
            result = graph.invoke(payload(0), config, durability=durability)
            if result["step"] != STEPS:
                raise RuntimeError("the LangGraph graph did not run its 10 nodes")

        runs, elapsed = timed_loop(once, duration, workers)
    return {"library": "langgraph", "version": version("langgraph"),
            "checkpointer": f"langgraph-checkpoint-postgres {version('langgraph-checkpoint-postgres')}",
            "durability": durability, "workers": workers, "graph_runs": runs, "steps": runs * STEPS,
            "seconds": round(elapsed, 3), "steps_per_s": round(runs * STEPS / elapsed, 1)}


def run_one(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    """In this process: a scratch database, then the measurement."""
    url = recreate_database(args.database_url, f"{args.database_prefix}_{peer}")
    if peer == "dbos":
        return measure_dbos(url, args.duration, args.workers)
    return measure_langgraph(url, args.duration, args.langgraph_durability, args.workers)


def run_isolated(peer: str, args: argparse.Namespace) -> dict[str, Any]:
    """In a child process of its own; a failure is reported, not raised."""
    with tempfile.TemporaryDirectory(prefix="bp-peers-") as tmp:
        out = Path(tmp) / f"{peer}.json"
        argv = [sys.executable, __file__, "--database-url", args.database_url, "--duration", str(args.duration),
                "--workers", str(args.workers), "--database-prefix", args.database_prefix,
                "--langgraph-durability", args.langgraph_durability, "--only", peer, "--in-process", "--json", str(out)]
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
    parser.add_argument("--workers", type=int, default=8, help="threads running workflows or graphs at once")
    parser.add_argument("--only", choices=PEERS, action="append", help="measure only this peer (repeatable)")
    parser.add_argument("--langgraph-durability", choices=("sync", "async", "exit"), default="sync")
    parser.add_argument("--database-prefix", default="bp_bench_peer")
    parser.add_argument("--in-process", action="store_true", help="measure in this process (no child per peer)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url is required")
    if args.workers < 1:
        parser.error("--workers must be 1 or more")

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
