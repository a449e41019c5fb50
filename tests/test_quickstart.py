"""docs/quickstart.md, run as written on a fresh clone: `make run`, then every other ```bash block
in order in one shell, as a new user would type them in a second terminal.

The clone shares this checkout's `.venv` (a symlink) so the test does not download the
requirements again; `make run` still runs its install step against it. The only thing the test
sets is `BACKPLANE_PORT` (a free port), which the quick start's commands honour.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.support.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "docs" / "quickstart.md"
pytestmark = pytest.mark.slow


def bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)]


def test_the_quick_start_has_a_server_block_and_commands() -> None:
    blocks = bash_blocks(QUICKSTART.read_text())
    assert blocks[0] == "make run"
    assert len(blocks) >= 4


def test_a_new_user_completes_a_task_by_following_the_quick_start(tmp_path: Path) -> None:
    clone = tmp_path / "agent-backplane"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    blocks = bash_blocks((clone / "docs" / "quickstart.md").read_text())
    server_block, commands = blocks[0], blocks[1:]

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BACKPLANE_", "DJANGO_")) and k not in {"DATABASE_URL", "SECRET_KEY"}}
    env["BACKPLANE_PORT"] = str(free_port())
    output: list[str] = []
    server = subprocess.Popen(["bash", "-c", server_block], cwd=clone, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def read() -> None:
        assert server.stdout is not None
        for line in server.stdout:
            output.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not any(line.startswith("Login: ") for line in output) or not any(
                "is up at" in line for line in output):
            assert server.poll() is None, "make run exited:\n" + "".join(output[-80:])
            assert time.monotonic() < deadline, "make run never printed its login:\n" + "".join(output[-80:])
            time.sleep(0.5)

        done = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n\n".join(commands)], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        lines = done.stdout.splitlines()
        assert "completed {'greeting': 'Hello, Ada'}" in lines, done.stdout
        assert "completed {'greeting': 'Hello, Grace'}" in lines, done.stdout
        assert [line.split()[1] for line in lines if re.match(r"^\d+ \w+ [0-9a-f]{16}$", line)] == [
            "TaskStarted", "TaskClaimed", "ReasoningStepCompleted", "TaskCompleted"]
        assert '"valid": true' in done.stdout.replace('"valid":true', '"valid": true'), done.stdout
    finally:
        # Ctrl-C in make run's terminal: SIGINT to its process group.
        descendants = psutil.Process(server.pid).children(recursive=True) if server.poll() is None else []
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=90)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
    # make itself dies of the SIGINT (as after Ctrl-C); the launcher under it exits 0.
    assert server.returncode in (0, -signal.SIGINT), "".join(output[-40:])
    assert "launcher INFO embedded PostgreSQL stopped" in "".join(output), "".join(output[-40:])
    assert not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
