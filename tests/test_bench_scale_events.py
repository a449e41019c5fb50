"""bench/scale_events.py, run at a tiny size as `make bench-scale-events` runs it at 10⁸ events, so
that the bench docs/benchmarks.md's scale figures come from keeps working as the schema moves on:
both layouts migrate and load (a new NOT NULL column of the task or event table breaks its SQL
here, not on the day of a long run), the probes' chains verify under the product's own verifier,
the search's plain statements agree, and every figure and target row is in the summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
FIGURES = {
    "append", "claim", "task page (100 events)", "task page, seq 500 of 1,000", "task list, API (50, oldest first)",
    "task list, dashboard (50, newest first)", "task list, dashboard ?q= a customer one task holds",
    "task list, dashboard ?q= a tool most tasks called", "recovery context, 1,000 events",
    "recovery context, 1,000 events: its parts", "verify, 1,000 events",
    "inclusion proof", "overview tiles",
}


def test_the_scale_bench_loads_and_measures_both_layouts_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}  # its own server
    done = subprocess.run(
        [sys.executable, "bench/scale_events.py", "--events", "30000", "--tasks", "300", "--base-events", "10000",
         "--base-tasks", "100", "--runs", "3", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    cases = json.loads((out / "summary.json").read_text())
    assert [(case["layout"], case["target_events"], case["relkind"]) for case in cases] == [
        ("unpartitioned", 10000, "r"), ("unpartitioned", 30000, "r"),
        ("partitioned", 10000, "p"), ("partitioned", 30000, "p"),
    ]
    for case in cases:
        # The generator makes about events / tasks per task, and the probe of 1,000 comes on top.
        assert 0.8 * case["target_events"] <= case["events"] - 1000 <= 1.2 * case["target_events"], case
        assert case["chunks_loaded"] == case["chunks"]
        assert {result["name"] for result in case["results"]} == FIGURES
        timed = [result for result in case["results"] if "p50_ms" in result]
        assert len(timed) == len(FIGURES) - 1
        assert all(result["p50_ms"] > 0 and result["floor_p50_ms"] > 0 for result in timed)
        parts = next(result for result in case["results"] if "history_ms" in result)
        assert 0 < parts["history_ms"] < parts["profiled_ms"] and parts["prompt_ms"] > 0 and parts["json_bytes"] > 10**5
        assert case["leaves"] == 1000

    summary = (out / "summary.md").read_text()
    for layout in ("unpartitioned", "partitioned"):
        for target in ("append p50 at 3", "append p99 at 3", "claim p50 at 3", "overview tiles / plain SQL",
                       "task list, dashboard ?q= a customer one task holds / plain SQL"):
            assert f"| {layout} | {target}" in summary, (layout, target)
