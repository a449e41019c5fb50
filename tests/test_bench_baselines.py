"""bench/baselines/ holds copies of shared/bench/'s wrk and pgbench scripts and its minimal Django
floor (CI clones only this repository); bench/http_bench.py reads what they print. The copies must stay identical to the
originals where those are present, and the parser must read what the scripts write."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
BASELINES = REPO / "bench" / "baselines"
SHARED = REPO.parent / "shared" / "bench"
COPIED = ("*.lua", "*.sql", "*.py")


def load_http_bench() -> ModuleType:
    # Loaded from its path: bench/ is a folder of scripts, not a package.
    spec = importlib.util.spec_from_file_location("bench_http_bench", REPO / "bench" / "http_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def http_bench() -> ModuleType:
    return load_http_bench()


def copied_files(folder: Path) -> list[str]:
    return sorted(path.name for pattern in COPIED for path in folder.glob(pattern))


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared/bench is not beside this repository (CI clones only the repo)")
def test_the_copies_are_identical_to_shared_bench() -> None:
    assert copied_files(SHARED), f"no .lua, .sql or .py files in {SHARED}"
    assert copied_files(BASELINES) == copied_files(SHARED)
    for name in copied_files(SHARED):
        assert (BASELINES / name).read_bytes() == (SHARED / name).read_bytes(), f"bench/baselines/{name} differs"


def test_the_scripts_http_bench_runs_are_there() -> None:
    for name in ("healthz.lua", "append.lua", "batch.lua", "pgbench_schema.sql", "pgbench_append.sql",
                 "minimal_django.py"):
        assert (BASELINES / name).is_file(), name


def done_line(script: str, values: list[float]) -> str:
    """What the script's ``done()`` writes, rendered from its own ``string.format`` pattern (Lua's
    %d and %.Nf are C's, as Python's ``%`` operator has them)."""
    source = (BASELINES / script if (BASELINES / script).exists() else BASELINES.parent / script).read_text()
    match = re.search(r'string\.format\("((?:[^"\\]|\\.)*)"', source)
    assert match, f"{script} writes no string.format line"
    pattern = match.group(1).replace("\\n", "\n")
    specs = re.findall(r"%[-+ #0]*\d*(?:\.\d+)?[dfs]", pattern)
    assert len(specs) == len(values), f"{script}: {specs}"
    return pattern % tuple(int(v) if spec.endswith("d") else v for spec, v in zip(specs, values, strict=True))


WRK_HEADER = """Running 15s test @ http://127.0.0.1:8000
  2 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    12.31ms    4.02ms  80.11ms   90.12%
    Req/Sec   650.10     40.00   700.00     70.00%
  19512 requests in 15.02s, 5.12MB read
  Socket errors: connect 0, read 1, write 0, timeout 2
  Non-2xx or 3xx responses: 3
