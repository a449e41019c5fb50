"""A Kafka Connect worker for tests: Kafka's ``ConnectStandalone`` running Debezium's PostgreSQL
connector as a child process, from the files ``manage.py cdc config`` writes (the product's
backplane/delivery/cdc.py makes them; the tests write them with the same functions).

The jars come from Maven Central through kafka/connect/pom.xml (``make connect-jars`` copies them
into ``var/kafka/connect-lib``), apart from the broker's: Debezium pins its own Kafka client.
``kill()`` is a SIGKILL of the worker's process group; ``start()`` again restarts it on the same
offsets file, as a crashed worker comes back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.kafka import LOG4J_CONFIG, ROOT, ChildJvm, free_ports
from tests.support.waiting import wait_until

CONNECT_LIB = ROOT / "var" / "kafka" / "connect-lib"
# Written by the Makefile once Maven has copied every jar.
CONNECT_FETCHED_STAMP = CONNECT_LIB / ".fetched"
CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


def connect_missing_reason() -> str | None:
    """Why no worker can start here (to fail with), or None."""
    if not CONNECT_FETCHED_STAMP.exists():
        return (f"no Kafka Connect jars in {CONNECT_LIB}: run `make connect-jars` "
                "(Maven fetches them, kafka/connect/pom.xml)")
    if shutil.which("java") is None:
        return "no java on PATH: Kafka Connect needs Java 17 or later"
    return None


class ConnectWorker(ChildJvm):
    """One standalone worker in ``directory`` (``worker.properties``, ``connector.properties``,
    its offsets file and ``connect.log``), its REST API on a free loopback port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.rest_port = free_ports(1)[0]
        self.log_path = directory / "connect.log"
        self.tmp = directory / "tmp"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def launch(self) -> None:
        assert not self.is_running(), "the worker is already running"
        self.tmp.mkdir(parents=True, exist_ok=True)
        command = ["java", "-Xmx512m", "-XX:+UseSerialGC", "-XX:-UsePerfData", f"-Djava.io.tmpdir={self.tmp}",
                   f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", f"{CONNECT_LIB}/*", CONNECT_MAIN,
                   str(self.directory / "worker.properties"), str(self.directory / "connector.properties")]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def task_state(self) -> str | None:
        """The connector's task state as the REST API gives it (RUNNING, FAILED, …), or None."""
        try:
            with urllib.request.urlopen(f"{self.rest_url}/connectors/backplane-outbox/status", timeout=2) as answer:
                status = json.load(answer)
        except (OSError, urllib.error.URLError, ValueError):
            return None
        tasks = status.get("tasks") or []
        return str(tasks[0]["state"]) if tasks else None

    def wait_running(self, timeout: float = 120) -> None:
        def running() -> bool:
            if not self.is_running():
                raise AssertionError(f"Kafka Connect exited while starting:\n{self.log_tail()}")
            state = self.task_state()
            if state == "FAILED":
                raise AssertionError(f"the connector's task failed:\n{self.log_tail()}")
            return state == "RUNNING"

        wait_until(running, timeout=timeout, interval=0.2, what="Kafka Connect runs the connector",
                   details=self.log_tail)

    def start(self, timeout: float = 120) -> ConnectWorker:
        self.launch()
        self.wait_running(timeout)
        return self

    def log_tail(self, size: int = 6000) -> str:
        try:
            return self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""
