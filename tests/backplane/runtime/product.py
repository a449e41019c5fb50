"""The whole product as ``make run`` starts it, for tests that kill its processes.

``RunningProduct`` runs ``python -m backplane.runtime.launcher`` on its own var directory and
free port, with ``BACKPLANE_ENV=development`` and no ``DATABASE_URL`` (so the launcher starts
the embedded database through its guard). ``ProductClient`` talks to it the way agents and
operators do: ``manage.py create_agent`` against the product's database, appends over the REST
API, the duty table and the event log read with plain SQL. It keeps every append acknowledged
with 201, so a test can check that each is stored exactly once and that the chains hold.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from backplane.runtime import embedded_db
from backplane.runtime.supervisor import is_alive, read_json
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
# The duties that run every few seconds: each must run again within 30 s of any kill.
SHORT_DUTIES = ("relay-outbox", "detect-stalls", "seal-events")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def new_var_dir(prefix: str) -> Path:
    # Not pytest's tmp_path: pytest keeps its parent at mode 0700, which the database's own
    # system user (when we run as root) cannot traverse.
    return Path(tempfile.mkdtemp(prefix=prefix)) / "var"


def launcher_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "BACKPLANE_VAR_DIR"}}
    env["BACKPLANE_ENV"] = "development"
    # The demo fleet would add load and processes these tests do not count on (tests/demo run it).
    env.setdefault("BACKPLANE_DEMO", "0")
    return env


def run_launcher(var_dir: Path, *args: str, port: int | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A launcher run to its end (one that refuses, or ``--clean``)."""
    argv = [sys.executable, "-m", "backplane.runtime.launcher", "--var-dir", str(var_dir)]
    if port is not None:
        argv += ["--port", str(port)]
    return subprocess.run([*argv, *args], cwd=ROOT, env=launcher_env(), capture_output=True, text=True,
                          timeout=timeout)


