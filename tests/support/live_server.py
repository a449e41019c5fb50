"""The product's web process, started the way ``make run`` starts it, against the test database.

Shared by the end-to-end tests (``tests/e2e``) and the browser tests (``tests/browser``).

The command line is the launcher's own: ``web_argv`` asks ``backplane.runtime.launcher`` what
it would spawn as its "web" child, so a change there is a change here. The database is
pytest-django's test database, so tests using ``committed_db`` and the server see each other's
commits; a fixture holding a ``WebProcess`` must stop it before pytest-django drops that
database (module or package scope, and depend on ``django_db_setup``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from django.db import connection

from backplane.runtime.launcher import Launcher

ROOT = Path(__file__).resolve().parents[2]
READY_SECONDS = 60.0
STOP_SECONDS = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url_of_test_db() -> str:
    """``DATABASE_URL`` for pytest-django's test database, in the form ``backplane.runtime.env`` reads:
    ``postgresql://USER:@/NAME?host=/socket/dir`` for a unix socket, else host and port."""
    db = connection.settings_dict
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    name = quote(str(db["NAME"]), safe="")
    host = str(db.get("HOST") or "")
    port = str(db.get("PORT") or "")
    if not host or host.startswith("/"):
        url = f"postgresql://{user}:{password}@" + (f":{port}" if port else "") + f"/{name}"
        if host:
            url += f"?host={quote(host, safe='/')}"
    else:
        url = f"postgresql://{user}:{password}@{host}" + (f":{port}" if port else "") + f"/{name}"
    sslmode = (db.get("OPTIONS") or {}).get("sslmode")
    if sslmode:
        url += ("&" if "?" in url else "?") + f"sslmode={sslmode}"
    return url


class _ArgvRecorder(Launcher):
    """The launcher with ``spawn`` recording instead of starting."""

    def __init__(self, *, host: str, port: int) -> None:
        super().__init__(host=host, port=port, var_dir=Path(os.environ["BACKPLANE_VAR_DIR"]))
        self.argvs: dict[str, list[str]] = {}

    def spawn(self, name: str, argv: list[str]) -> None:
        self.argvs[name] = argv


def web_argv(*, host: str, port: int) -> list[str]:
    """What ``make run`` runs as its web process (``python -m uvicorn backplane.asgi:application …``)."""
    recorder = _ArgvRecorder(host=host, port=port)
    recorder.spawn_all()
    return recorder.argvs["web"]


def web_env() -> dict[str, str]:
    env = dict(os.environ)
    # The browser tests allow synchronous ORM calls beside Playwright's event loop in the test
    # process (tests/browser/conftest.py); the server must keep Django's check.
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.update(
        DATABASE_URL=database_url_of_test_db(),
        BACKPLANE_ENV="test",
        BACKPLANE_DB_POOL="0",
        BACKPLANE_VAR_DIR=os.environ["BACKPLANE_VAR_DIR"],
        PYTHONUNBUFFERED="1",
        LOG_LEVEL="WARNING",
    )
    return env


class WebProcess:
    """One web process on a fixed port: start it, kill it (the kernel drops its sockets, no
    close frames), start it again on the same port, stop it. Its output goes to one log file
    across restarts."""

    host = "127.0.0.1"

    def __init__(self, port: int | None = None, *, name: str = "web", env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.name = name
        self.env = env or {}  # on top of ``web_env()``
        self.log_path = Path(tempfile.mkstemp(prefix=f"bp-{name}-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def start(self) -> WebProcess:
        assert self.process is None or self.process.poll() is not None, f"{self.name} is already running"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                web_argv(host=self.host, port=self.port), cwd=ROOT, env={**web_env(), **self.env},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_SECONDS
        while True:
            assert self.process.poll() is None, f"{self.name} exited early:\n" + self.log()[-6000:]
            try:
                # What a load balancer gates on: the process serves. /readyz also judges what the
                # product depends on (a Kafka cluster, a replication slot), which a test may leave red.
                if httpx.get(self.url + "/readyz/traffic", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{self.name} never became ready:\n" + self.log()[-6000:]
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: every connection it held is dropped by the kernel, as in a crash."""
        assert self.process is not None and self.process.poll() is None, f"{self.name} is not running"
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_SECONDS)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    def close(self) -> None:
        """Stop it and remove its log."""
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log(self, since: int = 0) -> str:
        """The server's output (uvicorn and Django's log) from byte ``since`` on."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")
