"""The event log as a stream (backplane/integrity/stream.py): what a run publishes, in which order,
where its cursor goes on success and on failure, one run at a time; and the offline verifier's
``verify-events`` over what a stream delivers. A real Kafka node: test_event_stream_kafka.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from backplane.delivery.relay import PublishError
from backplane.eventlog.models import Event
from backplane.integrity import sealing, stream
from backplane.integrity.audit import verify
from backplane.integrity.models import EventStreamCursor
from tests.backplane.integrity.audit_support import append, seed

Record = tuple[str, bytes, bytes, list[tuple[str, str]]]


class Recording(stream.EventProducer):
    """Keeps what a run hands to Kafka instead of sending it: this file tests the cursor and the
    records; the producer and the cluster are tested against a real node."""

    def __init__(self, fail: bool = False) -> None:
        self.records: list[Record] = []
        self.fail = fail

    def publish_all(self, records: list[Record]) -> None:
        if self.fail:
            raise PublishError("kafka: 3 event record(s) unacknowledged, 0 refused", timed_out=True)
        self.records.extend(records)


def test_a_run_publishes_the_sealed_events_per_namespace_in_seal_order_and_moves_its_cursor(
        db: None, settings: Any) -> None:
    settings.BACKPLANE_EVENT_STREAM_TOPIC_PREFIX = "events."
    acme, beta = seed(steps=3, namespace="acme"), seed(steps=2, namespace="beta")
    append(acme, 2)
    sealing.seal_new_events()
    unsealed = seed(steps=1, namespace="acme")  # not sealed yet: not streamed yet

    producer = Recording()
    step = stream.event_stream_once(producer=producer)

    sealed = list(Event.objects.exclude(task=unsealed).order_by("leaf__leaf_index"))
    assert (step.published, step.next_leaf) == (len(sealed), len(sealed))
    assert [(topic, key.decode()) for topic, key, _, _ in producer.records] == [
        (f"events.{event.task.namespace}", str(event.task_id)) for event in sealed]
    value = json.loads(producer.records[0][2])
    assert value["hash"] == sealed[0].hash and value["position"] == sealed[0].position
    assert dict(producer.records[0][3]) == {"task_id": str(sealed[0].task_id), "seq": "1", "hash": sealed[0].hash,
                                            "namespace": sealed[0].task.namespace, "leaf_index": "0"}
    assert EventStreamCursor.objects.get().next_leaf == len(sealed)
    assert stream.event_stream_lag() == 0
    assert {beta.namespace, acme.namespace} == {e.task.namespace for e in sealed}

    # The next run starts where this one ended.
    sealing.seal_new_events()
    assert stream.event_stream_lag() == 2  # the unsealed task's TaskStarted and its step
    again = Recording()
    assert stream.event_stream_once(producer=again).published == 2
    assert {key.decode() for _, key, _, _ in again.records} == {str(unsealed.pk)}


def test_a_failed_publish_leaves_the_cursor_and_releases_the_claim(db: None) -> None:
    seed(steps=2)
    sealing.seal_new_events()
    with pytest.raises(PublishError):
        stream.event_stream_once(producer=Recording(fail=True))
    cursor = EventStreamCursor.objects.get()
    assert (cursor.next_leaf, cursor.claim_token, cursor.claimed_until) == (0, None, None)
    assert stream.event_stream_lag() == 3
    producer = Recording()
    assert stream.event_stream_once(producer=producer).published == 3


def test_one_run_at_a_time_and_a_run_whose_lease_ran_out_does_not_move_the_cursor(
        committed_db: None) -> None:
    seed(steps=2)
    sealing.seal_new_events()
    started, release = threading.Event(), threading.Event()

    class Slow(Recording):
        def publish_all(self, records: list[Record]) -> None:
            started.set()
            release.wait(10)
            super().publish_all(records)

    slow = Slow()
    first = threading.Thread(target=lambda: stream.event_stream_once(producer=slow))
    first.start()
    try:
        assert started.wait(10)
        # Held: a second run finds the cursor claimed and does nothing.
        assert stream.event_stream_once(producer=Recording()).published == 0
        # The lease runs out; another run takes the leaves over and moves the cursor.
        EventStreamCursor.objects.update(claimed_until="2000-01-01T00:00:00Z")
        assert stream.event_stream_once(producer=Recording()).next_leaf == 3
    finally:
        release.set()
        first.join(10)
    # The late run published too (a repeat, the same records) but did not move the cursor back.
    assert len(slow.records) == 3
    assert EventStreamCursor.objects.get().next_leaf == 3


def test_a_leaf_whose_event_retention_removed_is_passed_over(db: None) -> None:
    from tests.backplane.integrity.audit_support import as_attacker

    task = seed(steps=2)
    sealing.seal_new_events()
    first = Event.objects.get(task=task, seq=1)
    as_attacker(("DELETE FROM backplane_event WHERE position = %s", [first.position]))
    step = stream.event_stream_once(producer=Recording())
    assert (step.published, step.skipped, step.next_leaf) == (2, 1, 3)


def _stream_lines(*tasks_steps: int) -> list[bytes]:
    producer = Recording()
    for steps in tasks_steps:
        seed(steps=steps)
    sealing.seal_new_events()
    stream.event_stream_once(producer=producer)
    return [value for _, _, value, _ in producer.records]


def test_verify_events_checks_every_chain_and_drops_exact_repeats(db: None) -> None:
    lines = _stream_lines(3, 2)
    summary = verify.verify_event_lines([*lines, *lines[2:4]], source="topic")
    assert (summary.events, summary.tasks, summary.repeats) == (7, 2, 2)


def test_verify_events_names_a_changed_payload_a_gap_and_a_forged_repeat(db: None) -> None:
    lines = _stream_lines(3)
    changed = json.loads(lines[2])
    changed["payload"]["step"] = 99
    with pytest.raises(verify.VerificationProblem, match="line 3: .* the hash recomputed from its content"):
        verify.verify_event_lines([lines[0], lines[1], json.dumps(changed).encode()], source="topic")
    with pytest.raises(verify.VerificationProblem, match="has seq 3 where seq 2 was expected"):
        verify.verify_event_lines([lines[0], lines[2]], source="topic")
    # A repeat must be the event read before: another event at the same seq, its hash made to
    # match its content, is a fork.
    from backplane.integrity.independent_hash import api_event_hash

    twin = json.loads(lines[1])
    twin["payload"]["step"] = 42
    twin["hash"] = api_event_hash(twin)
    with pytest.raises(verify.VerificationProblem, match="line 3: .* seq 2 was read before with another content"):
        verify.verify_event_lines([lines[0], lines[1], json.dumps(twin).encode()], source="topic")


def test_the_command_line_verifies_a_file_of_events(db: None, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = _stream_lines(2)
    good = tmp_path / "events.jsonl"
    good.write_bytes(b"\n".join(lines) + b"\n")
    assert verify.main(["verify-events", str(good)]) == 0
    assert "OK " in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join([lines[0], lines[2]]) + b"\n")
    assert verify.main(["verify-events", str(bad)]) == 1
    assert verify.main(["verify-events", str(tmp_path / "missing")]) == 2


def test_the_stream_needs_kafka_and_a_topic_prefix_kafka_accepts() -> None:
    for extra, message in (({"BACKPLANE_EVENT_STREAM": "1"}, "must be a kafka:// URL"),
                           ({"BACKPLANE_EVENT_STREAM_TOPIC_PREFIX": "a/b"}, "1 to 149 of")):
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backplane.settings", **extra}
        env.pop("BACKPLANE_OUTBOX_BROKER_URL", None)
        result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], capture_output=True,
                                text=True, env=env, timeout=60)
        assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]


def test_switched_on_beat_runs_the_stream_as_a_watched_duty() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "backplane.settings", "BACKPLANE_EVENT_STREAM": "1",
           "BACKPLANE_OUTBOX_BROKER_URL": "kafka://127.0.0.1:9092"}
    code = ("import django; django.setup(); from backplane.runtime.duties import scheduled_duties; "
            "from backplane.celery import app; print(scheduled_duties()['stream-events'], "
            "'backplane.tasks.stream_events' in app.tasks)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.stdout.split() == ["1.0", "True"], result.stderr[-2000:]