Requests/sec:   1299.07
Transfer/sec:    348.99KB
"""


def test_the_healthz_script_output_parses(http_bench: ModuleType) -> None:
    figures = http_bench.parse_wrk(WRK_HEADER + done_line("healthz.lua", [1.25, 9.5, 1299.07]))
    assert figures["p50_ms"] == pytest.approx(1.2, abs=0.051)
    assert figures["p99_ms"] == 9.5
    assert figures["rps"] == 1299
    assert figures["requests"] == 19512
    assert figures["socket_errors"] == 3
    assert figures["non_2xx"] == 3


def test_the_append_script_output_parses(http_bench: ModuleType) -> None:
    figures = http_bench.parse_wrk(WRK_HEADER + done_line("append.lua", [20.04, 48.96, 812.4, 7]))
    assert figures == {**figures, "p50_ms": 20.0, "p99_ms": 49.0, "rps": 812, "non201": 7}


def test_the_batch_script_output_parses(http_bench: ModuleType) -> None:
    figures = http_bench.parse_wrk(WRK_HEADER + done_line("batch.lua", [300.0, 612.34, 52.6, 5260.0, 0]))
    assert figures == {**figures, "p50_ms": 300.0, "p99_ms": 612.3, "req_s": 53, "events_s": 5260, "non201": 0}


def test_nan_and_a_missing_line_are_told_apart(http_bench: ModuleType) -> None:
    # wrk with no completed request: Lua prints nan (or -nan) for the percentiles.
    figures = http_bench.parse_wrk("healthz p50_ms=-nan p99_ms=nan rps=0\n")
    assert math.isnan(figures["p50_ms"]) and math.isnan(figures["p99_ms"]) and figures["rps"] == 0
    with pytest.raises(ValueError, match="p99_ms"):
        http_bench.parse_wrk("unable to connect to 127.0.0.1:8000 Connection refused\n")


PGBENCH_OUTPUT = """pgbench (15.18 (Debian 15.18-0+deb12u1), server 18.6)
transaction type: bench/baselines/pgbench_append.sql
scaling factor: 1
query mode: simple
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 15 s
number of transactions actually processed: 31140
number of failed transactions: 0 (0.000%)
latency average = 7.702 ms
initial connection time = 21.403 ms
tps = 2077.402914 (without initial connection time)
"""


def test_pgbench_output_parses(http_bench: ModuleType) -> None:
    figures = http_bench.parse_pgbench(PGBENCH_OUTPUT)
    assert figures == {"tps": 2077.402914, "latency_avg_ms": 7.702, "transactions": 31140, "failed": 0}
    with pytest.raises(ValueError, match="tps"):
        http_bench.parse_pgbench("pgbench: error: connection to server failed\n")


def test_postmaster_pid_gives_the_socket_directory_and_port(http_bench: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "postmaster.pid").write_text(f"4242\n{tmp_path}\n1764528000\n54321\n/tmp/sockets\n*\n  1 2\nready\n")
    assert http_bench.postmaster_socket(tmp_path) == ("/tmp/sockets", 54321)


def test_the_table_divides_each_figure_by_its_baseline(http_bench: ModuleType) -> None:
    results = {
        "healthz": http_bench.parse_wrk(done_line("healthz.lua", [1.0, 5.0, 900.0])),
        "floor_django": http_bench.parse_wrk(done_line("healthz.lua", [1.0, 4.0, 1000.0])),
        "floor_asgi": http_bench.parse_wrk(done_line("healthz.lua", [0.5, 2.0, 3000.0])),
        "append": http_bench.parse_wrk(done_line("append.lua", [10.0, 40.0, 600.0, 0])),
        "append_outbox": http_bench.parse_wrk(done_line("append_outbox.lua", [10.0, 40.0, 540.0, 0])),
        "read": http_bench.parse_wrk(done_line("read.lua", [5.0, 20.0, 1700.0, 0])),
        "heartbeat": http_bench.parse_wrk(done_line("heartbeat.lua", [5.0, 25.0, 800.0, 0])),
        "claim": http_bench.parse_wrk(done_line("claim_release.lua", [6.0, 30.0, 650.0, 2])),
        "tool_calls": http_bench.parse_wrk(done_line("tool_calls.lua", [6.0, 30.0, 700.0, 0])),
        "gated_dispatch": {"rounds": [
            {"ungated": http_bench.parse_wrk(done_line("dispatch.lua", [5.0, 20.0, 600.0, 0])),
             "let_through": http_bench.parse_wrk(done_line("dispatch.lua", [5.0, 22.0, 500.0, 0])),
             "asked": http_bench.parse_wrk(done_line("dispatch.lua", [8.0, 40.0, 300.0, 1]))},
            {"ungated": http_bench.parse_wrk(done_line("dispatch.lua", [5.0, 30.0, 400.0, 0])),
             "let_through": http_bench.parse_wrk(done_line("dispatch.lua", [5.0, 22.0, 400.0, 0])),
             "asked": http_bench.parse_wrk(done_line("dispatch.lua", [8.0, 40.0, 200.0, 0]))}]},
        "batch": http_bench.parse_wrk(done_line("batch.lua", [200.0, 400.0, 40.0, 4000.0, 0])),
        "append_floor": http_bench.parse_wrk(done_line("append.lua", [5.0, 20.0, 1000.0, 0])),
        "batch_floor": http_bench.parse_wrk(done_line("batch.lua", [100.0, 200.0, 80.0, 8000.0, 0])),
        "pgbench": {"tps": 2000.0},
        "append_py": {"raw": {"per_s": 1200.0}, "event_append": {"per_s": 300.0}},
        "peers": {"dbos": {"steps_per_s": 250.0, "version": "3.4.0", "workers": 8},
                  "langgraph": {"error": "exit 1: ImportError"}},
    }
    rows = {row.path.split(" (")[0]: row for row in http_bench.build_rows(results)}
    assert len(rows) == 17  # no proof row: bench/proof.py gave no figures and no error
    healthz = rows["`GET /healthz` of the product"]
    assert (healthz.ratio, healthz.met) == ("0.30", True)
    assert "3,000 req/s" in healthz.baseline
    django = rows["minimal Django view under uvicorn + a2wsgi"]
    assert "1,000 req/s" in django.figure and django.verdict == "—"
    single = rows["single-event append over HTTP"]
    assert (single.ratio, single.met) == ("0.30", True)
    assert single.baseline == "pgbench append: 2,000 tx/s"
    # The floors: the product's statements alone, against pgbench (no target), and the product against them.
    assert "0.60 × the same statements alone" in single.note
    append_floor = rows["the same appends, the product's statements alone"]
    assert (append_floor.ratio, append_floor.met, append_floor.verdict) == ("0.50", None, "—")
    batch_floor = rows["the same batches, the product's statements alone"]
    assert batch_floor.ratio == "4.00" and batch_floor.figure.startswith("8,000 events/s")
    outbox = rows["single-event append with one outbox message each"]
    assert (outbox.ratio, outbox.met) == ("0.90", True) and "600 req/s" in outbox.baseline
    dbos = rows["single-event append over HTTP against DBOS's durable steps"]
    assert (dbos.ratio, dbos.met) == ("2.40", True) and "8 threads" in dbos.baseline
    langgraph = rows["single-event append over HTTP against LangGraph's durable steps"]
    assert langgraph.met is None and langgraph.verdict == "not measured" and "ImportError" in langgraph.note
    batch = rows["100-event batch over HTTP"]
    assert (batch.ratio, batch.met) == ("2.00", False) and "0.50 × the same statements alone" in batch.note
    inproc = rows["in-process `event_append`, 1 thread"]
    assert (inproc.ratio, inproc.met) == ("0.25", False)
    table = http_bench.markdown(list(rows.values()), ["# title"])
    assert rows["an agent's read of a task over HTTP"].figure.startswith("1,700 req/s")
    assert rows["an agent's heartbeat over HTTP"].figure.startswith("800 req/s")
    claims = rows["an agent's claims and releases over HTTP, one each in turn"]
    assert claims.figure.startswith("650 req/s") and "2 answers" in claims.note
    assert rows["an agent's new tool calls and their answers over HTTP, one each in turn"].figure.startswith("700")
    through = rows["the same, a policy in force whose condition does not hold"]
    # Each round's cost, then their mean: (600/500 + 400/400) / 2; the baseline is the mean rate.
    assert (through.ratio, through.met) == ("1.10", True) and "500 req/s, p99 30.0" in through.baseline
    asked = rows["the same, a policy asking"]
    assert (asked.ratio, asked.met) == ("2.00", False) and "1 answers" in asked.note
    assert table.count("\n|") == 19 and "**not met**" in table


def test_lost_answers_and_a_slow_p99_fail_the_append_target(http_bench: ModuleType) -> None:
    results = {"append": http_bench.parse_wrk(done_line("append.lua", [10.0, 40.0, 900.0, 3])),
               "pgbench": {"tps": 2000.0}}
    single = next(row for row in http_bench.build_rows(results) if row.path.startswith("single-event append"))
    assert single.met is False and "3 answers" in single.note
    results["append"] = http_bench.parse_wrk(done_line("append.lua", [10.0, 60.0, 900.0, 0]))
    single = next(row for row in http_bench.build_rows(results) if row.path.startswith("single-event append"))
    assert (single.ratio, single.met, single.note) == ("0.45", False, "")


def test_the_proof_row_reads_bench_proof_py_figures(http_bench: ModuleType) -> None:
    # bench/proof.py's contract: a line proof_ratio_1m_1k=<x>, and its --json file's figures.
    line = http_bench.parse_pairs("proof_ratio_1m_1k=1.500")
    proof = {**line, "inclusion_ms_1m": 3.0, "inclusion_ms_1k": 2.0, "consistency_ratio_1m_1k": 1.2}
    row = next(row for row in http_bench.build_rows({"proof": proof}) if row.path.startswith("inclusion proof"))
    assert (row.figure, row.baseline, row.ratio) == ("3.00 ms at 1m leaves", "2.00 ms at 1k leaves", "1.50")
    assert row.met is None and row.verdict == "—"  # informational: no target
    smaller = http_bench.build_rows({"proof": {"proof_ratio_10k_1k": 3.0}})
    row = next(row for row in smaller if row.path.startswith("inclusion proof"))
    assert (row.figure, row.ratio) == ("proof_ratio_10k_1k", "3.00")
