"""Every benchmark target side by side, in one run on this machine: each figure, its baseline, their ratio.

    .venv/bin/python bench/http_bench.py [--seconds 15] [--tasks 300] [--out var/bench]
    make bench

(Not ``bench/http.py``: a script's folder comes first on ``sys.path``, so a ``bench/http.py`` would
shadow the standard library's ``http`` package for every script in bench/, Django's included.)

1. Starts the product the way ``make run`` does: the launcher (``python -m
   backplane.runtime.launcher --port P --var-dir <fresh dir>``) with ``BACKPLANE_ENV=development``,
   ``BACKPLANE_DEMO=0`` and the per-token rate limit (``BACKPLANE_RATE_LIMIT``) raised so it does
   not throttle the load; waits for ``/readyz``; makes an agent token (``manage.py create_agent``)
   and ``--tasks`` tasks over the API.
2. wrk (``-t2 -c16 -d15s``) with the baseline scripts in bench/baselines/ (copies of
   shared/bench/): ``GET /healthz`` of the product, an agent's reads of its tasks (bench/read.lua),
   then ``GET /healthz`` of the two floors of
   bench/baselines/minimal_django.py, each served alone on a port of its own under the same
   server (uvicorn; the Django view behind a2wsgi with the product's thread count, the bare ASGI
   hello-world as it is) and stopped after; then single-event appends and 100-event batches
   (and, last of all, single-event appends each with one outbox message: bench/append_outbox.lua).
   Each of the appends and the batches is followed by the same script against its floor,
   bench/append_floor.py: the product's own statements for the request, on its database, sent
   by a bare ASGI callable with none of the product's Python, served alone under the same
   server and stopped after (tasks of its own: its hashes are not the product's chain's).
3. pgbench's plain-SQL append transaction (bench/baselines/pgbench_append.sql, 16 clients) in a
   scratch database of the product's own embedded PostgreSQL (socket directory and port from
   lines 5 and 4 of ``<var>/pgdata/postmaster.pid``, user postgres).
4. bench/append.py (in-process ``event_append`` against raw psycopg's lock + insert + update, 1
   thread; its report is printed) and bench/proof.py (informational), each with ``DATABASE_URL``
   naming a scratch database of the same server.
5. bench/peers.py (DBOS and LangGraph, ``--peer-workers`` threads) with ``--peers-python`` (the
   venv holding requirements-bench.txt), on scratch databases of the same server.
6. Prints the table (markdown): each figure, its baseline, the ratio, the target and whether it
   is met; writes it to ``--out`` as summary.md and summary.json beside each tool's raw output.

The product and its PostgreSQL are stopped on every exit: an error, Ctrl-C, SIGTERM or SIGHUP
(a second Ctrl-C while stopping is ignored); if this process is SIGKILLed, the launcher sees its
parent go and stops everything itself. Exit status: 1 if a measurement failed (its row says
why), 0 otherwise; with ``--strict`` also 1 when a target is not met.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
BASELINES = BENCH / "baselines"
BENCH_VENV_PYTHON = ROOT / ".venv" / "bench" / "bin" / "python"
READY_SECONDS = 240.0
STOP_SECONDS = 90.0
CHILD_GRACE_SECONDS = 20.0
# The throttle is per agent token (settings.BACKPLANE_RATE_LIMIT, DRF's "<count>/<period>").
RATE_LIMIT = "1000000/s"

# --- parsing what the tools print ---------------------------------------------------------------

_PAIR = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)=(-?nan|-?inf|-?\d+(?:\.\d+)?)")


def parse_pairs(line: str) -> dict[str, float]:
    """``key=value`` figures of one line (``p50_ms=1.2 rps=900 non201=0``); nan and inf allowed."""
    return {key: float(value) for key, value in _PAIR.findall(line)}


def parse_wrk(output: str) -> dict[str, float]:
    """What one wrk run printed: the figures of the line the baseline script's ``done()`` wrote
    (healthz.lua: p50_ms, p99_ms, rps; append.lua: the same and non201; batch.lua: p50_ms, p99_ms,
    req_s, events_s, non201), plus wrk's own counts (requests, socket_errors, non_2xx)."""
    figures: dict[str, float] | None = None
    for line in output.splitlines():
        pairs = parse_pairs(line)
        if "p99_ms" in pairs:
            figures = pairs
    if figures is None:
        raise ValueError("no line with p99_ms= in wrk's output:\n" + output[-2000:])
    done = re.search(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)\b", output, re.MULTILINE)
    figures["requests"] = float(done.group(1)) if done else math.nan
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output)
    figures["socket_errors"] = float(sum(int(n) for n in errors.groups())) if errors else 0.0
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    figures["non_2xx"] = float(non_2xx.group(1)) if non_2xx else 0.0
    return figures


def parse_pgbench(output: str) -> dict[str, float]:
    """pgbench's throughput (``tps = 1234.5 (without initial connection time)``), its latency
    average and its failed transactions (PostgreSQL 15's client reports them)."""
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", output, re.MULTILINE)
    if not tps:
        raise ValueError("no 'tps = ... (without initial connection time)' in pgbench's output:\n" + output[-2000:])
    figures = {"tps": float(tps.group(1))}
    latency = re.search(r"^latency average = ([\d.]+) ms", output, re.MULTILINE)
    figures["latency_avg_ms"] = float(latency.group(1)) if latency else math.nan
    processed = re.search(r"^number of transactions actually processed: (\d+)", output, re.MULTILINE)
    figures["transactions"] = float(processed.group(1)) if processed else math.nan
    failed = re.search(r"^number of failed transactions: (\d+)", output, re.MULTILINE)
    figures["failed"] = float(failed.group(1)) if failed else 0.0
    return figures


