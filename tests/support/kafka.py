"""Private Kafka brokers for tests: KRaft nodes (broker and controller in one JVM) as child
processes on free loopback ports, with everything they write under one temporary folder.

The jars come from Maven Central through kafka/pom.xml (``make kafka-jars`` copies them into
``var/kafka/broker-lib``); each node is ``java -cp 'broker-lib/*' kafka.Kafka server.properties``,
nothing else: no distribution tarball, no scripts, no Docker. ``make kafka`` runs
``python -m tests.support.kafka`` for people.

- One node (``KafkaCluster(1)``) is formatted ``--standalone``: the only voter of its quorum,
  replication factor 1 everywhere.
- Three nodes (``KafkaCluster(3)``) are formatted with ``--initial-controllers``, naming all three
  voters with their directory ids, so the quorum exists from the first start instead of growing
  by ``add-controller`` calls (KRaft 4.x's dynamic quorum; ``controller.quorum.voters`` is the old
  static form). Internal topics and new topics get replication factor 3 with
  ``min.insync.replicas=2``, and an out-of-sync replica never becomes leader: an ``acks=all``
  write survives the loss of any one node.

``kill()`` is a SIGKILL of a node's process group; ``start()`` again restarts it on the same data,
as a crashed broker comes back. ``stop()`` is a SIGTERM (a controlled shutdown), then SIGKILL
after a timeout. The tests drive the brokers with Kafka's own command-line tools (``tool()``),
from the same classpath: no Python Kafka client is needed.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
BROKER_LIB = ROOT / "var" / "kafka" / "broker-lib"
# Written by the Makefile once Maven has copied every jar (a folder alone may be half filled).
FETCHED_STAMP = BROKER_LIB / ".fetched"
LOG4J_CONFIG = ROOT / "kafka" / "log4j2.xml"
STARTED_LINE = "Kafka Server started"

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


def kafka_missing_reason() -> str | None:
    """Why no broker can start here (to fail with), or None."""
    if not FETCHED_STAMP.exists():
        return f"no Kafka jars in {BROKER_LIB}: run `make kafka-jars` (Maven fetches them, kafka/pom.xml)"
    if shutil.which("java") is None:
        return "no java on PATH: Kafka 4 needs Java 17 or later"
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports: all bound at once, so none is handed out twice."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def kafka_uuid() -> str:
    """A Kafka ``Uuid`` as its tools print one (16 random bytes, URL-safe base64, no padding), made
    here because ``StorageTool random-uuid`` costs a JVM start for each."""
    while True:
        text = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        if not text.startswith("-"):  # Kafka skips these too: a command line reads one as a flag
            return text


def java_command(main: str, *args: str, tmp: Path, broker: bool) -> list[str]:
    """``java`` on the broker's classpath. ``-XX:-UsePerfData`` and ``java.io.tmpdir`` keep the
    JVM's files inside the cluster's folder: otherwise it writes hsperfdata under /tmp, and
    zstd-jni and snappy unpack native libraries there, which a SIGKILLed JVM leaves behind."""
    if broker:
        memory = ["-Xms512m", "-Xmx512m", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError"]
    else:
        # A tool runs for a second or two: start fast rather than compile well.
        memory = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    return ["java", *memory, "-XX:-UsePerfData", f"-Djava.io.tmpdir={tmp}",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}", "-cp", f"{BROKER_LIB}/*", main, *args]


class ChildJvm:
    """A JVM this process started as the leader of a session of its own (``_process``): signals go
    to the whole session, so nothing it started outlives it."""

    _process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the JVM gets no chance to flush or close anything."""
        if self.is_running():
            assert self._process is not None
            _signal_group(self._process, signal.SIGKILL)
            self._process.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM, without waiting: a controlled shutdown (``stop()`` waits)."""
        if self.is_running():
            assert self._process is not None
            _signal_group(self._process, signal.SIGTERM)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL if the JVM has not exited within ``timeout``."""
        self.terminate()
        if self._process is None:
            return
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class KafkaNode(ChildJvm):
    """One KRaft node, broker and controller in one process; its folder holds ``server.properties``,
    ``data/`` and ``node.log`` (stdout and stderr: log4j2 writes to the console)."""

    def __init__(self, base: Path, node_id: int, *, port: int, controller_port: int) -> None:
        self.base = base
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.directory_id = kafka_uuid()
        self.config_path = base / "server.properties"
        self.log_path = base / "node.log"
        self.tmp = base / "tmp"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def controller_address(self) -> str:
        return f"127.0.0.1:{self.controller_port}"

    def launch(self) -> None:
        """Start the JVM without waiting; ``wait_ready()`` waits."""
        assert not self.is_running(), f"node {self.node_id} is already running"
        self.tmp.mkdir(parents=True, exist_ok=True)
        # The log is appended to across restarts; readiness reads only what this run wrote.
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                java_command("kafka.Kafka", str(self.config_path), tmp=self.tmp, broker=True),
                cwd=self.base, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> None:
        """The node logged that it started (KRaft logs it once the broker is caught up with the
        metadata and unfenced) and accepts connections; fails at once if the JVM exits."""

        def ready() -> bool:
            if not self.is_running():
                raise AssertionError(f"Kafka node {self.node_id} exited while starting:\n{self.log_tail()}")
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                if STARTED_LINE.encode() not in log.read():
                    return False
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(ready, timeout=timeout, interval=0.1, what=f"Kafka node {self.node_id} starts",
                   details=self.log_tail)

    def start(self, timeout: float = 90) -> KafkaNode:
        self.launch()
        self.wait_ready(timeout)
        return self

    def log_tail(self, size: int = 4000) -> str:
        try:
            return f"--- node {self.node_id} ---\n" + self.log_path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    """Signal the node's session (the JVM leads it), only while the JVM is not reaped yet: after
    that its id may belong to another process group."""
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class PartitionState:
    partition: int
    leader: int | None
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


