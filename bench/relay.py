"""Outbox relay throughput and commit-to-consume lag through the kombu sink, beside a raw
kombu publish loop to the same broker in the same run.

    .venv/bin/python bench/relay.py [--messages 5000] [--keys 50] [--seconds 10] [--fractions 0.5]

Runs on the embedded filesystem broker, and also on Redis when ``REDIS_URL`` is set (each
broker in its own child process, since the settings choose the broker from the environment;
``--broker filesystem|redis`` runs one). ``BACKPLANE_OUTBOX_BROKER_URL`` is ignored: the bench
measures the default, the Celery broker.

Phases, per broker:
1. Baseline ("raw"): a kombu producer publishing envelope-shaped JSON messages (same fields and
   size as the relay's) to the same topic exchange with the same publish arguments, in a tight
   loop. A queue bound with ``#`` stores them; it is counted and purged after each phase. It
   runs before and after phase 2, and the mean is the baseline: the two say how much the
   machine drifted in between.
2. Relay maximum: the messages are committed into the outbox first (spread over ``--keys``
   keys), then ``outbox_relay_until_idle`` runs in process with ``Sinks()`` until nothing is
   pending. Per-key order lets a batch take at most one message of each key.
3. Lag: the real ``manage.py relay`` (woken by NOTIFY) runs as a subprocess; producer threads
   commit one message per transaction, paced at ``--fractions`` of the relay maximum (the
   target is at 0.5), for ``--seconds``; a consumer thread drains the ``#`` queue. Lag =
   consume time minus the moment the producer's commit returned (same process, same clock),
   also split at the row's ``delivered_at``. On the filesystem broker the consumer reads with
   a locking reader (see ``locking_filesystem_transport``): kombu's own loses messages here.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _support import ROOT, bench_database, describe, percentile

TOPIC = "backplane.tasks.bench"
QUEUE = "bench-relay"
EVENT_HASH = "ab" * 32


def message_body(n: int, keys: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """Key, payload and headers shaped like a lifecycle message (lifecycle_message)."""
    task_id = str(uuid.UUID(int=n % keys))
    payload = {
        "task_id": task_id, "namespace": "bench", "kind": "bench", "status": "completed",
        "previous_status": "running", "attempts": 1, "output": {"n": n, "result": "ok"}, "error": None,
    }
    headers = {"task_id": task_id, "seq": n, "event_hash": EVENT_HASH, "created_at": "2026-11-29T12:00:00.000000Z"}
    return f"bench-{n % keys}", payload, headers


def raw_envelope(n: int, keys: int) -> dict[str, Any]:
    """The same shape ``relay.envelope`` gives a first attempt."""
    key, payload, headers = message_body(n, keys)
    return {"message_id": str(uuid.uuid4()), "topic": TOPIC, "key": key, "payload": payload,
            "headers": {**headers, "attempt": 1}}


def locking_filesystem_transport() -> type:
    """kombu's filesystem transport with a reader that cannot take a half-written message.

    The stock ``_get`` moves and reads a queue file without looking at the writer's lock, and a
    publisher in another process creates the file before it writes it: a consumer that polls
    while the relay publishes reads an empty file, raises JSONDecodeError from drain_events and
    the message is gone (celery/kombu#1551). This reader takes the file's lock first and leaves
    empty or locked files for a later poll. Only the bench's consumer uses it; publishers are stock.
    """
    import fcntl

    from kombu.transport import filesystem
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    class Channel(filesystem.Channel):
        def _get(self, queue):  # type: ignore[no-untyped-def]
            wanted = f"{queue}.msg"
            for filename in sorted(os.listdir(self.data_folder_in)):
                if filename.partition(".")[2] != wanted:
                    continue
                path = os.path.join(self.data_folder_in, filename)
                try:
                    with open(path, "rb") as f:
                        try:
                            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except BlockingIOError:
                            continue  # being written
                        payload = f.read()
                        if not payload:
                            continue  # created, not written yet
                        os.remove(path)
                except FileNotFoundError:
                    continue  # taken by another reader
                return loads(bytes_to_str(payload))
            raise filesystem.Empty()

    class Transport(filesystem.Transport):
        pass

    Transport.Channel = Channel
    return Transport


class Broker:
    """The bench's own connection to the broker the relay publishes to, with a ``#`` queue."""

    def __init__(self, polling_interval: float | None = None) -> None:
        from django.conf import settings
        from kombu import Connection, Exchange, Queue

        self.url = settings.BACKPLANE_OUTBOX_BROKER_URL
        # What KombuSink passes: the Celery transport options when the URLs agree.
        options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS) if self.url == settings.CELERY_BROKER_URL else {}
        if polling_interval is not None:
            options["polling_interval"] = polling_interval
        if polling_interval is not None and self.url.startswith("filesystem:"):
            # The consumer: same folders, a reader that waits for complete files.
            self.connection = Connection(transport=locking_filesystem_transport(), transport_options=options)
        else:
            self.connection = Connection(self.url, transport_options=options, connect_timeout=3)
        self.connection.ensure_connection(max_retries=1)
        self.exchange = Exchange(settings.BACKPLANE_OUTBOX_EXCHANGE, type="topic", durable=True)
        self.queue = Queue(QUEUE, self.exchange, routing_key="#")
        self.channel = self.connection.channel()
        self.queue(self.channel).declare()  # declares the exchange and the binding too

    def size(self) -> int:
        _, count, _ = self.queue(self.channel).queue_declare(passive=True)
        return int(count)

    def purge(self) -> int:
        return int(self.queue(self.channel).purge() or 0)

    def close(self) -> None:
        self.connection.release()


