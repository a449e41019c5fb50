"""/metrics speaks Prometheus and reports delivery and task figures from the database."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from backplane.eventlog import forks
from backplane.eventlog.models import Task


def test_it_reports_outbox_and_task_figures(client: Client, make_task: Callable[..., Task]) -> None:
    from backplane.delivery.models import OutboxMessage

    make_task()
    replayed = make_task()
    # A sandbox fork (a replay) is not the fleet's work: it is left out of the task figures.
    forks.task_fork(namespace=replayed.namespace, source_task_id=replayed.pk, at_seq=1, reason="replay",
                    forked_by="alice", by_staff=False, sandbox=True)
    # One of the two lifecycle messages is under a relay's claim right now.
    first = OutboxMessage.objects.earliest("id")
    OutboxMessage.objects.filter(pk=first.pk).update(claimed_until=timezone.now() + timedelta(seconds=30))
    response = client.get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    assert samples[("backplane_outbox_messages", (("state", "pending"),))] == 2
    assert samples[("backplane_outbox_messages", (("state", "in_flight"),))] == 1
    assert samples[("backplane_outbox_messages", (("state", "held"),))] == 0
    assert samples[("backplane_tasks", (("status", "pending"),))] == 2
    assert samples[("backplane_dead_letters_pending", ())] == 0
    assert ("backplane_outbox_lag_seconds", ()) in samples
