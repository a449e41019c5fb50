"""What the API answers for an error the database raised: a lost database is 503 with the gate
closed, whatever psycopg called the error; anything else from the database is the contract's 500."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InternalError, OperationalError, connection

from api.errors import error_parts
from backplane.runtime.database_gate import gate, thread_connection_broken

pytestmark = pytest.mark.django_db(transaction=True)

# What psycopg raised when PgBouncer's server connection died under a transaction (failover).
MID_PROTOCOL = "received 2 results from command 'BEGIN'"


def break_this_threads_connection() -> None:
    """The server ends this thread's backend, and the next statement finds the connection broken."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def test_any_error_on_a_connection_psycopg_found_broken_is_a_lost_database() -> None:
    break_this_threads_connection()
    assert thread_connection_broken()
    try:
        answer = error_parts(InternalError(MID_PROTOCOL))
        assert answer is not None
        status, body, headers = answer
        assert (status, body["error"]["code"], headers["Retry-After"]) == (503, "unavailable", "5")
        assert gate.is_marked_down
    finally:
        connection.close()


def test_the_same_error_on_a_connection_still_whole_is_the_contracts_500() -> None:
    connection.ensure_connection()
    assert not thread_connection_broken()
    answer = error_parts(InternalError(MID_PROTOCOL))
    assert answer is not None
    status, body, _ = answer
    assert (status, body["error"]["code"]) == (500, "internal_error")
    assert not gate.is_marked_down
