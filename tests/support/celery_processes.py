"""A Celery worker and beat as real processes against pytest-django's test database.

Started with the commands ``make run`` uses (``python -m celery -A backplane worker|beat``),
a broker folder of their own under a temporary var dir, and the environment of the test
database, so a test using ``committed_db`` and the processes see each other's commits. Stop
them before pytest-django drops that database (function or module scope).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.live_server import ROOT, database_url_of_test_db


class CeleryProcesses:
    def __init__(self, *, env: dict[str, str] | None = None) -> None:
        self.var_dir = Path(tempfile.mkdtemp(prefix="bp-celery-"))
        self.env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
        self.env.update({
            "DATABASE_URL": database_url_of_test_db(),
            "BACKPLANE_ENV": "test",
            "BACKPLANE_DB_POOL": "0",
            "BACKPLANE_VAR_DIR": str(self.var_dir),
            "BACKPLANE_LIVE_NOTICES": "0",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),  # a test's own values win
        })
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def log_path(self, name: str) -> Path:
        return self.var_dir / f"{name}.log"

    def log(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, name: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "celery", "-A", "backplane"]
        if name == "beat":
            argv += ["beat", "--loglevel", "INFO", "--schedule", str(self.var_dir / "beat-schedule"), "--pidfile", ""]
        else:
            argv += ["worker", "--loglevel", "INFO", "--hostname", f"{name}@test", "--without-mingle",
                     "--without-gossip"]
        with self.log_path(name).open("ab") as log:
            self.processes[name] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)
        return self.processes[name]

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
