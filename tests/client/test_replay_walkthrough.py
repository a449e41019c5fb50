"""docs/replay.md's walk-through with curl, run as written against the live server: every ```bash
block of its "Walk-through with curl" section, in order, in one shell."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from backplane.eventlog import services
from backplane.eventlog.models import Task
from tests.client.conftest import Fleet
from tests.support.live_server import WebProcess

REPLAY_DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"


def walkthrough_blocks() -> list[str]:
    section = REPLAY_DOC.read_text().split("## Walk-through with curl", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_walkthrough_forks_finishes_replays_and_diffs(sdk_server: WebProcess, fleet: Fleet) -> None:
    blocks = walkthrough_blocks()
    assert len(blocks) == 3
    token = services.agent_create(name="curl-agent", namespace=fleet.namespace, kinds=["outreach"]).token
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + "\n".join(blocks)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin:/usr/local/bin", "BP": sdk_server.url,
                                            "TOKEN": token})
    assert done.returncode == 0, done.stdout + done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    in_flight, replayed, refused, diff = answers
    assert (in_flight["status"], in_flight["replayed"]) == ("in_flight", True)
    assert (replayed["status"], replayed["result"], replayed["replayed"]) == ("succeeded", {"message_id": "m-1"}, True)
    assert replayed["effect_key"] == in_flight["effect_key"]
    assert refused["error"]["code"] == "sandbox_refused"
    first = diff["first_divergence"]
    assert (first["kind"], first["path"], first["a_value"], first["b_value"]) == (
        "changed", "$.payload.decision", "send the quote", "call on Monday")
    assert diff["counts"]["only_in_a"] == 0, diff  # claims are lease bookkeeping, left out
    source, fork, sandbox = Task.objects.filter(namespace=fleet.namespace).order_by("created_at")
    assert (source.status, fork.status, sandbox.status) == ("failed", "completed", "completed")
    assert fork.forked_from_id == source.pk and sandbox.forked_from_id == fork.pk and sandbox.sandbox
