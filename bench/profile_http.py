"""Where a hot route's time goes in the web process, under load: py-spy samples it while wrk drives it.

    .venv/bin/python bench/profile_http.py [--route append|batch|task|healthz] [--duration 20]
    make profile   (every route)

Starts the product as ``make run`` does (bench/http_bench.py's ``Product``), creates an agent and
tasks, runs wrk with the route's script from bench/baselines/ (``task``: a GET of one task) and,
meanwhile, ``py-spy record --format raw`` on the uvicorn process (all its threads, idle frames
left out). It prints the share of samples spent in each part of the request (inclusive), the
functions that took most samples themselves, and writes the collapsed stacks to var/bench/ (load
them into speedscope or flamegraph.pl for a picture). py-spy comes from requirements-bench.txt
(.venv/bench).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

from http_bench import ROOT, Product, run, say, stops_on_signals

sys.path.insert(0, str(ROOT))  # Product.stop imports the product's embedded-database helper

BASELINES = ROOT / "bench" / "baselines"
SCRIPTS = {"append": BASELINES / "append.lua", "batch": BASELINES / "batch.lua", "healthz": BASELINES / "healthz.lua",
           "task": ROOT / "bench" / "read.lua"}

# The parts of a request, by the frame that marks them (first match in a stack, outermost first).
PARTS = [
    ("HTTP front: auth + rate limit (one statement)", "_authenticated (api/agent_front.py"),
    ("body: strict JSON parse", "loads_strict"),
    ("body: checked against its declaration (msgspec)", "checked (api/bodies.py"),
    ("append: the client's events checked (canonical JSON, digests)", "validate_client_drafts"),
    ("writer: the plan (number, hash, reduce)", "write_plan"),
    ("append on the loop: its statements and transaction", "event_append_batch_async"),
    ("writer on a thread: insert events, update the row", "_insert_events_and_update_projections"),
    ("task read (async)", "_task_read"),
    ("rendering the answer", "json_bytes"),
    ("metrics: the request counted", "count_response"),
    ("Django middleware + handler (a thread's request)", "get_response"),
    ("Starlette, uvicorn, the event loop (the rest)", ""),
]


def summarize(raw: Path, top: int = 25) -> str:
    """Inclusive shares of PARTS and the top self-time frames, from py-spy's collapsed stacks."""
    total = 0
    parts: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    waiting = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        if "threading.py" in frames[-1] or "concurrent/futures/thread.py" in frames[-1]:
            continue  # an idle pool thread waiting for work (py-spy counts it as running)
        total += count
        leaf = frames[-1]
        leaves[leaf] += count
        if "wait" in leaf and "psycopg" in leaf:
            waiting += count
        for name, marker in PARTS:
            if marker and any(marker in frame for frame in frames):
                parts[name] += count
                break
        else:
            parts[PARTS[-1][0]] += count
    lines = [f"{total} samples of the web process's busy threads (idle pool threads left out)", "",
             "inclusive share, by part of the request:"]
    for name, _ in PARTS:
        if parts[name]:
            lines.append(f"  {100 * parts[name] / total:5.1f} %  {name}")
    lines += [f"  ({100 * waiting / total:.1f} % of all samples: psycopg waiting on the database)", "",
              f"the {top} frames with most samples of their own:"]
    for leaf, count in leaves.most_common(top):
        lines.append(f"  {100 * count / total:5.1f} %  {leaf[:150]}")
    return "\n".join(lines)


def web_pid(product: Product) -> int:
    pattern = f"uvicorn backplane.asgi:application --host 127.0.0.1 --port {product.port}"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout.split()
    if not found:
        raise RuntimeError("the web process was not found")
    return int(found[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", choices=["append", "batch", "task", "healthz", "all"], default="all")
    parser.add_argument("--duration", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--py-spy", default=str(ROOT / ".venv" / "bench" / "bin" / "py-spy"))
    parser.add_argument("--out", default=str(ROOT / "var" / "bench"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    routes = ["healthz", "task", "append", "batch"] if args.route == "all" else [args.route]
    product = Product(log=out / "profile-product.log", keep=False)
    with stops_on_signals():
        try:
            product.start()
            product.wait_ready()
            token = run([sys.executable, "manage.py", "create_agent", "bench-profile", "--namespace", "bench"],
                        timeout=120, env=product.manage_env()).strip().splitlines()[-1]
            import httpx

            with httpx.Client(base_url=product.url, headers={"Authorization": f"Bearer {token}"}) as http:
                tasks = [http.post("/api/v1/tasks/", json={"kind": "bench", "input": {}}).json()["task_id"]
                         for _ in range(args.tasks)]
            pid = web_pid(product)
            for route in routes:
                script = SCRIPTS[route]
                raw = out / f"profile-{route}.txt"
                env = {**os.environ, "BP_TOKEN": token, "TASKS": ",".join(tasks)}
                load = subprocess.Popen(["wrk", "-t2", "-c16", f"-d{args.duration}s", "--timeout", "30s", "-s",
                                         str(script), product.url], env=env, stdout=subprocess.PIPE, text=True)
                time.sleep(2)  # past the first connections
                subprocess.run([args.py_spy, "record", "--pid", str(pid), "--duration", str(args.duration - 4),
                                "--rate", "100", "--format", "raw", "--output", str(raw), "--nonblocking"],
                               check=True, capture_output=True)
                wrk_out, _ = load.communicate(timeout=args.duration + 60)
                summary = summarize(raw)
                (out / f"profile-{route}.summary.txt").write_text(summary + "\n")
                say(f"\n== {route}: {wrk_out.strip().splitlines()[-1] if wrk_out.strip() else ''}\n{summary}")
        finally:
            product.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