class KafkaCluster:
    """``size`` KRaft nodes under one temporary folder. Start with ``start()``, always ``stop()`` in
    a ``finally`` (it removes the folder); ``running_kafka()`` does both."""

    def __init__(self, size: int = 1, *, base: Path | None = None, port: int | None = None) -> None:
        assert size in (1, 3), "one node, or three for the fault tests"
        ports = free_ports(2 * size)
        if port is not None:
            ports[0] = port
        self.base = base or Path(tempfile.mkdtemp(prefix="backplane-kafka-"))
        self.cluster_id = kafka_uuid()
        self.tmp = self.base / "tmp"
        self.nodes = [KafkaNode(self.base / f"node{index + 1}", index + 1,
                                port=ports[2 * index], controller_port=ports[2 * index + 1])
                      for index in range(size)]
        self._formatted = False

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node, so that any one of them may be down."""
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(node for node in self.nodes if node.node_id == node_id)

    # --- starting -------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> KafkaCluster:
        if not self._formatted:
            self._format()
        # All at once: a node of three waits for a quorum of controllers before it reports started.
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.wait_ready(timeout)
        return self

    def _format(self) -> None:
        replication = len(self.nodes)
        min_isr = min(2, replication)
        quorum = ",".join(node.controller_address for node in self.nodes)
        for node in self.nodes:
            node.base.mkdir(parents=True)
            node.config_path.write_text(
                "process.roles=broker,controller\n"
                f"node.id={node.node_id}\n"
                f"listeners=PLAINTEXT://{node.address},CONTROLLER://{node.controller_address}\n"
                f"advertised.listeners=PLAINTEXT://{node.address},CONTROLLER://{node.controller_address}\n"
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
                "controller.listener.names=CONTROLLER\n"
                "inter.broker.listener.name=PLAINTEXT\n"
                f"controller.quorum.bootstrap.servers={quorum}\n"
                f"log.dirs={node.base / 'data'}\n"
                f"default.replication.factor={replication}\n"
                f"min.insync.replicas={min_isr}\n"
                "unclean.leader.election.enable=false\n"
                f"offsets.topic.replication.factor={replication}\n"
                f"transaction.state.log.replication.factor={replication}\n"
                f"transaction.state.log.min.isr={min_isr}\n"
                f"share.coordinator.state.topic.replication.factor={replication}\n"
                f"share.coordinator.state.topic.min.isr={min_isr}\n"
                # The first consumer group creates the offsets topic: 50 partitions (the default)
                # times three replicas takes seconds on two cores; a test needs few.
                "offsets.topic.num.partitions=5\n"
                # A group's first member would wait 3 s for others to join.
                "group.initial.rebalance.delay.ms=0\n"
                # The controller keeps a killed broker's registration until its session times out
                # (9 s by default): only then is the broker fenced (dropped from every ISR, its
                # partitions led elsewhere), and only then may it register again after a restart.
                "broker.heartbeat.interval.ms=1000\n"
                "broker.session.timeout.ms=4000\n"
            )
        if len(self.nodes) == 1:
            voters = ["--standalone"]
        else:
            # The same list on every node; each takes its own directory id from it.
            voters = ["--initial-controllers", ",".join(
                f"{node.node_id}@{node.controller_address}:{node.directory_id}" for node in self.nodes)]
        self.tmp.mkdir(exist_ok=True)
        formats = [subprocess.Popen(
            java_command("kafka.tools.StorageTool", "format", "-t", self.cluster_id, *voters,
                         "-c", str(node.config_path), tmp=self.tmp, broker=False),
            cwd=node.base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            for node in self.nodes]
        for node, process in zip(self.nodes, formats, strict=True):
            output, _ = process.communicate(timeout=60)
            if process.returncode != 0:
                raise AssertionError(f"formatting node {node.node_id} failed:\n{output.decode(errors='replace')}")
        self._formatted = True

    # --- Kafka's tools ----------------------------------------------------------------------------

    def tool(self, main: str, *args: str, stdin: str | None = None, timeout: float = 60,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        """One of Kafka's command-line tools (``main`` is its class), on the broker's classpath."""
        done = subprocess.run(java_command(main, *args, tmp=self.tmp, broker=False), input=stdin,
                              capture_output=True, text=True, timeout=timeout, cwd=self.base)
        if check and done.returncode != 0:
            raise AssertionError(f"{main.rsplit('.', 1)[-1]} {' '.join(args)} exited with {done.returncode}:\n"
                                 f"{done.stdout}{done.stderr}")
        return done

    def create_topic(self, name: str, *, partitions: int = 1) -> None:
        """With the cluster's replication factor: 1, or 3 on three nodes."""
        self.tool(TOPIC_COMMAND, "--bootstrap-server", self.bootstrap, "--create", "--topic", name,
                  "--partitions", str(partitions), "--replication-factor", str(len(self.nodes)))

    def describe_topic(self, name: str) -> list[PartitionState]:
        described = self.tool(TOPIC_COMMAND, "--bootstrap-server", self.bootstrap, "--describe", "--topic", name)
        states = []
        for line in described.stdout.splitlines():
            found = re.search(r"Partition: (\d+)\s+Leader: (-?\d+|none)\s+Replicas: ([\d,]*)\s+Isr: ([\d,]*)", line)
            if found:
                partition, leader, replicas, isr = found.groups()
                states.append(PartitionState(
                    int(partition), None if leader in ("none", "-1") else int(leader),
                    tuple(int(n) for n in replicas.split(",") if n), tuple(int(n) for n in isr.split(",") if n)))
        return states

    def produce(self, topic: str, values: list[str], *, timeout: float = 90) -> None:
        """``acks=all``, one value per line; ``--sync`` waits for each acknowledgement, so a send
        that fails makes the tool exit non-zero (without it, the failure is only logged)."""
        self.tool(CONSOLE_PRODUCER, "--bootstrap-server", self.bootstrap, "--topic", topic,
                  "--request-required-acks", "all", "--sync", stdin="".join(f"{value}\n" for value in values),
                  timeout=timeout)

    def consume(self, topic: str, count: int, *, timeout_ms: int = 30_000) -> list[str]:
        """The first ``count`` values of ``topic`` from its beginning (fewer if ``timeout_ms``
        passes without a message), read by a consumer group of its own."""
        consumed = self.tool(CONSOLE_CONSUMER, "--bootstrap-server", self.bootstrap, "--topic", topic,
                             "--from-beginning", "--max-messages", str(count), "--timeout-ms", str(timeout_ms),
                             timeout=timeout_ms / 1000 + 60, check=False)
        return consumed.stdout.splitlines()

    # --- stopping -------------------------------------------------------------------------------

    def stop(self, timeout: float = 30) -> None:
        """Stop every node (SIGTERM to all first, so that none waits on a peer that is still up
        to be told), SIGKILL what is left after ``timeout``, and remove the folder."""
        for node in self.nodes:
            node.terminate()
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.stop(timeout=max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self.base, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of this cluster outlived ``stop()``: processes naming its folder, and the folder."""
        found = []
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(process.info["cmdline"] or [])
            if str(self.base) in cmdline:
                found.append(f"process {process.info['pid']}: {cmdline[:200]}")
        if self.base.exists():
            found.append(f"folder {self.base}")
        return found

    def logs(self) -> str:
        return "\n".join(node.log_tail() for node in self.nodes)


@contextmanager
def running_kafka(size: int = 1) -> Iterator[KafkaCluster]:
    """A started cluster, stopped and removed on the way out however the block ends; fails (never
    skips) when the jars are missing, so the full tier cannot pass without Kafka."""
    reason = kafka_missing_reason()
    if reason:
        pytest.fail(reason)
    cluster = KafkaCluster(size)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kafka_one_node() -> Iterator[KafkaCluster]:
    """One private node per test module; afterwards, nothing of it may be left."""
    with running_kafka(1) as cluster:
        yield cluster
    assert not cluster.leftovers(), cluster.leftovers()


@pytest.fixture(scope="module")
def kafka_three_nodes() -> Iterator[KafkaCluster]:
    """Three nodes (replication factor 3, ``min.insync.replicas=2``) per test module."""
    with running_kafka(3) as cluster:
        yield cluster
    assert not cluster.leftovers(), cluster.leftovers()


def main(argv: list[str] | None = None) -> int:
    """``make kafka``: one node in the foreground until Ctrl-C, which stops it and removes its data."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.kafka")
    parser.add_argument("--port", type=int, default=9092, help="the broker's port on 127.0.0.1")
    args = parser.parse_args(argv)
    reason = kafka_missing_reason()
    if reason:
        sys.stderr.write(reason + "\n")
        return 1
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", args.port))
        except OSError as error:
            sys.stderr.write(f"127.0.0.1:{args.port} is taken ({error.strerror}): "
                             "`make kafka KAFKA_PORT=…` picks another port\n")
            return 1
    cluster = KafkaCluster(1, port=args.port)
    stop_requested = threading.Event()
    # A closed terminal (SIGHUP) stops the node like a SIGTERM does: the handler lets ``finally``
    # run, where the default action would end this process and orphan the JVM and its folder.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: stop_requested.set())
    try:
        started = time.monotonic()
        cluster.start()
        node = cluster.nodes[0]
        sys.stdout.write(
            f"Kafka {node.address} started in {time.monotonic() - started:.1f} s (KRaft, one node)\n"
            f"bootstrap.servers={cluster.bootstrap}\n"
            f"data and log: {cluster.base} (node.log)\n"
            "Ctrl-C stops the node and removes its data.\n")
        sys.stdout.flush()
        while not stop_requested.wait(1) and node.is_running():
            pass
        if not node.is_running():
            sys.stderr.write(f"the node exited:\n{node.log_tail()}\n")
            return 1
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C would cut the shutdown short and leave the folder behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
