"""The CDC relay beside the polling relay, on one private KRaft node and one embedded PostgreSQL,
in one run: the lag of each, and the append rate with each running against none.

    .venv/bin/python bench/relay_cdc.py [--rate 400] [--seconds 10] [--append-seconds 10]

1. Lag, polling: bench/relay.py's ``lag`` phase on Kafka (bench/relay_kafka.py's consumer):
   producer threads commit one outbox message per transaction at ``--rate`` while the real
   ``manage.py relay`` publishes them; lag = consumed minus committed.
2. Lag, CDC: the same with ``manage.py cdc setup``'s publication, slot and role, a Kafka Connect
   worker running Debezium from the files ``manage.py cdc config`` writes, and ``manage.py relay``
   in the CDC mode (it only marks what reached Kafka). Commit -> consumed is Debezium's path;
   commit -> ``delivered_at`` adds the relay's read-back.
3. Drain: ``--messages`` committed while Connect is down, then the time from the first record
   Debezium publishes to the last; the polling relay draining the same backlog
   (``outbox_relay_until_idle``) and the raw producer (bench/relay_kafka.py's), in the same run.
4. Appends: ``--threads`` threads append events with one outbox message each through the writer
   (``services.event_append``) for ``--append-seconds``: with nothing relaying (the rows wait),
   with the polling relay running, and with Connect and the CDC relay running.
Needs ``make kafka-jars connect-jars``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from _support import ROOT, bench_database, describe

sys.path.insert(0, str(ROOT))

import relay as kombu_bench  # noqa: E402 - bench/relay.py: the phases, shared
import relay_kafka  # noqa: E402 - bench/relay_kafka.py: the Kafka consumer

from tests.support.kafka import KafkaCluster, kafka_missing_reason  # noqa: E402
from tests.support.kafka_connect import ConnectWorker, connect_missing_reason  # noqa: E402

TOPIC = "bench-cdc"


def appends_per_second(seconds: float, threads: int) -> float:
    """Appends (each one event with one outbox message) a second, ``threads`` at once."""
    from django.db import connection

    from backplane.eventlog import services
    from backplane.eventlog.writer import EventDraft, OutboxDraft

    tasks = [services.task_create(namespace="bench", kind="cdc", input={}, agent="bench").task for _ in range(threads)]
    counts = [0] * threads
    stop_at = time.perf_counter() + seconds

    def append(index: int) -> None:
        task = tasks[index]
        try:
            while time.perf_counter() < stop_at:
                draft = EventDraft(type="Noted", payload={"n": counts[index]},
                                   outbox=(OutboxDraft(topic="bench.cdc", payload={"n": counts[index]},
                                                       key=str(task.pk)),))
                services.event_append(namespace=task.namespace, task_id=task.pk, draft=draft, agent="bench")
                counts[index] += 1
        finally:
            connection.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=append, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - started)


def drain(timeout: float = 120) -> None:
    if not kombu_bench.wait_for(lambda: kombu_bench.pending() == 0, timeout):
        raise SystemExit(f"{kombu_bench.pending()} messages still pending after {timeout:.0f} s")


def appends_beside_the_relay(log: Path, args: argparse.Namespace) -> float:
    """``appends_per_second`` while ``manage.py relay`` runs (in the mode the environment says),
    the outbox drained before and after."""
    relay = kombu_bench.start_relay(log)
    try:
        drain()
        rate = appends_per_second(args.append_seconds, args.threads)
        drain()
        return rate
    finally:
        kombu_bench.stop_relay(relay)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=400.0, help="messages a second offered in the lag phases")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4, help="appending threads")
    parser.add_argument("--append-seconds", type=float, default=10.0)
    parser.add_argument("--messages", type=int, default=20_000, help="the backlog each relay drains")
    args = parser.parse_args()
    if reason := kafka_missing_reason() or connect_missing_reason():
        raise SystemExit(reason)
    cluster = KafkaCluster(1).start()
    connect: ConnectWorker | None = None
    rates: dict[str, list[float]] = {"none": [], "poll": [], "cdc": []}
    connect_share = float("nan")
    try:
        cluster.create_topic(TOPIC, partitions=relay_kafka.PARTITIONS)
        cluster.create_topic("bench-raw", partitions=relay_kafka.PARTITIONS)
        os.environ["BACKPLANE_OUTBOX_BROKER_URL"] = f"kafka://{cluster.bootstrap}"
        os.environ["BACKPLANE_OUTBOX_KAFKA_TOPIC"] = TOPIC
        with bench_database():
            from django.conf import settings

            from backplane.delivery import cdc

            var = Path(settings.VAR_DIR)
            consumer = lambda: relay_kafka.KafkaConsumer(cluster.bootstrap, TOPIC)  # noqa: E731
            appends_per_second(2, args.threads)  # warm up
            rates["none"].append(appends_per_second(args.append_seconds, args.threads))
            rates["poll"].append(appends_beside_the_relay(var / "relay-poll.log", args))
            polled = kombu_bench.lag(args.rate, args.seconds, args.keys, args.producers, 3_000_000,
                                     var / "relay-poll-lag.log", consumer_factory=consumer)

            cdc.cdc_setup()
            os.environ["BACKPLANE_OUTBOX_RELAY_MODE"] = settings.BACKPLANE_OUTBOX_RELAY_MODE = "cdc"
            directory = var / "connect"
            directory.mkdir(parents=True, exist_ok=True)
            connect = ConnectWorker(directory)
            (directory / "worker.properties").write_text(
                cdc.properties_text(cdc.worker_properties(state_dir=directory, rest_port=connect.rest_port)))
            (directory / "connector.properties").write_text(cdc.properties_text(cdc.connector_properties()))
            connect.start()
            assert connect.pid is not None
            connect_cpu, started = kombu_bench.cpu_seconds(connect.pid), time.perf_counter()
            captured = kombu_bench.lag(args.rate, args.seconds, args.keys, args.producers, 4_000_000,
                                       var / "relay-cdc-lag.log", consumer_factory=consumer)
            connect_share = (kombu_bench.cpu_seconds(connect.pid) - connect_cpu) / (time.perf_counter() - started)
            rates["cdc"].append(appends_beside_the_relay(var / "relay-cdc.log", args))
            # Drain: a backlog committed while Connect is down, published once it is back.
            connect.stop()
            kombu_bench.enqueue(5_000_000, args.messages, args.keys)
            counter = relay_kafka.KafkaConsumer(cluster.bootstrap, TOPIC)
            counter.start()
            counter.ready.wait()
            connect.start()
            if not kombu_bench.wait_for(lambda: len(counter.arrivals) >= args.messages, 300):
                raise SystemExit(f"Debezium published {len(counter.arrivals)} of {args.messages} within 300 s")
            counter.stopping.set()
            counter.join(timeout=10)
            arrived = sorted(at for _, _, at in counter.arrivals)
            cdc_drain = (len(arrived) - 1) / (arrived[-1] - arrived[0])
            relay = kombu_bench.start_relay(var / "relay-cdc-drain.log")
            try:
                drain()
            finally:
                kombu_bench.stop_relay(relay)
            connect.stop()
            connect = None
            # The polling relay on the same backlog, and the raw producer, in the same run.
            os.environ["BACKPLANE_OUTBOX_RELAY_MODE"] = settings.BACKPLANE_OUTBOX_RELAY_MODE = "poll"
            poll_drain, _, _ = kombu_bench.relay_max(args.messages, args.keys, first=6_000_000)
            raw = relay_kafka.raw_produce(cluster.bootstrap, "bench-raw", args.messages, args.keys)
            rates["none"].append(appends_per_second(args.append_seconds, args.threads))
            cdc.cdc_teardown()
    finally:
        if connect is not None:
            connect.kill()
        cluster.stop()

    none = statistics.mean(rates["none"])
    print(f"CDC bench (1 KRaft node, {relay_kafka.PARTITIONS} partitions, embedded PostgreSQL, same run)")
    print(f"  appends with one outbox message each, {args.threads} threads in process, {args.append_seconds:.0f} s:")
    print(f"    nothing relaying: {none:7.0f}/s  (before {rates['none'][0]:.0f}, after {rates['none'][1]:.0f})")
    for mode in ("poll", "cdc"):
        print(f"    {mode + ' relay running:':17} {rates[mode][0]:7.0f}/s  ratio to none {rates[mode][0] / none:.2f}")
    print(f"  a backlog of {args.messages} messages over {args.keys} keys: raw confluent-kafka producer {raw:.0f} "
          f"msgs/s; polling relay {poll_drain:.0f} ({poll_drain / raw:.2f} x raw); CDC, first to last record "
          f"{cdc_drain:.0f} ({cdc_drain / raw:.2f} x raw)")
    for name, result in (("polling relay", polled), ("CDC (Debezium)", captured)):
        print(f"  lag, {name}, {args.rate:.0f} msgs/s offered (achieved {result['achieved']:.0f}): "
              f"commit-to-consume {describe(result['lags_ms'])}")
        print(f"    commit -> delivered_at {describe(result['relay_ms'])}; relay process "
              f"{result['relay_cpu']:.0%} of a core; sent {result['sent']}, received {result['received']}, "
              f"duplicates {result['duplicates']}, per-key order inversions {result['inversions']}"
              f"{'' if result['drained'] else ', NOT all received'}")
    print(f"    Kafka Connect (Debezium) during the CDC lag phase: {connect_share:.0%} of a core")


if __name__ == "__main__":
    main()
