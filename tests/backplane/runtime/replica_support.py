"""The ``replica`` database alias as ``DATABASE_REPLICA_URL`` makes it, added to a running test.

The settings read ``DATABASE_REPLICA_URL`` once, at start-up, and the test run has none; these
helpers add the alias (the test database's name and login, another server's socket) and the
router, and take both away after.

A test that reads the replica through Django's connection must name it in its
``django_db`` mark (``databases=["default", "replica"]``), and the alias must exist before
pytest-django sets the test up: add it with ``replica_database`` in a fixture of a wider scope.
It is a mirror of ``default``, so the flush after a test leaves it alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DEFAULT_DB_ALIAS, connections
from django.test import override_settings

from backplane.runtime.replica import REPLICA, monitor


@contextmanager
def replica_database(*, host: str, port: str = "") -> Iterator[None]:
    """``replica`` points at ``host`` (a socket directory) and ``port``."""
    entry = {**connections.settings[DEFAULT_DB_ALIAS], "HOST": host, "PORT": port}
    entry["OPTIONS"] = {k: v for k, v in entry["OPTIONS"].items() if k != "pool"}
    entry["TEST"] = {**entry["TEST"], "MIRROR": DEFAULT_DB_ALIAS}
    connections.settings[REPLICA] = entry
    try:
        yield
    finally:
        for conn in connections.all(initialized_only=True):
            if conn.alias == REPLICA:
                conn.close()
                del connections[REPLICA]
        del connections.settings[REPLICA]
        monitor.reset()


@contextmanager
def replica_routing() -> Iterator[None]:
    """The router installed, and the monitor starting with no verdict."""
    monitor.reset()
    try:
        with override_settings(DATABASE_ROUTERS=["backplane.runtime.replica.ReplicaRouter"]):
            yield
    finally:
        monitor.reset()


@contextmanager
def replica_alias(*, host: str, port: str = "") -> Iterator[None]:
    """Both, for a test that never connects to the replica through Django."""
    with replica_database(host=host, port=port), replica_routing():
        yield