class RunningProduct:
    def __init__(self, var_dir: Path, port: int | None = None, *, env: dict[str, str] | None = None) -> None:
        self.var_dir = var_dir
        self.port = port or free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "backplane.runtime.launcher", "--port", str(self.port), "--var-dir", str(var_dir)],
            cwd=ROOT, env={**launcher_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pgdata(self) -> Path:
        return self.var_dir / "pgdata"

    def log(self, last: int = 12000) -> str:
        return "".join(self.output)[-last:]

    def wait_ready(self, timeout: float = 120) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, "launcher exited early:\n" + self.log()
            try:
                return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout=timeout, what="the product answers /readyz with 200", interval=0.3,
                   details=self.log)

    def login(self) -> tuple[str, str]:
        match = re.search(r"user: (\S+)\s+password: (\S+)", "".join(self.output))
        assert match, self.log()
        return match.group(1), match.group(2)

    def database_url(self) -> str:
        return (self.var_dir / "database_url").read_text().strip()

    def children(self) -> dict[str, int]:
        """The launcher's children by name (web, worker, beat, database), from its state file."""
        state = read_json(self.var_dir / "run" / "launcher.json") or {}
        return {name: int(child["pid"]) for name, child in (state.get("children") or {}).items()}

    def child(self, name: str, *, not_pid: int | None = None, timeout: float = 30) -> psutil.Process:
        """The live child called ``name`` (other than ``not_pid``, one killed before)."""
        def found() -> psutil.Process | None:
            pid = self.children().get(name)
            if pid is None or pid == not_pid:
                return None
            try:
                process = psutil.Process(pid)
            except psutil.NoSuchProcess:
                return None
            return process if is_alive(process) else None

        return wait_until(found, timeout=timeout, what=f"the launcher runs a {name}", details=self.log)

    def postmaster_pid(self) -> int | None:
        return embedded_db.postmaster_pid(self.pgdata)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def processes(self) -> list[psutil.Process]:
        """Everything of this product that runs: the launcher's descendants, and every PostgreSQL
        process working in its data directory (a daemonized server is nobody's descendant)."""
        found = {p.pid: p for p in self.descendants()}
        for process in psutil.process_iter(["cwd"]):
            if process.info["cwd"] and Path(process.info["cwd"]) == self.pgdata.resolve():
                found[process.pid] = process
        return list(found.values())

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def close(self) -> None:
        """Whatever state the test left it in: stop it, and the database under it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for process in self.processes():
            if is_alive(process):
                try:
                    process.kill()
                except psutil.Error:
                    pass
        embedded_db.stop(self.pgdata, mode="immediate")


def alive(processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """The ones still running; a zombie (dead, not reaped: PID 1 may reap nothing) is not."""
    return [p for p in processes if is_alive(p)]


# --- what agents and operators do ---------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    task_id: str
    idempotency_key: str
    status: int  # 201 written now, or 200: the replay of a write whose first answer was lost
    seq: int
    hash: str


class ProductClient:
    """An agent of the product (its token from ``manage.py create_agent``) and a reader of its
    database. Writes retry with the same idempotency key until they get an answer, as an agent
    does while the product restarts a process."""

    def __init__(self, product: RunningProduct, *, namespace: str = "supervision") -> None:
        self.product = product
        env = {**launcher_env(), "DATABASE_URL": product.database_url(), "BACKPLANE_VAR_DIR": str(product.var_dir)}
        done = subprocess.run(
            [sys.executable, "manage.py", "create_agent", f"agent-{uuid.uuid4().hex[:8]}", "--namespace", namespace],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
        )
        self.token = done.stdout.strip().splitlines()[-1]
        self.http = httpx.Client(base_url=product.url, timeout=5,
                                 headers={"Authorization": f"Bearer {self.token}"})
        self.acks: list[Ack] = []
        self.tasks: list[str] = []
        self._steps = 0

    def close(self) -> None:
        self.http.close()

    def _post(self, path: str, body: dict[str, Any], *, timeout: float) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while True:
            try:
                response = self.http.post(path, json=body)
                if response.status_code < 500 and response.status_code != 429:
                    return response
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"POST {path} got no answer within {timeout:.0f} s"
            time.sleep(0.2)

    def create_task(self, *, timeout: float = 30) -> str:
        task_id = str(uuid.uuid4())
        response = self._post("/api/v1/tasks/", {"task_id": task_id, "kind": "supervised", "input": {}},
                              timeout=timeout)
        assert response.status_code in (200, 201), response.text
        self.tasks.append(task_id)
        return task_id

    def append(self, task_id: str, *, timeout: float = 30) -> Ack:
        self._steps += 1
        key = f"step-{self._steps}-{uuid.uuid4().hex[:8]}"
        body = {"type": "ReasoningStepCompleted", "payload": {"step": self._steps}, "idempotency_key": key}
        response = self._post(f"/api/v1/tasks/{task_id}/events/", body, timeout=timeout)
        assert response.status_code in (200, 201), response.text
        event = response.json()
        ack = Ack(task_id=task_id, idempotency_key=key, status=response.status_code, seq=event["seq"],
                  hash=event["hash"])
        self.acks.append(ack)
        return ack

    # -- reading the product's database --

    def duty_successes(self) -> dict[str, datetime | None] | None:
        """Each duty's last success, or None while the database does not answer."""
        try:
            with psycopg.connect(self.product.database_url(), connect_timeout=2) as conn:
                rows = conn.execute("SELECT name, last_succeeded_at FROM backplane_duty").fetchall()
        except psycopg.Error:
            return None
        return dict(rows)

    def duties_ran_since(self, since: datetime, duties: Iterable[str]) -> bool:
        successes = self.duty_successes()
        return successes is not None and all((successes.get(name) or since) > since for name in duties)

    def wait_recovered(self, since: datetime, *, duties: Iterable[str] = SHORT_DUTIES, timeout: float = 30,
                       task_id: str | None = None) -> float:
        """Seconds until, after ``since``, an append was acknowledged and every one of ``duties``
        succeeded again; fails after ``timeout``."""
        duties = tuple(duties)
        deadline = time.monotonic() + timeout
        task_id = task_id or (self.tasks[-1] if self.tasks else self.create_task(timeout=timeout))
        self.append(task_id, timeout=timeout)
        wait_until(lambda: self.duties_ran_since(since, duties), timeout=max(0.0, deadline - time.monotonic()),
                   what=f"{', '.join(duties)} ran again after {since:%H:%M:%S.%f}",
                   details=lambda: f"duties: {self.duty_successes()}\n{self.product.log()}")
        return (datetime.now(UTC) - since).total_seconds()

    def check_acknowledged_writes(self) -> None:
        """Every acknowledged append is stored exactly once, as acknowledged, and every chain
        (checked by the product's own verifier) is valid."""
        assert self.acks
        with psycopg.connect(self.product.database_url(), connect_timeout=5) as conn:
            for ack in self.acks:
                rows = conn.execute(
                    "SELECT seq, hash FROM backplane_event WHERE task_id = %s AND idempotency_key = %s",
                    [ack.task_id, ack.idempotency_key],
                ).fetchall()
                assert rows == [(ack.seq, ack.hash)], f"{ack} is stored as {rows}"
        for task_id in self.tasks:
            response = self.http.get(f"/api/v1/tasks/{task_id}/verify/")
            assert response.status_code == 200, f"{response.status_code} {response.text}\n{self.product.log()}"
            assert response.json()["valid"] is True, response.text
        env = {**launcher_env(), "DATABASE_URL": self.product.database_url(),
               "BACKPLANE_VAR_DIR": str(self.product.var_dir)}
        done = subprocess.run([sys.executable, "manage.py", "verify_chain", "--all"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert " 0 broken" in done.stdout, done.stdout


def now() -> datetime:
    return datetime.now(UTC)
