"""The outbox relay to Kafka beside the raw producer, on one private KRaft node, in one run.

    .venv/bin/python bench/relay_kafka.py [--messages 20000] [--keys 200] [--seconds 10] [--fractions 0.5]

The phases of bench/relay.py, with Kafka for the broker (``BACKPLANE_OUTBOX_BROKER_URL`` is the
node's ``kafka://`` URL, so ``Sinks()`` and ``manage.py relay`` publish with the Kafka sink):
1. Raw: a confluent-kafka producer with the relay's settings (idempotent, ``acks=all``) handing
   over the same envelopes, then waiting for every acknowledgement; before and after phase 2.
2. Relay maximum: the messages committed into the outbox first, then ``outbox_relay_until_idle``
   in process until nothing is pending (a claim takes at most one message per key): one claim
   at a time. Then the same with the relay process's lanes (``LaneRunner``, as ``manage.py
   relay`` and the worker run them): ``BACKPLANE_OUTBOX_BROKER_CONCURRENCY`` claims in flight.
3. The bounds of the relay's guarantees, same node, same backlog shape: the raw producer kept to
   the relay's ordering rule (one message of each key in flight: rounds of one message per key,
   each round's acknowledgements awaited before the next), and the relay's own statements
   (its claim and its mark) with the publishes between them written as plainly as possible on
   one psycopg connection, no models, spans or lanes: what a polling relay that keeps these
   guarantees can do here, whatever its Python.
4. Lag: the real ``manage.py relay`` as a subprocess, producer threads committing one message per
   transaction at ``--fractions`` of the relay maximum; a consumer thread reads the Kafka topic.
   Lag = consumed minus committed, split at the row's ``delivered_at``.
Needs ``make kafka-jars``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _support import ROOT, bench_database, describe, percentile

sys.path.insert(0, str(ROOT))

import relay as kombu_bench  # noqa: E402 - bench/relay.py: the phases, shared

from tests.support.kafka import KafkaCluster, kafka_missing_reason  # noqa: E402

PARTITIONS = 6


def raw_producer(bootstrap: str) -> Any:
    """A confluent-kafka producer with the relay's guarantees (idempotent, ``acks=all``), as the
    baselines and the plain relay use it."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})


def raw_produce(bootstrap: str, topic: str, messages: int, keys: int, *, in_rounds: bool = False) -> float:
    """The raw producer's rate over the same envelopes, waiting for every acknowledgement.
    ``in_rounds``: kept to the relay's per-key rule, a key's next message handed over only once its
    previous one is acknowledged (rounds of one message per key, each flushed before the next)."""
    bodies = [kombu_bench.raw_envelope(n, keys) for n in range(messages)]
    producer = raw_producer(bootstrap)
    failures: list[Any] = []
    round_size = keys if in_rounds else messages
    started = time.perf_counter()
    for first in range(0, messages, round_size):
        for body in bodies[first:first + round_size]:
            headers = [("message_id", body["message_id"]), ("topic", body["topic"]), ("attempt", "1")]
            while True:
                try:
                    producer.produce(topic, value=json.dumps(body, separators=(",", ":"), sort_keys=True).encode(),
                                     key=body["key"].encode(), headers=headers,
                                     on_delivery=lambda error, _m: error and failures.append(error))
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        if left := producer.flush(60):
            break
    elapsed = time.perf_counter() - started
    if left or failures:
        raise SystemExit(f"raw producer: {left} unacknowledged, {len(failures)} refused")
    return messages / elapsed


