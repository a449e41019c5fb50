"""Which URL is which behind a transaction pooler (settings.py, docs/production.md "PgBouncer"): an
inconsistent configuration stops every process at start with a message that says what to set, and
``manage.py migrate`` takes the direct URL by itself. Each case is a fresh interpreter, as a
process of the product starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live_server import database_url_of_test_db, free_port

ROOT = Path(__file__).resolve().parents[3]


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in {"DATABASE_DIRECT_URL", "BACKPLANE_DB_POOLER", "MIGRATION_DATABASE_URL"}}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env={**base, **env}, capture_output=True, text=True,
                          timeout=120)


def _settings(**env: str) -> subprocess.CompletedProcess[str]:
    return _run("-c", "import backplane.settings", DJANGO_SETTINGS_MODULE="backplane.settings", **env)


@pytest.mark.parametrize(("env", "message"), [
    ({"BACKPLANE_DB_POOLER": "transaction"}, "BACKPLANE_DB_POOLER=transaction needs DATABASE_DIRECT_URL"),
    ({"DATABASE_DIRECT_URL": "postgresql://app:@db:5432/backplane"},
     "DATABASE_DIRECT_URL is set but BACKPLANE_DB_POOLER is not 'transaction'"),
    ({"BACKPLANE_DB_POOLER": "session", "DATABASE_DIRECT_URL": "postgresql://app:@db:5432/backplane"},
     "BACKPLANE_DB_POOLER='session' must be none or transaction"),
])
def test_it_refuses_to_start_on_an_inconsistent_pooler_configuration(env: dict[str, str], message: str) -> None:
    started = _settings(**env)

    assert started.returncode != 0
    assert message in started.stderr, started.stderr


def test_it_starts_with_both_urls_and_the_pooler_named() -> None:
    started = _settings(BACKPLANE_DB_POOLER="transaction", DATABASE_DIRECT_URL="postgresql://app:@db:5432/backplane")

    assert started.returncode == 0, started.stderr


@pytest.mark.django_db
def test_migrate_uses_the_direct_url_and_never_the_pooled_one() -> None:
    # DATABASE_URL names a port where nothing listens: a migrate that used it could not connect.
    nowhere = f"postgresql://app:@127.0.0.1:{free_port()}/backplane"
    planned = _run("manage.py", "migrate", "--plan", DATABASE_URL=nowhere,
                   DATABASE_DIRECT_URL=database_url_of_test_db(), BACKPLANE_DB_POOLER="transaction")

    assert planned.returncode == 0, planned.stderr
    assert "No planned migration operations." in planned.stdout, planned.stdout

    # ...while any other command takes DATABASE_URL, the pooled one.
    shown = _run("manage.py", "showmigrations", "backplane", DATABASE_URL=nowhere,
                 DATABASE_DIRECT_URL=database_url_of_test_db(), BACKPLANE_DB_POOLER="transaction")
    assert shown.returncode != 0
    assert "127.0.0.1" in shown.stderr, shown.stderr
