"""`make run`'s launcher, for real: it serves the admin with the printed login and
/readyz, and a stop signal leaves none of its processes (the database included) behind."""

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
from pathlib import Path

import httpx
import psutil
import pytest

from backplane.runtime import embedded_db

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningProduct:
    def __init__(self, var_dir: Path) -> None:
        self.var_dir = var_dir
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "BACKPLANE_VAR_DIR"}}
        env["BACKPLANE_ENV"] = "development"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "backplane.runtime.launcher", "--port", str(self.port), "--var-dir", str(var_dir)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "launcher exited early:\n" + "".join(self.output)
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError("never became ready:\n" + "".join(self.output))

    def login(self) -> tuple[str, str]:
        text = "".join(self.output)
        match = re.search(r"user: (\S+)\s+password: (\S+)", text)
        assert match, text
        return match.group(1), match.group(2)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


def admin_login_works(base_url: str, username: str, password: str) -> bool:
    with httpx.Client(base_url=base_url, follow_redirects=False, timeout=10) as client:
        page = client.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        response = client.post(
            "/admin/login/?next=/admin/",
            data={"csrfmiddlewaretoken": token, "username": username, "password": password, "next": "/admin/"},
            headers={"Referer": base_url + "/admin/login/"},
        )
        if response.status_code != 302:
            return False
        return client.get("/admin/").status_code == 200


def stop_and_check_nothing_is_left(product: RunningProduct, sig: signal.Signals) -> None:
    children = product.descendants()
    assert len(children) >= 3  # web, worker (+ its pool), beat
    product.process.send_signal(sig)
    assert product.process.wait(timeout=60) == 0, "".join(product.output)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == [], f"left running: {alive}"
    assert not embedded_db.is_running(product.var_dir / "pgdata")


def test_it_serves_the_admin_and_stops_everything_on_sigterm_then_sigint() -> None:
    # Not pytest's tmp_path: pytest keeps its parent at mode 0700, which the database's
    # own system user (when we run as root) cannot traverse.
    var_dir = Path(tempfile.mkdtemp(prefix="bp-launcher-")) / "var"
    first = RunningProduct(var_dir)
    try:
        first.wait_ready()
        username, password = first.login()
        assert admin_login_works(first.url, username, password)
        assert not admin_login_works(first.url, username, password + "x")
        stop_and_check_nothing_is_left(first, signal.SIGTERM)

        # A second start reuses the data (same login) and stops on Ctrl-C (SIGINT).
        second = RunningProduct(var_dir)
        second.wait_ready()
        assert second.login() == (username, password)
        assert admin_login_works(second.url, username, password)
        stop_and_check_nothing_is_left(second, signal.SIGINT)
    finally:
        for product in (first, locals().get("second")):
            if product is not None and product.process.poll() is None:
                product.process.kill()
        embedded_db.stop(var_dir / "pgdata", mode="immediate")
