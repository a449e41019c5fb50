"""Which Python Kafka client the relay publishes with: confluent-kafka (librdkafka, bundled in
its wheel) against aiokafka (pure Python on asyncio), side by side against one private KRaft
broker in the same run.

    .venv/bin/python bench/kafka_clients.py [--messages 50000] [--rounds 2]

Both publish the same envelope-shaped JSON messages (the relay's size, 200 keys) with the
settings the relay needs: an idempotent producer, ``acks=all``, and a message counted only when
its acknowledgement arrived. Two shapes each, in alternating rounds:
- ``stream``: every message handed over at once, then every acknowledgement awaited (the
  producer's own batching: what a client can do at best);
- ``claims of 100``: 100 messages, then their acknowledgements, then the next 100 (the relay's
  shape: a claim is delivered, then marked, so its acknowledgements are awaited per claim).
The client also pays its CPU in the relay's process, which shares 2 cores with the web and the
database here, so CPU seconds per 10,000 messages are printed beside the rates.

Needs ``make kafka-jars`` (the broker) and aiokafka, which only this bench uses:
``.venv/bin/pip install aiokafka==0.14.0``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.kafka import KafkaCluster, kafka_missing_reason  # noqa: E402

TOPIC = "bench-clients"
KEYS = 200
CLAIM = 100


def messages(count: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    out = []
    for n in range(count):
        message_id = str(uuid.uuid4())
        envelope = {
            "message_id": message_id, "topic": "backplane.tasks.bench", "key": f"bench-{n % KEYS}",
            "payload": {"task_id": str(uuid.UUID(int=n % KEYS)), "namespace": "bench", "status": "completed",
                        "output": {"n": n, "result": "ok"}},
            "headers": {"seq": n, "event_hash": "ab" * 32, "attempt": 1},
        }
        headers = [("message_id", message_id.encode()), ("namespace", b"bench"), ("topic", b"backplane.tasks.bench")]
        out.append((f"bench-{n % KEYS}".encode(), json.dumps(envelope).encode(), headers))
    return out


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def confluent(bootstrap: str, batch: list[Any], claim: int | None) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    failures: list[Any] = []

    def acknowledged(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    step = claim or len(batch)
    for start in range(0, len(batch), step):
        for key, value, headers in batch[start:start + step]:
            while True:
                try:
                    producer.produce(TOPIC, value=value, key=key, headers=headers, on_delivery=acknowledged)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(30) != 0:
            raise RuntimeError("confluent-kafka: messages left unacknowledged")
    if failures:
        raise RuntimeError(f"confluent-kafka: {failures[:3]}")


def aiokafka(bootstrap: str, batch: list[Any], claim: int | None) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5)
        await producer.start()
        try:
            step = claim or len(batch)
            for start in range(0, len(batch), step):
                futures = [await producer.send(TOPIC, value=value, key=key, headers=headers)
                           for key, value, headers in batch[start:start + step]]
                await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    if reason := kafka_missing_reason():
        print(reason, file=sys.stderr)
        return 2
    batch = messages(args.messages)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    cluster = KafkaCluster(1).start()
    try:
        cluster.create_topic(TOPIC, partitions=6)
        confluent(cluster.bootstrap, batch[:1000], None)  # warm up: metadata, producer id
        aiokafka(cluster.bootstrap, batch[:1000], None)
        for _ in range(args.rounds):
            for client in (confluent, aiokafka):
                for shape, claim in (("stream", None), (f"claims of {CLAIM}", CLAIM)):
                    cpu, started = cpu_seconds(), time.perf_counter()
                    client(cluster.bootstrap, batch, claim)
                    elapsed, used = time.perf_counter() - started, cpu_seconds() - cpu
                    results.setdefault((client.__name__, shape), []).append((elapsed, used))
    finally:
        cluster.stop()
    print(f"| client | shape | messages/s (best of {args.rounds}) | CPU s per 10,000 |")
    print("| --- | --- | ---: | ---: |")
    for (client_name, shape), runs in results.items():
        elapsed, used = min(runs)
        print(f"| {client_name} | {shape} | {args.messages / elapsed:,.0f} | {used / args.messages * 10_000:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