def plain_relay(url: str, bootstrap: str, topic: str, messages: int, keys: int, first: int, lanes: int = 1) -> float:
    """The relay's claim (``relay._CLAIM_SQL`` over its window) and mark, and the publishes
    between them, with nothing else: no models, spans or lanes of the product's. ``lanes``
    threads, each on a psycopg connection and a producer of its own, claiming ``keys // lanes``
    messages at a time, so the rounds overlap as the product's lanes do."""
    import uuid
    from datetime import UTC, datetime, timedelta

    import psycopg

    from backplane.delivery import relay
    from backplane.delivery.policy import BROKER_LANE

    window = relay._CLAIM_WINDOW_SQL.format(lane=relay._lane_condition(BROKER_LANE),
                                            earlier_lane=relay._lane_condition(BROKER_LANE, "earlier"),
                                            claimable=relay._CLAIMABLE)
    claim_sql = relay._CLAIM_SQL.format(claimable_ids=window)
    # outbox_mark_delivered's update, as one statement.
    mark_sql = ("UPDATE backplane_outboxmessage SET status = 'delivered', delivered_at = now(), last_error = '',"
                " claimed_until = NULL, claim_token = NULL WHERE id = ANY(%s) AND claim_token = %s"
                " AND status = 'pending'")
    columns = [field.attname for field in relay.OutboxMessage._meta.concrete_fields]
    at = {name: columns.index(name) for name in ("id", "message_id", "topic", "key", "payload", "headers",
                                                  "attempts")}
    limit = max(1, keys // lanes)
    kombu_bench.enqueue(first, messages, keys)
    done = [0] * lanes
    failures: list[Any] = []
    # A lane that fails before it starts breaks the barrier rather than leaving the others waiting.
    started = threading.Barrier(lanes + 1, timeout=120)

    def lane(index: int) -> None:
        producer = raw_producer(bootstrap)
        producer.produce(topic, b"warm-up")
        producer.flush(30)
        with psycopg.connect(url) as conn:
            started.wait()
            while not failures:
                now, token = datetime.now(UTC), uuid.uuid4()
                rows = conn.execute(claim_sql, {"now": now, "limit": limit, "window": limit * 2, "lane": None,
                                                "until": now + timedelta(seconds=30), "token": token}).fetchall()
                conn.commit()
                if not rows:
                    return
                for row in rows:
                    body = {"message_id": str(row[at["message_id"]]), "topic": row[at["topic"]],
                            "key": row[at["key"]], "payload": row[at["payload"]],
                            "headers": {**row[at["headers"]], "attempt": row[at["attempts"]]}}
                    producer.produce(topic, value=json.dumps(body, separators=(",", ":"), sort_keys=True).encode(),
                                     key=body["key"].encode(), headers=[("message_id", body["message_id"]),
                                                                        ("topic", body["topic"])],
                                     on_delivery=lambda error, _m: error and failures.append(error))
                if producer.flush(60):
                    failures.append("unacknowledged")
                    return
                conn.execute(mark_sql, [[row[at["id"]] for row in rows], token])
                conn.commit()
                done[index] += len(rows)

    threads = [threading.Thread(target=lane, args=(index,)) for index in range(lanes)]
    for thread in threads:
        thread.start()
    started.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if failures or sum(done) != messages:
        raise SystemExit(f"plain relay delivered {sum(done)} of {messages}; {len(failures)} refused")
    return messages / elapsed


def relay_lanes(messages: int, keys: int, first: int) -> float:
    """The relay process's delivery lanes (backplane/delivery/lanes.py) draining the outbox."""
    from backplane.delivery.lanes import LaneRunner

    kombu_bench.enqueue(first, messages, keys)
    runner = LaneRunner()
    started = time.perf_counter()
    try:
        while kombu_bench.pending():
            runner.tick()
            time.sleep(0.02)
        return messages / (time.perf_counter() - started)
    finally:
        runner.stop()


def count(bootstrap: str, topic: str) -> int:
    """Messages in a topic: the sum of its partitions' end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{secrets.token_hex(4)}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()


class KafkaConsumer(threading.Thread):
    """Reads the relay's topic from its end, noting when each message_id arrived (bench/relay.py's
    ``Consumer``, on Kafka)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.arrivals: list[tuple[str, str, float]] = []
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from confluent_kafka import Consumer

        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"lag-{secrets.token_hex(4)}",
                                 "auto.offset.reset": "latest", "enable.auto.commit": False,
                                 "fetch.wait.max.ms": 10})
            assigned = threading.Event()
            consumer.subscribe([self.topic], on_assign=lambda c, partitions: assigned.set())
            while not assigned.is_set() and not self.stopping.is_set():
                consumer.poll(0.1)
            self.ready.set()
            while not self.stopping.is_set():
                message = consumer.poll(0.1)
                if message is not None and message.error() is None:
                    body = json.loads(message.value())
                    self.arrivals.append((body["message_id"], body["key"], time.time()))
            consumer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            self.ready.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--fractions", default="0.5")
    args = parser.parse_args()
    if reason := kafka_missing_reason():
        raise SystemExit(reason)
    cluster = KafkaCluster(1).start()
    try:
        topic = "bench-relay"
        cluster.create_topic(topic, partitions=PARTITIONS)
        raw_topic = "bench-raw"
        cluster.create_topic(raw_topic, partitions=PARTITIONS)
        os.environ["BACKPLANE_OUTBOX_BROKER_URL"] = f"kafka://{cluster.bootstrap}"
        os.environ["BACKPLANE_OUTBOX_KAFKA_TOPIC"] = topic
        with bench_database() as url:
            from django.conf import settings

            raw_produce(cluster.bootstrap, raw_topic, 2000, args.keys)  # warm up
            raw_before = raw_produce(cluster.bootstrap, raw_topic, args.messages, args.keys)
            relay_rate, timed, enqueue_rate = kombu_bench.relay_max(args.messages, args.keys)
            relayed = count(cluster.bootstrap, topic)
            lanes_rate = relay_lanes(args.messages, args.keys, first=2_000_000)
            concurrency = settings.BACKPLANE_OUTBOX_BROKER_CONCURRENCY
            plain_rate = plain_relay(url, cluster.bootstrap, topic, args.messages, args.keys, first=3_000_000)
            plain_lanes_rate = plain_relay(url, cluster.bootstrap, topic, args.messages, args.keys, first=3_500_000,
                                           lanes=concurrency)
            rounds_rate = raw_produce(cluster.bootstrap, raw_topic, args.messages, args.keys, in_rounds=True)
            raw_after = raw_produce(cluster.bootstrap, raw_topic, args.messages, args.keys)
            raw_rate = (raw_before + raw_after) / 2
            log = Path(settings.VAR_DIR) / "bench-relay-kafka.log"
            results = []
            for index, fraction in enumerate(float(f) for f in args.fractions.split(",")):
                first = 4_000_000 + index * 1_000_000
                results.append((fraction, kombu_bench.lag(
                    relay_rate * fraction, args.seconds, args.keys, args.producers, first, log,
                    consumer_factory=lambda: KafkaConsumer(cluster.bootstrap, topic))))
    finally:
        cluster.stop()

    ratio = relay_rate / raw_rate
    print(f"relay bench on Kafka (1 KRaft node, {PARTITIONS} partitions): {args.messages} messages over "
          f"{args.keys} keys, same node, same run")
    print(f"  raw confluent-kafka producer (idempotent, acks=all): {raw_rate:9.0f} msgs/s  (before the relay "
          f"{raw_before:.0f}, after {raw_after:.0f})")
    print(f"  relay, outbox_relay_until_idle:      {relay_rate:9.0f} msgs/s  ratio to raw {ratio:.2f}"
          f"  target >= 0.50: {'met' if ratio >= 0.5 else 'NOT met'}  (topic holds {relayed} of {args.messages})")
    print(f"  relay lanes (LaneRunner, {concurrency} broker lanes): {lanes_rate:9.0f} msgs/s  ratio to raw "
          f"{lanes_rate / raw_rate:.2f}")
    print(f"  the bounds of these guarantees: the relay's claim and mark with plain publishes between them "
          f"{plain_rate:.0f} msgs/s ({plain_rate / raw_rate:.2f} x raw), in {concurrency} lanes "
          f"{plain_lanes_rate:.0f} ({plain_lanes_rate / raw_rate:.2f} x raw); the raw producer in rounds of one "
          f"message per key {rounds_rate:.0f} msgs/s ({rounds_rate / raw_rate:.2f} x raw)")
    batches = max(timed.claims, 1)
    print(f"    {timed.claims} batches, {args.messages / batches:.1f} msgs/batch; per message "
          f"{1e6 / relay_rate:.0f} us: publish call {timed.publish_seconds / args.messages * 1e6:.0f}, "
          f"SQL {timed.sql_seconds / args.messages * 1e6:.0f}; enqueue beforehand {enqueue_rate:.0f} msgs/s")
    for fraction, result in results:
        lags = result["lags_ms"]
        p99 = percentile(lags, 99)
        target = f"  target p99 < 1 s: {'met' if p99 < 1000 else 'NOT met'}" if fraction == 0.5 else ""
        print(f"  lag at {fraction:.2f} x relay max ({result['offered']:.0f} msgs/s offered, achieved "
              f"{result['achieved']:.0f}): commit-to-consume {describe(lags)}{target}")
        print(f"    commit -> delivered_at {describe(result['relay_ms'])}; delivered_at -> consumed "
              f"{describe(result['broker_ms'])}; relay process {result['relay_cpu']:.0%} of a core; sent "
              f"{result['sent']}, received {result['received']}, duplicates {result['duplicates']}, per-key "
              f"order inversions {result['inversions']}{'' if result['drained'] else ', NOT all received'}")


if __name__ == "__main__":
    main()
