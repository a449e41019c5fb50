"""Which stack the agent routes should run on, measured: bench/ingress_apps.py's candidates
side by side with pgbench, in one run on one embedded PostgreSQL.

    .venv/bin/python bench/ingress_stack.py [--seconds 10] [--out var/bench/ingress]

1. Starts a throw-away embedded PostgreSQL (under var/) and loads bench/baselines/pgbench_schema.sql
   (100,000 tasks, the events and outbox tables).
2. For each candidate of ingress_apps.py, alone, under uvicorn as the launcher serves the product
   (uvicorn's defaults: uvloop and httptools, no access log): wrk ``GET /healthz``, then wrk's
   appends (bench/ingress_append.lua: a random task each, a token, a JSON body the
   candidate validates; the database candidates run the transaction of pgbench_append.sql, the
   others answer without one).
3. pgbench's append (pgbench_append.sql) on the same tables, same clients, as the ceiling.
4. Prints a markdown table (req/s, p50, p99, ratio to the bare ASGI floor and to pgbench) and writes
   it with the raw outputs under ``--out``.

Every server and the database are stopped on every exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from http_bench import (
    BASELINES,
    ROOT,
    free_port,
    parse_pgbench,
    parse_wrk,
    postmaster_socket,
    run,
    say,
    seconds,
    wait_answering,
)

sys.path.insert(0, str(ROOT))

from ingress_apps import CANDIDATES, WITH_DB  # noqa: E402

HERE = Path(__file__).resolve().parent


@contextlib.contextmanager
def scratch_server() -> Iterator[tuple[str, Path]]:
    """A new embedded PostgreSQL with pgbench_schema.sql loaded: (its URL, its data directory)."""
    from backplane.runtime import embedded_db

    (ROOT / "var").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-ingress-", dir=ROOT / "var"))
    pgdata = root / "pgdata"
    try:
        url = embedded_db.start(pgdata, database="ingress")
        sockdir, port = postmaster_socket(pgdata)
        run(["psql", "-h", sockdir, "-p", str(port), "-U", "postgres", "-X", "-q", "-v", "ON_ERROR_STOP=1",
             "-f", str(BASELINES / "pgbench_schema.sql"), "ingress"], timeout=600)
        yield url, pgdata
    finally:
        embedded_db.destroy(pgdata)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def candidate_server(name: str, env: dict[str, str], log: Path) -> Iterator[str]:
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(HERE), f"ingress_apps:{name}",
             "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
             "--lifespan", "on" if name in WITH_DB else "off"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(f"{url}/healthz", process, log, name)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wrk(args: argparse.Namespace, script: Path, url: str, env: dict[str, str], log: Path,
        duration: float | None = None) -> dict[str, float]:
    duration = args.duration if duration is None else duration
    output = run(["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{seconds(duration)}s", "--timeout", "30s",
                  "-s", str(script), url], env=env, timeout=duration + 120, log=log)
    return parse_wrk(output)


def measure(args: argparse.Namespace, out: Path) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    token = secrets.token_urlsafe(24)
    with scratch_server() as (url, pgdata):
        env = {**os.environ, "BENCH_DSN": url, "BENCH_TOKEN": token}
        for name in args.candidates:
            say(f"-- {name}")
            with candidate_server(name, env, out / f"{name}.log") as base:
                wrk(args, BASELINES / "healthz.lua", f"{base}/healthz", env, out / f"wrk-{name}-warmup.txt", duration=2)
                results[f"{name} healthz"] = wrk(args, BASELINES / "healthz.lua", f"{base}/healthz", env,
                                                 out / f"wrk-{name}-healthz.txt")
                # Without a database, a candidate answers seq 1 of an empty chain: its parsing,
                # validation, hashing and rendering alone.
                results[f"{name} append"] = wrk(args, HERE / "ingress_append.lua", base, env,
                                                out / f"wrk-{name}-append.txt")
        say("-- pgbench")
        sockdir, port = postmaster_socket(pgdata)
        output = run(["pgbench", "-h", sockdir, "-p", str(port), "-U", "postgres", "-n",
                      "-c", str(args.connections), "-j", str(args.threads), "-T", str(seconds(args.duration)),
                      "-f", str(BASELINES / "pgbench_append.sql"), "ingress"],
                     timeout=args.duration + 300, log=out / "pgbench.txt")
        results["pgbench append"] = parse_pgbench(output)
    return results


def table(results: dict[str, dict[str, float]]) -> str:
    floor = results.get("bare healthz", {}).get("rps")
    ceiling = results.get("pgbench append", {}).get("tps")
    lines = ["| candidate, route | req/s | p50 ms | p99 ms | × bare ASGI healthz | × pgbench append |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, figures in results.items():
        rate = figures.get("rps", figures.get("tps", 0.0))
        to_floor = f"{rate / floor:.2f}" if floor and name.endswith("healthz") else ""
        measured_against_pgbench = name.endswith("append") and name.split()[0] in (*WITH_DB, "pgbench")
        to_ceiling = f"{rate / ceiling:.2f}" if ceiling and measured_against_pgbench else ""
        lines.append(f"| {name} | {rate:,.0f} | {figures.get('p50_ms', float('nan')):.1f} | "
                     f"{figures.get('p99_ms', float('nan')):.1f} | {to_floor} | {to_ceiling} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", dest="duration", type=float, default=10.0, help="seconds of each load")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections and pgbench clients")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads and pgbench jobs")
    parser.add_argument("--candidates", type=lambda text: text.split(","), default=list(CANDIDATES),
                        help=f"comma-separated, of {', '.join(CANDIDATES)}")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench" / "ingress"))
    args = parser.parse_args()
    missing = [tool for tool in ("wrk", "pgbench", "psql") if shutil.which(tool) is None]
    if missing:
        parser.error(f"{', '.join(missing)} not found: `make wrk pgclient` installs them")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = measure(args, out)
    summary = table(results)
    say("")
    say(summary)
    (out / "summary.md").write_text(summary)
    (out / "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