def postmaster_socket(pgdata: Path) -> tuple[str, int]:
    """(socket directory, port) from ``postmaster.pid``: its 5th and 4th lines."""
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    return lines[4].strip(), int(lines[3].strip())


# --- the table ----------------------------------------------------------------------------------


@dataclass
class Row:
    path: str
    target: str = "—"
    figure: str = "not measured"
    baseline: str = "—"
    ratio: str = "—"
    met: bool | None = None  # None: no target, or not measured
    note: str = ""
    values: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "—" if self.target == "—" else "not measured"
        return "met" if self.met else "**not met**"

    def compare(self, figure: float, baseline: float, minimum: float) -> float:
        """The ratio figure ÷ baseline, and whether it reaches ``minimum``; returns the ratio."""
        ratio = figure / baseline
        self.ratio, self.met = f"{ratio:.2f}", ratio >= minimum
        self.values.update(figure=figure, baseline=baseline, ratio=round(ratio, 3))
        return ratio


def fmt(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def markdown(rows: list[Row], header: list[str]) -> str:
    lines = [*header, "", "| path | figure | baseline | ratio | target | met |", "|---|---|---|---|---|---|"]
    for row in rows:
        figure = row.figure + (f" ({row.note})" if row.note else "")
        lines.append(f"| {row.path} | {figure} | {row.baseline} | {row.ratio} | {row.target} | {row.verdict} |")
    return "\n".join(lines) + "\n"


def both_rounds(runs: list[dict[str, float]]) -> dict[str, float] | None:
    """Runs of one script as one figure: the mean rate, the worst p99, every lost answer."""
    if not runs:
        return None
    return {"rps": sum(r["rps"] for r in runs) / len(runs), "p99_ms": max(r["p99_ms"] for r in runs),
            **{name: sum(r.get(name, 0.0) for r in runs) for name in ("non201", "non_2xx", "socket_errors")}}


def served(wrk: dict[str, float]) -> str:
    return f"{fmt(wrk['rps'])} req/s, p99 {fmt(wrk['p99_ms'], 1)} ms"


def batch_figure(wrk: dict[str, float]) -> str:
    return f"{fmt(wrk['events_s'])} events/s ({fmt(wrk['req_s'])} req/s, p99 {fmt(wrk['p99_ms'], 1)} ms)"


def lost(wrk: dict[str, float]) -> int:
    """Answers that were not the expected status (append.lua and batch.lua count non-201s, read.lua
    non-200s), or never came."""
    unexpected = max(wrk.get("non201", 0), wrk.get("non200", 0), wrk.get("non_2xx", 0))
    return int(unexpected + wrk.get("socket_errors", 0))


def build_rows(results: dict[str, Any]) -> list[Row]:
    """The table from the raw figures. A row whose figure or baseline is missing says why; answers
    lost under load are noted and fail the row's target."""
    def errors(*names: str) -> str:
        return "; ".join(str(results[f"{name}_error"]) for name in names if results.get(f"{name}_error"))

    healthz, floor, limit = results.get("healthz"), results.get("floor_django"), results.get("floor_asgi")
    append, batch, pgbench = results.get("append"), results.get("batch"), results.get("pgbench")
    append_outbox, read = results.get("append_outbox"), results.get("read")
    inproc, proof, peers = results.get("append_py"), results.get("proof"), results.get("peers") or {}
    pgbench_tps = "not measured"
    if pgbench:
        failed = f", {int(pgbench['failed']):,} failed" if pgbench.get("failed") else ""
        pgbench_tps = f"pgbench append: {fmt(pgbench['tps'])} tx/s{failed}"
    rows: list[Row] = []

    def lost_note(row: Row, wrk: dict[str, float], what: str = "") -> None:
        if lost(wrk):
            row.note = "; ".join(filter(None, [row.note, f"{lost(wrk):,} {what}answers not 2xx/201 or lost"]))
            row.met = False

    def floor_row(path: str, name: str, product: Row, measured: dict[str, float] | None, rate: str,
                  figure: Callable[[dict[str, float]], str]) -> Row:
        """The floor of ``product``'s row (issue 40): the same requests answered by the product's own
        statements on its own tables with none of its Python (bench/append_floor.py). No target of its
        own: its ratio to pgbench is the most any Python sending these statements reaches on this
        machine; the product's share of it is noted on ``product``'s row."""
        floor = results.get(name)
        row = Row(path, note=errors(name, "pgbench"), baseline=pgbench_tps)
        if floor:
            row.figure = figure(floor)
            lost_note(row, floor)
        if floor and pgbench:
            ratio = floor[rate] / pgbench["tps"]
            row.ratio = f"{ratio:.2f}"
            row.values.update(figure=floor[rate], baseline=pgbench["tps"], ratio=round(ratio, 3))
        if floor and measured:
            share = measured[rate] / floor[rate]
            product.note = "; ".join(filter(None, [product.note, f"{share:.2f} × the same statements alone"]))
            product.values["of_floor"] = round(share, 3)
        return row

    row = Row("`GET /healthz` of the product (the HTTP front on uvicorn's event loop, as `make run` serves it)",
              target="≥ 0.3", note=errors("healthz", "floor_asgi"))
    if healthz:
        row.figure = served(healthz)
    if limit:
        row.baseline = f"bare ASGI hello-world, same server: {served(limit)}"
    if healthz and limit:
        row.compare(healthz["rps"], limit["rps"], 0.3)
        lost_note(row, healthz)
        lost_note(row, limit, "baseline ")
    rows.append(row)

    # Informational: an agent's read of its task, answered by the HTTP front on the event loop.
    row = Row("an agent's read of a task over HTTP (read.lua)", note=errors("read"))
    if read:
        row.figure = served(read)
        lost_note(row, read)
    rows.append(row)

    # Informational: an agent's heartbeat, written by the HTTP front on the event loop.
    heartbeat = results.get("heartbeat")
    row = Row("an agent's heartbeat over HTTP (heartbeat.lua)", note=errors("heartbeat"))
    if heartbeat:
        row.figure = served(heartbeat)
        lost_note(row, heartbeat)
    rows.append(row)

    # Informational: an agent's claims and releases, written by the HTTP front on the event loop.
    claim = results.get("claim")
    row = Row("an agent's claims and releases over HTTP, one each in turn (claim_release.lua)", note=errors("claim"))
    if claim:
        row.figure = served(claim)
        lost_note(row, claim)
    rows.append(row)

    # Informational: an agent's tool calls, each dispatched and then answered, on the event loop.
    calls = results.get("tool_calls")
    row = Row("an agent's new tool calls and their answers over HTTP, one each in turn (tool_calls.lua)",
              note=errors("tool_calls"))
    if calls:
        row.figure = served(calls)
        lost_note(row, calls)
    rows.append(row)

    # A tool policy's cost to a dispatch (issue 43): against the same dispatch of a tool no policy covers.
    rounds = (results.get("gated_dispatch") or {}).get("rounds") or []
    gated = {way: both_rounds([r[way] for r in rounds if way in r]) for way in ("ungated", "let_through", "asked")}
    ungated = gated["ungated"]
    row = Row("an agent's new tool calls over HTTP, dispatches only, of a tool no policy covers (dispatch.lua)",
              note=errors("gated_dispatch"))
    if ungated:
        row.figure = served(ungated)
        lost_note(row, ungated)
    rows.append(row)
    for way, what in (("let_through", "a policy in force whose condition does not hold (made, 201)"),
                      ("asked", "a policy asking (the request and `ApprovalRequested` written, 202)")):
        row = Row(f"the same, {what}", target="≤ 1.5 (cost)", note=errors("gated_dispatch"),
                  baseline=served(ungated) if ungated else "not measured")
        measured = gated[way]
        if measured:
            row.figure = served(measured)
        if measured and ungated:
            # A cost: the ungated rate over this one (1.2 means 20 % more time per dispatch),
            # each round's own, then their mean.
            costs = [r["ungated"]["rps"] / r[way]["rps"] for r in rounds if "ungated" in r and way in r]
            cost = sum(costs) / len(costs)
            row.ratio, row.met = f"{cost:.2f}", cost <= 1.5
            row.values.update(figure=measured["rps"], baseline=ungated["rps"], ratio=round(cost, 3))
            lost_note(row, measured)
        rows.append(row)

    # Informational: what every route Django still serves pays before its own work.
    row = Row("minimal Django view under uvicorn + a2wsgi (the floor of Django's routes)",
              note=errors("floor_django"))
    if floor:
        row.figure = served(floor)
        lost_note(row, floor)
    rows.append(row)

    single = Row("single-event append over HTTP (append.lua)", target="≥ 0.3, p99 ≤ 50 ms",
                 note=errors("append", "pgbench"), baseline=pgbench_tps)
    if append:
        single.figure = served(append)
    if append and pgbench:
        single.compare(append["rps"], pgbench["tps"], 0.3)
        single.met = bool(single.met and append["p99_ms"] <= 50)
        lost_note(single, append)
    rows.append(single)

    rows.append(floor_row("the same appends, the product's statements alone (bench/append_floor.py: bare ASGI, "
                          "msgspec, the async pool)", "append_floor", single, append, "rps", served))
    row = Row("single-event append with one outbox message each (append_outbox.lua)", target="≥ 0.85",
              note=errors("append_outbox", "append"))
    if append_outbox:
        row.figure = served(append_outbox)
    if append:
        row.baseline = f"the same appends without one: {served(append)}"
    if append_outbox and append:
        row.compare(append_outbox["rps"], append["rps"], 0.85)
        lost_note(row, append_outbox)
    rows.append(row)

    for key, name, what in (("dbos", "DBOS", "10-step workflows"),
                            ("langgraph", "LangGraph", "10-node graphs, PostgresSaver")):
        peer = peers.get(key) or {}
        row = Row(f"single-event append over HTTP against {name}'s durable steps", target="≥ 2",
                  note=errors("append", "peers"), figure=single.figure)
        if peer.get("error"):
            row.note = "; ".join(filter(None, [row.note, f"{name}: {peer['error']}"]))
        if peer.get("steps_per_s"):
            durability = f", durability={peer['durability']}" if peer.get("durability") else ""
            row.baseline = (f"{name} {peer.get('version', '?')}: {fmt(float(peer['steps_per_s']))} steps/s "
                            f"({what}{durability}, {peer.get('workers', '?')} threads)")
            if append:
                row.compare(append["rps"], float(peer["steps_per_s"]), 2)
                lost_note(row, append)
        rows.append(row)

    row = Row("100-event batch over HTTP (batch.lua)", target="≥ 3", note=errors("batch", "pgbench"),
              baseline=pgbench_tps)
    if batch:
        row.figure = batch_figure(batch)
    if batch and pgbench:
        row.compare(batch["events_s"], pgbench["tps"], 3)
        lost_note(row, batch)
    rows.append(row)

    rows.append(floor_row("the same batches, the product's statements alone (bench/append_floor.py)",
                          "batch_floor", row, batch, "events_s", batch_figure))
    row = Row("in-process `event_append`, 1 thread (bench/append.py)", target="≥ 0.4", note=errors("append_py"))
    if inproc:
        row.figure = f"{fmt(inproc['event_append']['per_s'])} appends/s"
        row.baseline = f"raw psycopg lock + insert + update, 1 thread: {fmt(inproc['raw']['per_s'])} /s"
        row.compare(inproc["event_append"]["per_s"], inproc["raw"]["per_s"], 0.4)
    rows.append(row)

    # Informational (no target): how an inclusion proof's time grows with the sealed tree.
    if proof is not None or errors("proof"):
        row = Row("inclusion proof as the sealed tree grows (bench/proof.py)", note=errors("proof"))
        ratios = sorted(key for key in proof or {} if re.fullmatch(r"proof_ratio_\w+_\w+", key))
        if proof and ratios:
            key = "proof_ratio_1m_1k" if "proof_ratio_1m_1k" in ratios else ratios[0]
            big, small = key.removeprefix("proof_ratio_").split("_", 1)
            at_big, at_small = proof.get(f"inclusion_ms_{big}"), proof.get(f"inclusion_ms_{small}")
            row.figure = f"{fmt(at_big, 2)} ms at {big} leaves" if at_big is not None else key
            row.baseline = f"{fmt(at_small, 2)} ms at {small} leaves" if at_small is not None else "—"
            row.ratio = f"{float(proof[key]):.2f}"
        rows.append(row)
    return rows


# --- running things -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seconds(duration: float) -> int:
    """wrk and pgbench take whole seconds."""
    return max(1, round(duration))


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def say(text: str) -> None:
    print(text, flush=True)


def run(argv: list[str], *, timeout: float, env: dict[str, str] | None = None, log: Path | None = None,
        echo: bool = False, check: bool = True) -> str:
    """Run to its end, output (stdout and stderr) returned and saved to ``log``; a non-zero exit
    raises with the output's tail (unless not ``check``). On a time-out or an interruption here the child gets SIGINT
    first (bench/_support.py's clean-up removes its directory under var/), then SIGKILL."""
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except BaseException:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=CHILD_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    if log is not None:
        log.write_text(output)
    if echo:
        sys.stdout.write(output)
        sys.stdout.flush()
    if check and process.returncode != 0:
        tail = " | ".join(output.strip().splitlines()[-6:])
        raise RuntimeError(f"{Path(argv[0]).name} {' '.join(argv[1:3])} exited {process.returncode}: {tail}")
    return output


def wait_answering(url: str, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    """Until ``url`` answers 200; raises with the log's tail if ``process`` exits or READY_SECONDS pass."""
    import httpx

    def tail() -> str:
        try:
            return "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return ""

    deadline = time.monotonic() + READY_SECONDS
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}):\n{tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url} within {READY_SECONDS:.0f} s:\n{tail()}")
        time.sleep(0.5)


