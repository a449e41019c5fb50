"""The pool checks a connection only when it sat idle: fresh ones go straight to work."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from backplane.runtime import pool_checks

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool() -> Iterator[ConnectionPool]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    built = ConnectionPool(kwargs={**params, "autocommit": True}, min_size=1, max_size=1, open=True,
                           check=ConnectionPool.check_connection, reset=pool_checks.note_returned, timeout=5)
    pool_checks.install(built)
    yield built
    built.close()


def kill_server_side(conn: psycopg.Connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])


def test_a_connection_handed_back_just_now_is_not_checked(pool: ConnectionPool) -> None:
    conn = pool.getconn()
    pool.putconn(conn)
    kill_server_side(conn)
    # Within FRESH_SECONDS: no check, so the dead connection is handed out (and fails once).
    again = pool.getconn()
    assert again is conn
    with pytest.raises(psycopg.OperationalError):
        again.execute("SELECT 1")
    pool.putconn(again)  # broken: the pool discards it and opens another
    with pool.connection() as fresh:
        assert fresh.execute("SELECT 1").fetchone() == (1,)


def test_a_connection_that_sat_idle_is_checked_and_replaced(pool: ConnectionPool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_checks, "FRESH_SECONDS", 0.0)
    conn = pool.getconn()
    pool.putconn(conn)
    kill_server_side(conn)
    with pool.connection() as checked:
        assert checked is not conn
        assert checked.execute("SELECT 1").fetchone() == (1,)


def test_install_refuses_a_pool_whose_check_it_does_not_know() -> None:
    unusual = ConnectionPool("", open=False, check=lambda conn: None)
    with pytest.raises(RuntimeError):
        pool_checks.install(unusual)
