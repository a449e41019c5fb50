"""Two reviewers deciding the same dead letters at the same moment: each is decided exactly
once, and no task is requeued twice. Real commits, two threads, each with its own database
connection (``committed_db``)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count
from django.test import Client

from backplane.delivery.models import DeadLetter
from backplane.eventlog.models import Event, Task
from recovery import dead_letters
from tests.dashboard.test_dead_letters import dead_lettered_tasks, make_reviewer, task_id_of, token_of


def at_once(*work: Callable[[], Any]) -> list[Any]:
    """Run each callable in its own thread, released together; their results in order."""
    barrier = threading.Barrier(len(work))
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def run(n: int, fn: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results[n] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n, fn)) for n, fn in enumerate(work)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    if errors:
        raise errors[0]
    return results


def decision_events_per_task(tasks: list[Any]) -> Counter[Any]:
    rows = (Event.objects.filter(task_id__in=tasks, type__in=["DeadLetterRequeued", "DeadLetterDiscarded"])
            .values_list("task_id").annotate(n=Count("position")))
    return Counter(dict(rows))


@pytest.mark.django_db(transaction=True)
def test_two_reviewers_confirming_the_same_100_at_once_decide_each_once(committed_db: None) -> None:
    items = dead_lettered_tasks(100)
    ids = [item.pk for item in items]
    confirmations = []
    for name, chosen in (("rita", {"all_matching": "on", "query": "status=pending"}),
                         # Sam checked them newest first: the two meet in the middle of the list.
                         ("sam", {"ids": list(reversed(ids))})):
        client = Client()
        client.force_login(make_reviewer(name))
        preview = client.post("/dead-letters/bulk/", {"action": "requeue", "reason": f"{name}: pool is back",
                                                      **chosen})
        assert preview.status_code == 200
        confirmations.append((client, token_of(preview)))

    def confirm(client: Client, token: str) -> dict[str, Any]:
        response = client.post("/dead-letters/bulk/confirm/", {"token": token}, HTTP_ACCEPT="application/json")
        assert response.status_code == 200
        return response.json()

    rita, sam = at_once(*(lambda c=c, t=t: confirm(c, t) for c, t in confirmations))

    outcomes: dict[int, list[str]] = {pk: [] for pk in ids}
    for answer in (rita, sam):
        assert len(answer["results"]) == 100
        for result in answer["results"]:
            outcomes[result["id"]].append(result["outcome"])
    assert all(sorted(both) == ["done", "skipped"] for both in outcomes.values()), outcomes
    assert rita["counts"].get("done", 0) + sam["counts"].get("done", 0) == 100
    assert "failed" not in rita["counts"] and "failed" not in sam["counts"]

    decided = Counter(DeadLetter.objects.filter(pk__in=ids).values_list("status", "decided_by"))
    assert decided == Counter({("requeued", "user:rita"): rita["counts"].get("done", 0),
                               ("requeued", "user:sam"): sam["counts"].get("done", 0)})
    tasks = [task_id_of(item) for item in items]
    assert decision_events_per_task(tasks) == Counter(dict.fromkeys(tasks, 1))  # no double requeue
    assert set(Task.objects.filter(pk__in=tasks).values_list("status", "attempts")) == {("pending", 0)}


@pytest.mark.django_db(transaction=True)
def test_a_requeue_and_a_discard_of_the_same_100_at_once_never_both_happen(committed_db: None) -> None:
    items = dead_lettered_tasks(100)
    ids = [item.pk for item in items]

    def decide(action: str, order: list[int]) -> list[dead_letters.BulkItemResult]:
        return dead_letters.dead_letters_decide_many(ids=order, action=action, decided_by=f"user:{action}-er",
                                                     reason=f"{action} them")

    requeued, discarded = at_once(lambda: decide("requeue", ids), lambda: decide("discard", ids[::-1]))

    done = Counter(r.dead_letter_id for r in [*requeued, *discarded] if r.outcome == "done")
    assert done == Counter(dict.fromkeys(ids, 1))
    assert {r.outcome for r in [*requeued, *discarded]} == {"done", "skipped"}
    tasks = {item.task_id: item.pk for item in items}
    assert decision_events_per_task(list(tasks)) == Counter(dict.fromkeys(tasks, 1))
    # Each task went the way of the one decision its dead letter got.
    status_of = dict(DeadLetter.objects.filter(pk__in=ids).values_list("pk", "status"))
    for task_id, task_status in Task.objects.filter(pk__in=list(tasks)).values_list("pk", "status"):
        expected = "pending" if status_of[tasks[task_id]] == "requeued" else "dead_lettered"
        assert task_status == expected
