"""``api_time_sql``: the times PostgreSQL prints for the read paths are the API's times, to the
character (an event's ``recorded_at`` is hashed in that form, so a page printed differently
would fail every outside verifier)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection

from backplane.eventlog.chain import api_time_sql, format_timestamp

MOMENTS = [
    datetime(2026, 11, 29, 17, 0, 0, 123456, tzinfo=UTC),
    datetime(2026, 1, 1, 0, 0, 0, 0, tzinfo=UTC),  # no microseconds: still six digits
    datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2026, 3, 29, 1, 30, 0, 7, tzinfo=timezone(timedelta(hours=-7))),  # not UTC on the way in
    datetime(1999, 2, 28, 12, 0, 0, 500000, tzinfo=timezone(timedelta(hours=5, minutes=30))),
]


@pytest.mark.django_db
@pytest.mark.parametrize("moment", MOMENTS, ids=str)
def test_postgresql_prints_a_time_as_the_api_does(moment: datetime) -> None:
    with connection.cursor() as cursor:
        # Whatever zone the session is in, the answer is UTC.
        cursor.execute("SET LOCAL TIME ZONE 'America/Los_Angeles'")
        cursor.execute(f"SELECT {api_time_sql('%s::timestamptz')}", [moment])
        (printed,) = cursor.fetchone()
    assert printed == format_timestamp(moment)


@pytest.mark.django_db
def test_a_missing_time_stays_missing() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {api_time_sql('NULL::timestamptz')}")
        assert cursor.fetchone() == (None,)


def test_one_instant_prints_alike_in_any_zone_and_another_instant_does_not() -> None:
    # format_timestamp remembers what it printed: an instant seen first in another zone, or
    # a neighbour a microsecond away, must still print as itself.
    instant = datetime(2026, 12, 1, 10, 0, 0, 1, tzinfo=UTC)
    elsewhere = instant.astimezone(timezone(timedelta(hours=-7)))
    assert format_timestamp(elsewhere) == format_timestamp(instant) == "2026-12-01T10:00:00.000001Z"
    assert format_timestamp(instant + timedelta(microseconds=1)) == "2026-12-01T10:00:00.000002Z"
    assert format_timestamp(elsewhere.replace(tzinfo=UTC)) == "2026-12-01T03:00:00.000001Z"
    with pytest.raises(ValueError):
        format_timestamp(instant.replace(tzinfo=None))