def raw_publish(broker: Broker, messages: int, keys: int) -> float:
    producer = broker.connection.Producer(serializer="json")
    bodies = [raw_envelope(n, keys) for n in range(messages)]
    started = time.perf_counter()
    for body in bodies:
        producer.publish(
            body, exchange=broker.exchange, routing_key=TOPIC, delivery_mode=2,
            message_id=body["message_id"], headers={"backplane-message-id": body["message_id"]}, retry=False,
        )
    return messages / (time.perf_counter() - started)


def enqueue(first: int, count: int, keys: int, chunk: int = 500) -> None:
    from django.db import transaction
    from django.utils import timezone

    from backplane.delivery.outbox import outbox_enqueue

    for start in range(first, first + count, chunk):
        with transaction.atomic():
            now = timezone.now()
            for n in range(start, min(start + chunk, first + count)):
                key, payload, headers = message_body(n, keys)
                outbox_enqueue(topic=TOPIC, key=key, payload=payload, headers=headers, now=now)


def pending() -> int:
    from backplane.delivery.models import OutboxMessage, OutboxStatus

    return OutboxMessage.objects.filter(status=OutboxStatus.PENDING).count()


class Timed:
    """Wraps the publisher and the SQL of the relay to say where a batch's time goes."""

    def __init__(self, publish: Callable[..., Any]) -> None:
        self.publish = publish
        self.publish_seconds = 0.0
        self.sql_seconds = 0.0
        self.claim_seconds = 0.0
        self.claims = 0

    def __call__(self, message: Any, body: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            # The sink's answer: an acknowledgement to wait for (Kafka's), or None.
            return self.publish(message, body)
        finally:
            self.publish_seconds += time.perf_counter() - started

    def sql(self, execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            self.sql_seconds += elapsed
            if "SKIP LOCKED" in sql and "backplane_outboxmessage" in sql:
                self.claims += 1
                self.claim_seconds += elapsed


def relay_max(messages: int, keys: int, first: int = 0) -> tuple[float, Timed, float]:
    from django.db import connection

    from backplane.delivery.relay import outbox_relay_until_idle
    from backplane.delivery.sinks import Sinks

    started = time.perf_counter()
    enqueue(first, messages, keys)
    enqueue_rate = messages / (time.perf_counter() - started)
    sinks = Sinks()
    timed = Timed(sinks)
    delivered = 0
    with connection.execute_wrapper(timed.sql):
        started = time.perf_counter()
        while True:
            step = outbox_relay_until_idle(publish=timed, budget_seconds=60)
            delivered += step.delivered
            if step.claimed == 0 or step.delivered == 0:
                break
        elapsed = time.perf_counter() - started
    sinks.close()
    left = pending()
    if delivered != messages or left:
        raise SystemExit(f"relay delivered {delivered} of {messages}, {left} still pending")
    return delivered / elapsed, timed, enqueue_rate


class Consumer(threading.Thread):
    """Drains the ``#`` queue, noting when each message_id arrived."""

    def __init__(self, polling_interval: float) -> None:
        super().__init__(daemon=True)
        self.polling_interval = polling_interval
        self.arrivals: list[tuple[str, str, float]] = []  # (message_id, key, time.time())
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            broker = Broker(polling_interval=self.polling_interval)

            def on_message(body: dict[str, Any], message: Any) -> None:
                self.arrivals.append((body["message_id"], body["key"], time.time()))

            with broker.connection.Consumer(broker.queue, callbacks=[on_message], no_ack=True, accept=["json"]):
                self.ready.set()
                while not self.stopping.is_set():
                    try:
                        broker.connection.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
            broker.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc
            self.ready.set()


def start_relay(log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "BACKPLANE_ENV": "test", "BACKPLANE_DB_POOL": "0"}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "relay"], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc; nan elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_relay(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def lag(rate: float, seconds: float, keys: int, producers: int, first: int, log: Path,
        consumer_factory: Callable[[], Any] | None = None) -> dict[str, Any]:
    """``consumer_factory``: a thread like ``Consumer`` reading another broker (bench/relay_kafka.py)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from backplane.delivery.models import OutboxMessage
    from backplane.delivery.outbox import outbox_enqueue

    consumer = consumer_factory() if consumer_factory else Consumer(polling_interval=0.01)
    consumer.start()
    consumer.ready.wait()
    if consumer.error:
        raise consumer.error
    relay = start_relay(log)
    try:
        # Warm-up: the relay is up, listening and connected once this one arrives.
        enqueue(first, 1, keys)
        if not wait_for(lambda: len(consumer.arrivals) >= 1 or relay.poll() is not None, 60) or not consumer.arrivals:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise SystemExit("the relay delivered nothing within 60 s (exit code "
                             f"{relay.poll()}); {log} ends with:\n" + "\n".join(tail))
        consumer.arrivals.clear()

        total = int(rate * seconds)
        committed: dict[str, float] = {}
        counter = itertools.count()
        counter_lock = threading.Lock()
        behind: list[float] = []
        t0 = time.perf_counter() + 0.1

        txn_ms: list[float] = []  # the producers' own enqueue-and-commit times: stalls of the database show here

        def produce() -> None:
            local_behind = 0.0
            local_txn: list[float] = []
            try:
                while True:
                    with counter_lock:
                        i = next(counter)
                    if i >= total:
                        return
                    due = t0 + i / rate
                    now = time.perf_counter()
                    if due > now:
                        time.sleep(due - now)
                    else:
                        local_behind = max(local_behind, now - due)
                    n = first + 1 + i
                    key, payload, headers = message_body(n, keys)
                    started = time.perf_counter()
                    with transaction.atomic():
                        rows = outbox_enqueue(topic=TOPIC, key=key, payload=payload, headers=headers,
                                              now=timezone.now())
                    committed[str(rows[0].message_id)] = time.time()
                    local_txn.append((time.perf_counter() - started) * 1000)
            finally:
                behind.append(local_behind)
                txn_ms.extend(local_txn)
                connection.close()

        threads = [threading.Thread(target=produce) for _ in range(producers)]
        relay_cpu, bench_cpu = cpu_seconds(relay.pid), cpu_seconds(os.getpid())
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        produced_seconds = time.perf_counter() - t0
        drained = wait_for(lambda: len(consumer.arrivals) >= total, 30)
        wall = time.perf_counter() - t0
        relay_cpu, bench_cpu = cpu_seconds(relay.pid) - relay_cpu, cpu_seconds(os.getpid()) - bench_cpu
    finally:
        stop_relay(relay)
        consumer.stopping.set()
        consumer.join(timeout=5)
    if consumer.error is not None:
        print(f"  consumer thread died: {consumer.error!r}", file=sys.stderr)

    arrivals = consumer.arrivals
    seen: set[str] = set()
    lags_ms: list[float] = []
    duplicates = 0
    for message_id, _key, at in arrivals:
        if message_id in seen:
            duplicates += 1
            continue
        seen.add(message_id)
        if message_id in committed:
            lags_ms.append((at - committed[message_id]) * 1000)
    # Where the lag is: commit -> delivered_at (the relay: wake, claim, publish; its clock is
    # this machine's wall clock too) and delivered_at -> consumed (the broker and the consumer).
    rows = OutboxMessage.objects.filter(message_id__in=list(seen)).values_list("message_id", "id", "delivered_at")
    ids = {message_id: row_id for message_id, row_id, _ in rows}
    delivered_at = {str(message_id): at.timestamp() for message_id, _, at in rows if at is not None}
    consumed_at = {message_id: at for message_id, _key, at in arrivals}
    relay_ms = [(delivered_at[m] - committed[m]) * 1000 for m in committed if m in delivered_at]
    broker_ms = [(consumed_at[m] - delivered_at[m]) * 1000 for m in committed if m in delivered_at and m in consumed_at]
    # Per-key order at the consumer, against the outbox id order the relay promises.
    last: dict[str, int] = {}
    inversions = 0
    for message_id, key, _at in arrivals:
        row_id = ids.get(uuid.UUID(message_id))
        if row_id is None:
            continue
        if row_id < last.get(key, 0):
            inversions += 1
        last[key] = max(row_id, last.get(key, 0))
    return {
        "offered": rate, "achieved": len(committed) / produced_seconds, "sent": len(committed),
        "received": len(seen), "duplicates": duplicates, "inversions": inversions, "drained": drained,
        "lags_ms": lags_ms, "behind_s": max(behind) if behind else 0.0, "relay_ms": relay_ms, "broker_ms": broker_ms,
        "relay_cpu": relay_cpu / wall, "bench_cpu": bench_cpu / wall, "txn_ms": txn_ms,
    }


def run(args: argparse.Namespace) -> None:
    if args.broker == "filesystem":
        os.environ.pop("REDIS_URL", None)
    elif not os.environ.get("REDIS_URL"):
        raise SystemExit("--broker redis needs REDIS_URL")
    os.environ.pop("BACKPLANE_OUTBOX_BROKER_URL", None)

    with bench_database():
        from django.conf import settings
        from kombu.utils.url import maybe_sanitize_url

        load_before = os.getloadavg()[0]
        broker = Broker()
        broker.purge()
        size = len(json.dumps(raw_envelope(0, args.keys)).encode())

        # Raw before and after the relay: the spread says how much the machine drifted meanwhile.
        raw_before = raw_publish(broker, args.messages, args.keys)
        stored = broker.size()
        broker.purge()

        relay_rate, timed, enqueue_rate = relay_max(args.messages, args.keys)
        relayed = broker.size()
        broker.purge()

        raw_after = raw_publish(broker, args.messages, args.keys)
        stored += broker.size()
        broker.purge()
        broker.close()
        raw_rate = (raw_before + raw_after) / 2

        log = Path(settings.VAR_DIR) / "bench-relay.log"
        results = []
        try:
            for index, fraction in enumerate(args.fractions):
                first = args.messages + index * 1_000_000
                results.append((fraction, lag(relay_rate * fraction, args.seconds, args.keys, args.producers,
                                              first, log)))
        finally:
            # The database and the broker folders are thrown away; a Redis is not: unbind the queue.
            cleanup = Broker()
            cleanup.queue(cleanup.channel).delete()
            cleanup.close()

    ratio = relay_rate / raw_rate
    batches = max(timed.claims, 1)
    load_after = os.getloadavg()[0]
    print(f"relay bench on {maybe_sanitize_url(broker.url)}: {args.messages} messages over {args.keys} keys, "
          f"envelope {size} bytes, same broker, same run (load average {load_before:.1f} -> {load_after:.1f})")
    print(f"  raw kombu publish loop:              {raw_rate:9.0f} msgs/s  (before the relay {raw_before:.0f}, "
          f"after {raw_after:.0f}; queue held {stored} of {2 * args.messages})")
    print(f"  relay, outbox_relay_until_idle:      {relay_rate:9.0f} msgs/s  ratio to raw {ratio:.2f}"
          f"  target >= 0.50: {'met' if ratio >= 0.5 else 'NOT met'}  (queue held {relayed} of {args.messages})")
    per_msg_us = 1e6 / relay_rate
    publish_us = timed.publish_seconds / args.messages * 1e6
    sql_us = timed.sql_seconds / args.messages * 1e6
    print(f"    {timed.claims} batches, {args.messages / batches:.1f} msgs/batch, claim query "
          f"{timed.claim_seconds / batches * 1000:.1f} ms/batch; per message {per_msg_us:.0f} us: "
          f"publish {publish_us:.0f}, SQL {sql_us:.0f} (claim {timed.claim_seconds / args.messages * 1e6:.0f}), "
          f"rest {per_msg_us - publish_us - sql_us:.0f}; enqueue beforehand {enqueue_rate:.0f} msgs/s")
    for fraction, result in results:
        lags = result["lags_ms"]
        p99 = percentile(lags, 99)
        target = f"  target p99 < 1 s: {'met' if p99 < 1000 else 'NOT met'}" if fraction == 0.5 else ""
        print(f"  lag at {fraction:.2f} x relay max ({result['offered']:.0f} msgs/s offered): `manage.py relay`, "
              f"1 msg/txn, {args.producers} producer threads, {args.seconds:.0f} s; achieved "
              f"{result['achieved']:.0f} msgs/s (producers at most {result['behind_s'] * 1000:.0f} ms behind; "
              f"their enqueue+commit {describe(result['txn_ms'])}, max {max(result['txn_ms']):.0f} ms)")
        print(f"    commit-to-consume: {describe(lags)}, max {max(lags) if lags else float('nan'):.2f} ms{target}")
        print(f"    split at the row's delivered_at: commit -> delivered_at {describe(result['relay_ms'])}; "
              f"delivered_at -> consumed {describe(result['broker_ms'])}")
        print(f"    CPU while producing and draining: relay process {result['relay_cpu']:.0%} of a core, "
              f"this process (producers, consumer) {result['bench_cpu']:.0%}; sent {result['sent']}, "
              f"received {result['received']}, duplicates {result['duplicates']}, "
              f"per-key order inversions {result['inversions']}"
              f"{'' if result['drained'] else ', NOT all received within 30 s'}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--fractions", default="0.5",
                        help="comma-separated loads for the lag phase, as fractions of the relay maximum")
    parser.add_argument("--broker", choices=["filesystem", "redis"])
    args = parser.parse_args()
    fractions = args.fractions
    args.fractions = [float(f) for f in fractions.split(",")]
    if args.broker:
        run(args)
        return
    brokers = ["filesystem"] + (["redis"] if os.environ.get("REDIS_URL") else [])
    if len(brokers) == 1:
        args.broker = brokers[0]
        run(args)
        return
    for broker in brokers:  # a child each: the settings read the broker from the environment once
        subprocess.run([sys.executable, __file__, "--broker", broker, "--messages", str(args.messages),
                        "--keys", str(args.keys), "--seconds", str(args.seconds),
                        "--producers", str(args.producers), "--fractions", fractions], check=True)


if __name__ == "__main__":
    main()
