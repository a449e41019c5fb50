"""``database_from_url``: the URL forms libpq accepts, several hosts included, become settings
Django's PostgreSQL backend connects with."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper

from backplane.runtime.env import ImproperlyConfiguredEnv, database_from_url


def test_it_reads_one_host_and_port() -> None:
    settings = database_from_url("postgresql://app:s%40cret@db.example:6432/backplane?sslmode=require")

    assert (settings["HOST"], settings["PORT"]) == ("db.example", "6432")
    assert (settings["USER"], settings["PASSWORD"], settings["NAME"]) == ("app", "s@cret", "backplane")
    assert settings["OPTIONS"] == {"sslmode": "require"}


def test_it_reads_a_unix_socket_directory_from_the_query() -> None:
    settings = database_from_url("postgresql://app:@/backplane?host=/run/postgresql")

    assert (settings["HOST"], settings["PORT"]) == ("/run/postgresql", "")


def test_it_reads_several_hosts_with_their_ports_and_the_session_attributes() -> None:
    settings = database_from_url(
        "postgresql://app:pw@10.0.0.1:5432,10.0.0.2:5433,[fd00::3]:5434/backplane"
        "?target_session_attrs=read-write&load_balance_hosts=disable")

    assert settings["HOST"] == "10.0.0.1,10.0.0.2,fd00::3"
    assert settings["PORT"] == "5432,5433,5434"
    assert settings["OPTIONS"] == {"target_session_attrs": "read-write", "load_balance_hosts": "disable"}


def test_it_keeps_a_missing_port_of_one_host_empty_for_libpqs_default() -> None:
    settings = database_from_url("postgresql://app:pw@h1:5432,h2/backplane")

    assert (settings["HOST"], settings["PORT"]) == ("h1,h2", "5432,")


def test_it_refuses_a_port_that_is_not_a_number() -> None:
    with pytest.raises(ImproperlyConfiguredEnv, match="port"):
        database_from_url("postgresql://app:pw@h1:5432,h2:fivefour/backplane")


@pytest.mark.django_db
def test_libpq_skips_a_host_that_does_not_answer_and_connects_to_the_next() -> None:
    """The settings of a two-host URL, the first host gone, reach the test database through
    Django's own backend: libpq, not our code, walks the host list."""
    live: dict[str, Any] = dict(connection.settings_dict)
    socket_dir, port = str(live["HOST"]), str(live["PORT"] or "5432")
    if not socket_dir.startswith("/"):
        pytest.skip("the test database is not on a unix socket")
    url = (f"postgresql://{live['USER']}:@:{port},:{port}/{live['NAME']}"
           f"?target_session_attrs=read-write")
    settings = database_from_url(url)
    settings["HOST"] = f"/nonexistent-socket-dir,{socket_dir}"
    wrapper = DatabaseWrapper({**live, **settings, "OPTIONS": {**settings["OPTIONS"]}}, alias="default")
    try:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT current_setting('unix_socket_directories'), pg_is_in_recovery()")
            directories, in_recovery = cursor.fetchone()
    finally:
        wrapper.close()

    assert socket_dir in directories
    assert in_recovery is False
