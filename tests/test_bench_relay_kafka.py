"""bench/relay_kafka.py, run at a tiny size, so the figures docs/benchmarks.md gives for the relay
to Kafka (and the bounds that say why its rate target is out of reach on these machines) keep
coming from a bench that runs: every phase delivers every message, the lag phase loses nothing
and keeps each key's order, and every line the section quotes is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.kafka import kafka_missing_reason

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def test_the_relay_to_kafka_bench_runs_every_phase_and_prints_its_bounds() -> None:
    if reason := kafka_missing_reason():
        pytest.fail(reason)
    env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}  # its own server
    done = subprocess.run(
        [sys.executable, "bench/relay_kafka.py", "--messages", "600", "--keys", "30", "--seconds", "2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout

    assert "(topic holds 600 of 600)" in out, out
    rates = {
        name: float(found.group(1))
        for name, pattern in [
            ("raw", r"raw confluent-kafka producer .*?:\s+(\d+) msgs/s"),
            ("relay", r"relay, outbox_relay_until_idle:\s+(\d+) msgs/s"),
            ("lanes", r"relay lanes \(LaneRunner, \d+ broker lanes\):\s+(\d+) msgs/s"),
            ("plain", r"the relay's claim and mark with plain publishes between them (\d+) msgs/s"),
            ("plain lanes", r"in \d+ lanes (\d+) \("),
            ("rounds", r"the raw producer in rounds of one message per key (\d+) msgs/s"),
        ]
        if (found := re.search(pattern, out))
    }
    assert set(rates) == {"raw", "relay", "lanes", "plain", "plain lanes", "rounds"}, out
    assert all(rate > 0 for rate in rates.values()), rates
    lag = re.search(r"sent (\d+), received (\d+), duplicates (\d+), per-key order inversions (\d+)", out)
    assert lag is not None, out
    sent, received, duplicates, inversions = (int(n) for n in lag.groups())
    assert sent > 0 and received == sent and inversions == 0, out
    assert "NOT all received" not in out, out
