"""Writers racing to seal the first values of the same new data subjects, on real concurrent
connections: one key is made for each subject, and every writer seals with it (equal values to
equal envelopes), whichever won the race; nobody waits on anybody in a circle."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from backplane.privacy.models import DataSubject
from backplane.privacy.sealing import seal_personal

pytestmark = pytest.mark.usefixtures("committed_db")

WRITERS = 8


def test_writers_racing_on_new_subjects_make_one_key_each_and_seal_alike() -> None:
    start = threading.Barrier(WRITERS)
    sealed: list[Any] = []
    failures: list[BaseException] = []

    def write(n: int) -> None:
        # Each writer names the same subjects, in its own order.
        subjects = [f"lead:{k}" for k in (range(5) if n % 2 else reversed(range(5)))]
        body = {s: {"$personal": {"subject": s, "value": "ada@example.com"}} for s in subjects}
        try:
            start.wait()
            sealed.append(seal_personal("acme", body))
        except BaseException as exc:  # noqa: BLE001 - reported below, with the others
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not failures, failures
    assert len(sealed) == WRITERS
    assert DataSubject.objects.filter(namespace="acme").count() == 5
    assert all(body == sealed[0] for body in sealed)
