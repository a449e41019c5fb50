"""A stopped database gets answers, fast: /readyz 503 within 1 s, the API's 503 within 2 s.

Real processes: a PostgreSQL of its own (the embedded wheel, in a temporary directory, so the
suite's server keeps running) and the web process exactly as ``make run`` starts it, with the
psycopg connection pool on as in production. The database is stopped with ``pg_ctl`` (a fresh
interpreter: the wheel caches server handles per process) and started again.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.live_server import ROOT, free_port, web_argv

pytestmark = pytest.mark.slow

READYZ_LIMIT = 1.0
API_LIMIT = 2.0
METRICS_TOKEN = "outage-scrape-token"


def _embedded(action: str, pgdata: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "backplane.runtime.embedded_db", action, "--pgdata", str(pgdata), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Product:
    url: str
    token: str
    pgdata: Path
    log: Path

    def api(self, method: str, path: str, **kwargs: object) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {self.token}"},
                                 timeout=15, **kwargs)  # type: ignore[arg-type]
        return response, time.monotonic() - started

    def readyz(self) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        # The scraper's token: anonymous callers hear only "not ready", not which check failed.
        response = httpx.get(self.url + "/readyz", headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
                             timeout=15)
        return response, time.monotonic() - started


@pytest.fixture(scope="module")
def product() -> Iterator[Product]:
    root = Path(tempfile.mkdtemp(prefix="bp-outage-"))
    pgdata, var_dir = root / "pgdata", root / "var"
    var_dir.mkdir()
    url = _embedded("start", pgdata)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(
        DATABASE_URL=url, BACKPLANE_ENV="development", BACKPLANE_VAR_DIR=str(var_dir), PYTHONUNBUFFERED="1",
        BACKPLANE_DB_POOL="1", BACKPLANE_METRICS_TOKEN=METRICS_TOKEN,
        BACKPLANE_DUTY_WATCH="0", BACKPLANE_LIVE_NOTICES="0", LOG_LEVEL="WARNING",
    )
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=300)
    created = subprocess.run([*manage, "create_agent", "outage-agent", "--namespace", "acme"], cwd=ROOT, env=env,
                             check=True, capture_output=True, text=True, timeout=120)
    token = created.stdout.strip()  # the token alone on stdout; the words go to stderr
    port = free_port()
    log = root / "web.log"
    with log.open("wb") as out:
        web = subprocess.Popen(web_argv(host="127.0.0.1", port=port), cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    running = Product(url=f"http://127.0.0.1:{port}", token=token, pgdata=pgdata, log=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert web.poll() is None, log.read_text()
            try:
                if running.readyz()[0].status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield running
    finally:
        os.killpg(web.pid, signal.SIGKILL)
        web.wait(timeout=10)
        _embedded("stop", pgdata)
        shutil.rmtree(root, ignore_errors=True)


def test_a_stopped_database_is_answered_with_503s_in_time_and_the_api_heals(product: Product) -> None:
    created, _ = product.api("POST", "/api/v1/tasks/", json={"kind": "k", "input": {}})
    assert created.status_code == 201, created.text
    events = f"/api/v1/tasks/{created.json()['task_id']}/events/"
    # Warm the pool: its connections are the ones the outage breaks.
    for n in range(5):
        assert product.api("POST", events, json={"type": "Noted", "payload": {"n": n}})[0].status_code == 201

    _embedded("stop", product.pgdata)
    try:
        timings: dict[str, list[float]] = {"readyz": [], "append": [], "read": []}
        # The first append meets the broken pool (it waits out the pool's timeout); the gate
        # answers the ones after it; /readyz always probes on its own connection.
        for n in range(5):
            append, took = product.api("POST", events, json={"type": "Noted", "payload": {"down": n}})
            assert append.status_code == 503, append.text
            assert append.json()["error"]["code"] == "unavailable"
            assert int(append.headers["Retry-After"]) >= 1
            timings["append"].append(took)
            read, took = product.api("GET", events)
            assert read.status_code == 503, read.text
            timings["read"].append(took)
            ready, took = product.readyz()
            assert ready.status_code == 503, ready.text
            assert any("database" in p for p in ready.json()["error"]["details"]["problems"])
            timings["readyz"].append(took)
        print(f"\nwith the database stopped: first append {timings['append'][0]:.3f}s; max of 5: "
              f"readyz {max(timings['readyz']):.3f}s, append {max(timings['append']):.3f}s, "
              f"read {max(timings['read']):.3f}s")
        assert max(timings["readyz"]) < READYZ_LIMIT, timings
        assert max(timings["append"]) < API_LIMIT, timings
        assert max(timings["read"]) < API_LIMIT, timings
    finally:
        _embedded("start", product.pgdata)

    # Back: the first answers may still be 503 while the pool reconnects, then appends go through.
    healed_at = None
    started = time.monotonic()
    while time.monotonic() - started < 15:
        append, _ = product.api("POST", events, json={"type": "Noted", "payload": {"back": True}})
        if append.status_code == 201:
            healed_at = time.monotonic() - started
            break
        assert append.status_code == 503, append.text
        time.sleep(0.1)
    assert healed_at is not None, product.log.read_text()[-4000:]
    assert product.readyz()[0].status_code == 200
    listed, _ = product.api("GET", events)
    assert [e["payload"] for e in listed.json()["results"]][-1] == {"back": True}
    print(f"appends accepted again {healed_at:.2f}s after the database came back")
