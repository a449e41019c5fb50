"""A private RabbitMQ node for tests: Debian's ``rabbitmq-server`` (``make rabbitmq``) as a child
process, on free ports, with everything it writes under one temporary folder.

Nothing is shared with a system node: the node has its own name, AMQP and distribution ports,
its own ``epmd`` (on a port of its own, started here so that Erlang does not start a daemon
that outlives the test), its own Erlang cookie (``HOME`` is the folder), config, logs and data
(``RABBITMQ_MNESIA_BASE``). The scripts in ``/usr/lib/rabbitmq/bin`` are called directly: the
``/usr/sbin`` wrappers switch to the ``rabbitmq`` user and its home, which this folder is not.

``kill()`` is a SIGKILL of the node's process group (the start script, ``beam.smp`` and its
helpers); ``start()`` again restarts it on the same data, as a crashed broker comes back.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

RABBITMQ_BIN = Path(os.environ.get("BACKPLANE_RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))


def rabbitmq_missing_reason() -> str | None:
    """Why no node can start here (to fail with), or None."""
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        return f"no rabbitmq-server in {RABBITMQ_BIN}: run `make rabbitmq` (Debian's rabbitmq-server)"
    if shutil.which("epmd") is None:
        return "no epmd on PATH (Debian's erlang-base, a dependency of rabbitmq-server)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RabbitNode:
    def __init__(self, base: Path | None = None) -> None:
        self.base = base or Path(tempfile.mkdtemp(prefix="backplane-rabbitmq-"))
        self.name = f"bp{secrets.token_hex(4)}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.log_path = self.base / "node.log"
        self.pid_file = self.base / "node.pid"
        (self.base / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.base / "log").mkdir(exist_ok=True)
        cookie = self.base / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16))
        cookie.chmod(0o400)  # Erlang refuses a cookie file others can read
        (self.base / "enabled_plugins").write_text("[].\n")
        (self.base / "rabbitmq-env.conf").write_text("")
        (self.base / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            # Room enough on a test machine's disk; the default alarm would block publishers.
            "disk_free_limit.absolute = 50MB\n"
        )
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
            "HOME": str(self.base),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(self.base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.base / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.base / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
        }
        self._epmd: subprocess.Popen[bytes] | None = None
        self._server: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, timeout: float = 120) -> RabbitNode:
        if self._epmd is None or self._epmd.poll() is not None:
            self._epmd = subprocess.Popen(["epmd", "-port", str(self.epmd_port)], env=self.env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
        self.pid_file.unlink(missing_ok=True)  # a killed node's, which ``wait`` would read
        with self.log_path.open("ab") as log:
            self._server = subprocess.Popen([str(RABBITMQ_BIN / "rabbitmq-server")], cwd=self.base, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # ``wait`` on the pid file, not ``await_startup``: the latter gives up at once while the
        # node has not registered with epmd yet.
        waited = self.ctl("wait", "--timeout", str(int(timeout)), str(self.pid_file), timeout=timeout + 10, check=False)
        if waited.returncode != 0:
            raise AssertionError(f"RabbitMQ node {self.name} did not start: {waited.stdout}{waited.stderr}\n"
                                 f"{self.log()[-3000:]}")
        return self

    def ctl(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <node> …`` with the node's cookie and epmd."""
        return subprocess.run([str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.name, *args], env=self.env,
                              cwd=self.base, capture_output=True, text=True, timeout=timeout, check=check)

    def is_running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    def save_queue_metadata(self) -> None:
        """Write the node's Ra metadata tables (dets) to disk now, as it does on its own a few
        seconds after each change.

        RabbitMQ 3.10 keeps each quorum queue's Ra registration and term in dets tables saved
        every 0.5–5 s. A node SIGKILLed before that restarts a queue declared just before as a
        new, empty member that never elects itself: every message in the queue is out of reach
        and every publish waits for a leader that never comes. A test of what survives a kill
        in the middle of publishing calls this first, so that the kill tests the messages and
        not how young the queue was.
        """
        self.ctl("eval", "lists:foreach(fun dets:sync/1, dets:all()).")

    def kill(self) -> None:
        """SIGKILL: the node gets no chance to flush or close anything."""
        if self._server is not None:
            _kill_group(self._server)

    def stop(self) -> None:
        self.kill()
        if self._epmd is not None:
            _kill_group(self._epmd)

    def log(self) -> str:
        parts = [self.log_path] + sorted((self.base / "log").glob("*.log"))
        return "\n".join(path.read_text(errors="replace") for path in parts if path.exists())


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)
    # beam.smp's helpers (erl_child_setup, inet_gethost) share the group; wait until none is left.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.fixture(scope="module")
def rabbit_node() -> Iterator[RabbitNode]:
    """One private node per test module, stopped (and its folder removed) at the end."""
    reason = rabbitmq_missing_reason()
    if reason:
        pytest.fail(reason)
    node = RabbitNode()
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(node.base, ignore_errors=True)