# The floors of GET /healthz: bench/baselines/minimal_django.py served as the launcher serves the
# product (uvicorn, no access log, no lifespan), the Django view behind a2wsgi's WSGIMiddleware
# with as many threads as backplane/asgi.py gives it (BACKPLANE_HTTP_THREADS, 16 by default).
FLOOR_SERVER = """
import sys
import uvicorn
from a2wsgi import WSGIMiddleware
baselines, app, port, threads = sys.argv[1:]
sys.path.insert(0, baselines)
import minimal_django
served = WSGIMiddleware(minimal_django.wsgi, workers=int(threads)) if app == "django" else minimal_django.hello
uvicorn.run(served, host="127.0.0.1", port=int(port), access_log=False, lifespan="off")
"""


@contextlib.contextmanager
def floor_server(app: str, *, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """minimal_django's Django view (``app="django"``), bare ASGI ``hello`` (``"asgi"``) or the
    product's append statements alone (``"append"``: bench/append_floor.py, on the database of
    ``env``'s ``DATABASE_URL``) under uvicorn on a port of its own until the block ends; yields its
    ``/healthz`` URL."""
    port = free_port()
    threads = os.environ.get("BACKPLANE_HTTP_THREADS", "16")
    if app == "append":
        argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(BENCH), "append_floor:app", "--host", "127.0.0.1",
                "--port", str(port), "--no-access-log", "--lifespan", "off"]
    else:
        argv = [sys.executable, "-c", FLOOR_SERVER, str(BASELINES), app, str(port), threads]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        wait_answering(url, process, log, f"the {app} floor")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=CHILD_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# The queue the product's relay declares, bound to every topic (docs/delivery.md, "Queues").
