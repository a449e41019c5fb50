"""bench/front_cpu.py, run at a tiny size, so the split of the web process's CPU per append that
docs/benchmarks.md gives (issue 40) keeps coming from a bench that runs: every layer appends and
is answered 201, and each figure is printed, the agent route's above the bare round trips'."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_the_front_cpu_bench_measures_every_layer() -> None:
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}  # its own server
    done = subprocess.run(
        [sys.executable, "bench/front_cpu.py", "--appends", "64", "--tasks", "4", "--rounds", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = {name.strip(): float(ms) for name, ms in
               re.findall(r"^  (round trips|write path \+ answer|write path|agent route)\s+([\d.]+) ms", done.stdout,
                          re.MULTILINE)}
    assert set(figures) == {"round trips", "write path", "write path + answer", "agent route"}, done.stdout
    assert 0 < figures["round trips"] < figures["agent route"], figures