BENCH_QUEUE = "bench-downstream"


class Product:
    """The launcher on a fresh var directory, as ``make run`` starts it; ``stop()`` always stops
    it and its PostgreSQL and removes the directory (unless ``keep``)."""

    def __init__(self, *, log: Path, keep: bool) -> None:
        (ROOT / "var").mkdir(exist_ok=True)
        # Under the project's var/ as bench/_support.py does (file creation in /tmp was measured
        # 5x slower here, and the embedded broker makes a file per message), in a directory of its own.
        self.root = Path(tempfile.mkdtemp(prefix="bench-http-", dir=ROOT / "var"))
        self.var_dir = self.root / "var"
        self.port = free_port()
        self.keep = keep
        self.log_path = log
        self.env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "BACKPLANE_VAR_DIR"}}
        # The launcher's development layout with production's DEBUG off: DEBUG records every query
        # and has WhiteNoise look for changed files on every request.
        self.env.update(BACKPLANE_ENV="development", DEBUG="0", BACKPLANE_DEMO="0", BACKPLANE_RATE_LIMIT=RATE_LIMIT)
        # A queue bound to every topic, as a deployment with consumers has: without one each outbox
        # message is unroutable, retried on the relay's backoff and never delivered, and the tasks'
        # lifecycle messages share their key (the task id) with an agent's, which per-key order
        # holds behind them, so the outbox run would measure the retries, not a delivery.
        self.env["BACKPLANE_OUTBOX_QUEUES"] = f"{BENCH_QUEUE}=#"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgdata(self) -> Path:
        return self.var_dir / "pgdata"

    def start(self) -> None:
        log = self.log_path.open("wb")
        # A session of its own: a Ctrl-C in the terminal reaches us, and we stop it in order.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "backplane.runtime.launcher", "--port", str(self.port),
             "--var-dir", str(self.var_dir)],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_ready(self) -> None:
        assert self.process is not None
        wait_answering(f"{self.url}/readyz", self.process, self.log_path, "the launcher")

    def database_url(self) -> str:
        """The URL the launcher wrote: the embedded server's superuser on the product's database."""
        return (self.var_dir / "database_url").read_text().strip()

    def manage_env(self) -> dict[str, str]:
        return {**self.env, "DATABASE_URL": self.database_url(), "BACKPLANE_VAR_DIR": str(self.var_dir)}

    def stop(self) -> None:
        from backplane.runtime import embedded_db

        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        # The launcher stops its database; if it could not (killed), we do.
        if embedded_db.is_running(self.pgdata):
            embedded_db.stop(self.pgdata, mode="immediate")
        if self.keep:
            say(f"the product's var directory is kept: {self.var_dir}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def stops_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C does (the ``finally`` clauses run)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """While the product stops: a second Ctrl-C or SIGTERM must not leave its PostgreSQL running."""
    def ignore(signum: int, frame: object) -> None:
        say(f"{signal.Signals(signum).name}: still stopping the product and its PostgreSQL, please wait")

    previous = {sig: signal.signal(sig, ignore) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.raw = self.out / "raw"
        self.raw.mkdir(exist_ok=True)
        self.product = Product(log=self.raw / "product.log", keep=args.keep)
        self.results: dict[str, Any] = {}
        self.token = ""
        self.tasks: list[str] = []
        self.floor_tasks: list[str] = []  # append_floor.py's: its events are not on the product's chain
        self.leases: list[str] = []  # "task_id:lease_epoch", for heartbeat.lua
        self.loads: dict[str, list[float]] = {}

    # -- phases: each records its figures, or its error, and the run goes on --

    def phase(self, name: str, work: Callable[[], Any]) -> None:
        if self.args.phases and name not in self.args.phases:
            return
        say(f"-- {name} (load average {os.getloadavg()[0]:.1f})")
        started = time.monotonic()
        try:
            self.results[name] = work()
        except Exception as exc:  # noqa: BLE001 - a failed phase is reported in its row, and the run goes on
            self.results[f"{name}_error"] = f"failed: {exc}"[:400]
            say(f"   {name} failed: {exc}")
        self.loads[name] = [round(x, 2) for x in os.getloadavg()]
        say(f"   {time.monotonic() - started:.0f} s")

    def create_fixtures(self) -> None:
        import httpx

        done = run([sys.executable, "manage.py", "create_agent", "bench-http", "--namespace", "bench"],
                   env=self.product.manage_env(), timeout=180)
        self.token = done.strip().splitlines()[-1]
        with httpx.Client(base_url=self.product.url, timeout=30,
                          headers={"Authorization": f"Bearer {self.token}"}) as http:
            def created(kind: str) -> str:
                response = http.post("/api/v1/tasks/", json={"kind": kind, "input": {}})
                if response.status_code != 201:
                    raise RuntimeError(f"creating a task: {response.status_code} {response.text[:300]}")
                return str(response.json()["task_id"])

            self.tasks = [created("bench") for _ in range(self.args.tasks)]
            # Tasks of their own for heartbeat.lua, each under a lease (the others take appends
            # without one): long enough to outlive the run, kept alive by the heartbeats anyway.
            for _ in range(self.args.tasks):
                created("bench-beat")
            for _ in range(self.args.tasks):
                response = http.post("/api/v1/leases/", json={"kinds": ["bench-beat"], "lease_seconds": 3600})
                if response.status_code != 200:
                    raise RuntimeError(f"claiming a task: {response.status_code} {response.text[:300]}")
                self.leases.append(f"{response.json()['task']['task_id']}:{response.json()['lease_epoch']}")
            # And pending ones for claim_release.lua, which claims them and gives them back.
            for _ in range(self.args.tasks):
                created("bench-claim")
            self.floor_tasks = [created("bench-floor") for _ in range(self.args.tasks)]

    def wrk(self, script: str, duration: float, log_name: str, url: str = "",
            extra_env: dict[str, str] | None = None) -> dict[str, float]:
        """wrk with a script of bench/baselines/ (or of bench/, where the shared baselines have
        none: append_outbox.lua) against ``url`` (the product's root: the append scripts name
        their paths; healthz.lua requests the URL's own)."""
        env = {**os.environ, "BP_TOKEN": self.token, "TASKS": ",".join(self.tasks), "LEASES": ",".join(self.leases),
               **(extra_env or {})}
        output = run(["wrk", f"-t{self.args.threads}", f"-c{self.args.connections}", f"-d{seconds(duration)}s",
                      "--timeout", f"{self.args.wrk_timeout:g}s", "-s",
                      str(BASELINES / script if (BASELINES / script).exists() else BENCH / script),
                      url or self.product.url], env=env, timeout=duration + 120, log=self.raw / log_name)
        return parse_wrk(output)

    def gated_dispatch(self) -> dict[str, dict[str, float]]:
        """New tool calls dispatched over HTTP three ways, one after the other: a tool no policy
        covers; a tool whose policy (``amount > 1000``) lets this call through; the same policy
        asking (the request and ``ApprovalRequested`` written, 202)."""
        # A tool of each way's own: dispatch.lua's steps start again at each run, and the same
        # step of the same tool with another amount would be a 422, not a new call.
        stamp = uuid.uuid4().hex[:8]
        free, through, asked = (f"bench.pay-{way}-{stamp}" for way in ("free", "through", "asked"))
        run([sys.executable, "manage.py", "shell", "-c",
             "from recovery.approvals import tool_policy_set\n"
             f"for tool in ({through!r}, {asked!r}):\n"
             "    tool_policy_set(tool=tool, condition='amount > 1000', field_types={'amount': 'number'}, "
             "approver_group='Approvers', set_by='bench', reason='bench: gated dispatches over HTTP')"],
            env=self.product.manage_env(), timeout=180)
        ways = {"ungated": (free, "10", "201"), "let_through": (through, "10", "201"), "asked": (asked, "5000", "202")}
        # Two rounds, the second in the reverse order, so the machine's drift and the tables'
        # growth fall on every way alike; each round's steps start where the last one's ended.
        rounds: list[dict[str, dict[str, float]]] = [{}, {}]
        for number, order in enumerate((list(ways), list(reversed(ways)))):
            for way in order:
                tool, amount, expect = ways[way]
                rounds[number][way] = self.wrk(
                    "dispatch.lua", self.args.duration / 2, f"wrk-dispatch-{way}-{number + 1}.txt",
                    extra_env={"TOOL": tool, "AMOUNT": amount, "EXPECT": expect, "FIRST_STEP": str(number * 10**7)})
        return {"rounds": rounds}

    def floor(self, app: str) -> dict[str, float]:
        """``GET /healthz`` of a floor of minimal_django.py, served alone beside the product, then stopped."""
        with floor_server(app, log=self.raw / f"floor-{app}.log") as url:
            if self.args.warmup > 0:
                self.wrk("healthz.lua", self.args.warmup, f"wrk-floor-{app}-warmup.txt", url)
            return self.wrk("healthz.lua", self.args.duration, f"wrk-floor-{app}.txt", url)

    def append_floor(self, script: str) -> dict[str, float]:
        """``script`` (append.lua or batch.lua) against bench/append_floor.py (the product's append
        statements with none of its Python), served alone beside the product on its database, on
        tasks of its own."""
        name = Path(script).stem
        with floor_server("append", log=self.raw / f"floor-{name}.log", env=self.product.manage_env()) as url:
            root = url.removesuffix("/healthz")
            tasks = {"TASKS": ",".join(self.floor_tasks)}
            if self.args.warmup > 0:
                self.wrk(script, self.args.warmup, f"wrk-{name}-floor-warmup.txt", root, tasks)
            return self.wrk(script, self.args.duration, f"wrk-{name}-floor.txt", root, tasks)

    def scratch_database(self, name: str) -> str:
        """A new database on the product's server; its URL (the server's superuser)."""
        import psycopg

        admin = with_database(self.product.database_url(), "postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return with_database(admin, name)

    def pgbench(self) -> dict[str, float]:
        database = "bp_bench_pgbench"
        self.scratch_database(database)
        sockdir, port = postmaster_socket(self.product.pgdata)
        conn = ["-h", sockdir, "-p", str(port), "-U", "postgres"]
        run(["psql", *conn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(BASELINES / "pgbench_schema.sql"),
             database], timeout=600, log=self.raw / "pgbench-schema.txt")
        output = run(["pgbench", *conn, "-n", "-c", str(self.args.connections), "-j", str(self.args.threads),
                      "-T", str(seconds(self.args.duration)), "-f", str(BASELINES / "pgbench_append.sql"),
                      database], timeout=self.args.duration + 300, log=self.raw / "pgbench.txt")
        return parse_pgbench(output)

    def python_script(self, name: str, args: list[str], database: str, *, echo: bool = False,
                      timeout: float = 1800) -> dict[str, Any]:
        """bench/<name> on a scratch database of the product's server, with ``--json``."""
        env = {k: v for k, v in os.environ.items() if k not in {"BACKPLANE_VAR_DIR", "BACKPLANE_ENV"}}
        env["DATABASE_URL"] = self.scratch_database(database)
        result = self.raw / f"{Path(name).stem}.json"
        result.unlink(missing_ok=True)
        output = run([sys.executable, str(BENCH / name), *args, "--json", str(result)], env=env, timeout=timeout,
                     log=self.raw / f"{Path(name).stem}.txt", echo=echo)
        figures: dict[str, Any] = json.loads(result.read_text()) if result.exists() else {}
        for line in output.splitlines():  # a "name=value" contract line (proof.py's) wins over the file
            for key, value in parse_pairs(line).items():
                if key.startswith("proof_"):
                    figures[key] = value
        return figures

    def proof(self) -> dict[str, Any] | None:
        if not (BENCH / "proof.py").exists():
            return None
        args = ["--sizes", self.args.proof_sizes] if self.args.proof_sizes else []
        args += ["--proofs", str(self.args.proof_proofs)] if self.args.proof_proofs else []
        figures = self.python_script("proof.py", args, "bp_bench_proof", timeout=self.args.proof_timeout)
        if not any(key.startswith("proof_ratio_") for key in figures):
            raise RuntimeError("bench/proof.py printed no proof_ratio_1m_1k=<x> line")
        return {k: v for k, v in figures.items() if isinstance(v, int | float)}

    def peers(self) -> dict[str, Any]:
        python = self.args.peers_python
        check = subprocess.run([python, "-c", "import dbos, langgraph.checkpoint.postgres"], capture_output=True,
                               text=True, timeout=120)
        if check.returncode != 0:
            raise RuntimeError(f"{python} lacks requirements-bench.txt (make bench installs it into .venv/bench)")
        admin = with_database(self.product.database_url(), "postgres")
        result = self.raw / "peers.json"
        result.unlink(missing_ok=True)
        argv = [python, str(BENCH / "peers.py"), "--database-url", admin, "--duration", f"{self.args.duration:g}",
                "--workers", str(self.args.peer_workers), "--langgraph-durability", self.args.langgraph_durability,
                "--json", str(result)]
        # A peer that fails is reported in its row (peers.py writes the JSON and exits 1).
        output = run(argv, timeout=2 * self.args.duration + 900, log=self.raw / "peers.txt", check=False)
        if not result.exists():
            raise RuntimeError(f"peers.py wrote no figures: {' | '.join(output.splitlines()[-6:])}")
        return dict(json.loads(result.read_text()))

    # -- the whole run --

    def run(self) -> int:
        started_at = datetime.now(UTC)
        load_before = [round(x, 2) for x in os.getloadavg()]
        try:
            with stops_on_signals():
                try:
                    say(f"starting the product (launcher, port {self.product.port}, var {self.product.var_dir})")
                    self.product.start()
                    self.product.wait_ready()
                    say(f"ready; creating an agent token and {self.args.tasks} tasks")
                    self.create_fixtures()
                    self.measure()
                except Exception as exc:  # noqa: BLE001 - reported; the product is stopped below
                    say(f"the product could not be started or prepared: {exc}")
                    return 2
                finally:
                    say("stopping the product and its PostgreSQL")
                    with shielded():
                        self.product.stop()
        except KeyboardInterrupt as exc:
            say(f"interrupted ({str(exc) or 'SIGINT'}); the product is stopped, no summary written")
            return 130
        return self.report(started_at, load_before)

    def measure(self) -> None:
        args = self.args
        if args.warmup > 0:  # the web process's first requests, and wrk's connections
            self.phase("warmup", lambda: self.wrk("append.lua", args.warmup, "wrk-warmup.txt"))
        self.phase("healthz", lambda: self.wrk("healthz.lua", args.duration, "wrk-healthz.txt",
                                               f"{self.product.url}/healthz"))
        self.phase("read", lambda: self.wrk("read.lua", args.duration, "wrk-read.txt"))
        self.phase("heartbeat", lambda: self.wrk("heartbeat.lua", args.duration, "wrk-heartbeat.txt"))
        self.phase("claim", lambda: self.wrk("claim_release.lua", args.duration, "wrk-claim.txt"))
        self.phase("tool_calls", lambda: self.wrk("tool_calls.lua", args.duration, "wrk-tool-calls.txt"))
        self.phase("gated_dispatch", self.gated_dispatch)
        self.phase("floor_django", lambda: self.floor("django"))
        self.phase("floor_asgi", lambda: self.floor("asgi"))
        self.phase("append", lambda: self.wrk("append.lua", args.duration, "wrk-append.txt"))
        self.phase("append_floor", lambda: self.append_floor("append.lua"))
        self.phase("batch", lambda: self.wrk("batch.lua", args.duration, "wrk-batch.txt"))
        self.phase("batch_floor", lambda: self.append_floor("batch.lua"))
        self.phase("pgbench", self.pgbench)
        # The tracing off/on rounds are bench/append.py's own report (docs/observability.md), not a row here.
        self.phase("append_py", lambda: self.python_script(
            "append.py", ["--events", str(args.append_events), "--tracing-rounds", "0"], "bp_bench_append",
            echo=True))
        self.phase("proof", self.proof)
        if args.skip_peers:
            self.results["peers_error"] = "skipped (--skip-peers)"
        else:
            self.phase("peers", self.peers)
        # Last: the relay publishes its messages for a while after the load stops, and would take
        # CPU from whatever ran next.
        self.phase("append_outbox", lambda: self.wrk("append_outbox.lua", args.duration, "wrk-append-outbox.txt"))

    def report(self, started_at: datetime, load_before: list[float]) -> int:
        rows = build_rows(self.results)
        args = self.args
        header = [
            f"# Benchmarks side by side ({started_at:%Y-%m-%d %H:%M} UTC)",
            "",
            f"`bench/http_bench.py --seconds {args.duration:g} --tasks {args.tasks} --peer-workers "
            f"{args.peer_workers}` on {os.cpu_count()} CPUs, Python {platform.python_version()}; "
            f"wrk -t{args.threads} -c{args.connections} -d{seconds(args.duration)}s (the floors too, each served "
            f"alone), pgbench -c {args.connections} -j {args.threads} -T {seconds(args.duration)}; the product as "
            f"`make run` starts it, its embedded PostgreSQL serving every database. "
            f"Load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}.",
        ]
        table = markdown(rows, header)
        say("")
        say(table)
        (self.out / "summary.md").write_text(table)
        (self.out / "summary.json").write_text(json.dumps({
            "started_at": started_at.isoformat(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "load_average_before": load_before, "load_average_after_phase": self.loads,
            "rows": [{**asdict(row), "verdict": row.verdict} for row in rows],
            "results": self.results,
        }, indent=2, default=str) + "\n")
        say(f"written: {self.out / 'summary.md'}, {self.out / 'summary.json'} (raw outputs in {self.raw})")
        failed = [name.removesuffix("_error") for name in self.results
                  if name.endswith("_error") and not (name == "peers_error" and args.skip_peers)]
        failed += [key for key, peer in (self.results.get("peers") or {}).items()
                   if isinstance(peer, dict) and peer.get("error")]
        if failed:
            say(f"measurements that failed: {', '.join(failed)}")
            return 1
        if args.strict and any(row.met is False for row in rows):
            return 1
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", "--duration", dest="duration", type=float, default=15.0,
                        help="seconds of each wrk run, of pgbench and of each peer (default 15)")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of load before measuring: appends on the product, GET /healthz on each floor "
                             "(0: none)")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections and pgbench clients")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads and pgbench jobs")
    parser.add_argument("--wrk-timeout", type=float, default=30.0,
                        help="wrk's per-request timeout (its default of 2 s drops slow answers from the latency)")
    parser.add_argument("--tasks", type=int, default=300, help="tasks the wrk scripts append to")
    parser.add_argument("--append-events", type=int, default=3000, help="bench/append.py --events")
    parser.add_argument("--proof-timeout", type=float, default=1800.0, help="seconds bench/proof.py may take")
    parser.add_argument("--proof-sizes", help="bench/proof.py --sizes (its default: 1,000 to 1,000,000 leaves)")
    parser.add_argument("--proof-proofs", type=int, help="bench/proof.py --proofs")
    parser.add_argument("--peers-python", default=str(BENCH_VENV_PYTHON if BENCH_VENV_PYTHON.exists()
                                                      else sys.executable),
                        help="a Python with requirements-bench.txt (default: .venv/bench's if present)")
    parser.add_argument("--peer-workers", type=int, default=8, help="bench/peers.py --workers (default 8)")
    parser.add_argument("--skip-peers", action="store_true", help="leave the DBOS and LangGraph rows unmeasured")
    parser.add_argument("--langgraph-durability", choices=("sync", "async", "exit"), default="sync",
                        help="bench/peers.py's LangGraph durability mode (sync: each step's checkpoint is written "
                             "before the next step starts)")
    parser.add_argument("--out", default=str(ROOT / "var" / "bench"), help="where summary.md/.json go")
    parser.add_argument("--keep", action="store_true", help="keep the product's var directory (its database)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is not met")
    parser.add_argument("--phases", type=lambda text: set(text.split(",")), default=set(),
                        help="comma-separated phases to run, the others left unmeasured (default: all), e.g. "
                             "append,append_floor,pgbench")
    args = parser.parse_args()
    missing = [tool for tool in ("wrk", "pgbench", "psql") if shutil.which(tool) is None]
    if missing:
        parser.error(f"{', '.join(missing)} not found: `make wrk` installs wrk; pgbench and psql come with "
                     "PostgreSQL's client tools")
    sys.path.insert(0, str(ROOT))
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
