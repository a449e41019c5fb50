"""The application's database role can write events but never change them.

The suite itself runs as the owner (a superuser of the embedded server, which pytest-django
needs to create the test database); these tests log in as ``BACKPLANE_DB_APP_ROLE`` the way the
product does in a deployment (backplane/runtime/db_roles.py, migration 0018).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from psycopg import errors
from psycopg.conninfo import make_conninfo

from backplane.eventlog.models import Event, Task
from backplane.eventlog.partitioning import PARTITIONS, partition_name

REPO = Path(__file__).resolve().parents[2]
ROLE = settings.BACKPLANE_DB_APP_ROLE
EVENTS = "backplane_event"


def conninfo(user: str) -> str:
    """Connection keywords for the test database (pytest-django's, created for this run)."""
    database = connection.settings_dict
    info = {"dbname": database["NAME"], "user": user, "host": database["HOST"], "port": str(database["PORT"] or "")}
    if user == database["USER"] and database["PASSWORD"]:
        info["password"] = database["PASSWORD"]
    return make_conninfo(**{key: value for key, value in info.items() if value})


@pytest.fixture
def app_role(db: None) -> str:
    """Let the role log in, as every ``manage.py migrate`` with MIGRATION_DATABASE_URL does.
    Committed at once on its own connection: a role is the server's, not the test transaction's."""
    from backplane.runtime.db_roles import RESTRICTED

    with psycopg.connect(conninfo(connection.settings_dict["USER"]), autocommit=True) as owner:
        owner.execute(f'ALTER ROLE "{ROLE}" LOGIN {RESTRICTED}')
    return ROLE


@pytest.fixture
def as_app(app_role: str) -> Iterator[psycopg.Connection]:
    # lock_timeout: a refusal must come from the privilege check, never from waiting on a lock.
    with psycopg.connect(conninfo(app_role), autocommit=True, options="-c lock_timeout=2000") as conn:
        assert conn.execute("SELECT current_user").fetchone() == (ROLE,)
        yield conn


def refused(conn: psycopg.Connection, statement: str) -> errors.InsufficientPrivilege:
    with pytest.raises(errors.InsufficientPrivilege) as caught:
        conn.execute(statement)
    return caught.value


def test_the_role_is_no_superuser_and_owns_nothing(as_app: psycopg.Connection) -> None:
    flags = as_app.execute(
        "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication FROM pg_roles WHERE rolname = %s",
        [ROLE],
    ).fetchone()
    assert flags == (False, False, False, False, False)
    owned = as_app.execute(
        "SELECT count(*) FROM pg_class WHERE relowner = (SELECT oid FROM pg_roles WHERE rolname = %s)", [ROLE]
    ).fetchone()
    assert owned == (0,)


def test_it_cannot_alter_the_event_table(as_app: psycopg.Connection) -> None:
    error = refused(as_app, f"ALTER TABLE {EVENTS} ADD COLUMN note text")
    assert "must be owner" in str(error)
    refused(as_app, f"ALTER TABLE {EVENTS} RENAME TO old_events")
    refused(as_app, f"DROP TABLE {EVENTS}")


def test_it_cannot_switch_the_append_only_triggers_off(as_app: psycopg.Connection) -> None:
    refused(as_app, f"ALTER TABLE {EVENTS} DISABLE TRIGGER backplane_event_no_update_or_delete")
    refused(as_app, f"ALTER TABLE {EVENTS} DISABLE TRIGGER ALL")
    refused(as_app, "DROP FUNCTION backplane_event_reject_change() CASCADE")


def test_it_cannot_skip_triggers_with_the_replication_role(as_app: psycopg.Connection) -> None:
    refused(as_app, "SET session_replication_role = replica")
    assert as_app.execute("SHOW session_replication_role").fetchone() == ("origin",)


@pytest.mark.parametrize(
    "statement",
    [f"UPDATE {EVENTS} SET payload = '{{}}'", f"DELETE FROM {EVENTS}", f"TRUNCATE {EVENTS}"],
    ids=["update", "delete", "truncate"],
)
def test_it_cannot_change_or_remove_events(as_app: psycopg.Connection, statement: str) -> None:
    # Refused for want of the privilege, before the append-only triggers would have a say.
    refused(as_app, statement)


def test_every_other_table_is_granted_and_events_only_for_reading_and_inserting(as_app: psycopg.Connection) -> None:
    rows = as_app.execute(
        """
        SELECT c.relname, c.relispartition, p.privilege, has_table_privilege(c.oid, p.privilege)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
             unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES']) p(privilege)
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
        """
    ).fetchall()
    granted: dict[str, set[str]] = {}
    partitions: set[str] = set()
    for table, is_partition, privilege, has in rows:
        granted.setdefault(table, set())
        if is_partition:
            partitions.add(table)
        if has:
            granted[table].add(privilege)
    assert granted[EVENTS] == {"SELECT", "INSERT"}
    assert {"backplane_task", "backplane_outboxmessage", "django_migrations"} <= set(granted)
    # The events' partitions are reached only through the parent, whose privileges are checked.
    assert partitions == {partition_name(r) for r in range(PARTITIONS)}
    for table, privileges in granted.items():
        if table in partitions:
            assert privileges == set(), table
        elif table != EVENTS:
            assert privileges == {"SELECT", "INSERT", "UPDATE", "DELETE"}, table


def test_the_product_appends_events_through_its_writer_as_the_role(app_role: str, committed_db: None) -> None:
    """The whole settings stack with DATABASE_URL logging in as the role: the writer's task
    row lock, event insert, outbox rows and projection update all go through."""
    database = connection.settings_dict
    host = f"?host={quote(database['HOST'])}" if database["HOST"].startswith("/") else ""
    netloc = f"@{database['HOST']}:{database['PORT']}" if not host else "@"
    url = f"postgresql://{app_role}{netloc}/{database['NAME']}{host}"
    script = (
        "from backplane.eventlog import services\n"
        "from backplane.eventlog.writer import EventDraft\n"
        "task = services.task_create(namespace='roles', kind='k', input={}, agent='a').task\n"
        "services.event_append(namespace='roles', task_id=task.id, agent='a',\n"
        "    draft=EventDraft(type='ReasoningStepCompleted', payload={'step': 1}))\n"
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    cursor.execute('SELECT current_user')\n"
        "    print(cursor.fetchone()[0], task.id)\n"
    )
    env = {**os.environ, "DATABASE_URL": url, "BACKPLANE_ENV": "test"}
    env.pop("MIGRATION_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    user, task_id = done.stdout.strip().splitlines()[-1].split()
    assert user == ROLE
    task = Task.objects.get(id=task_id)
    assert list(Event.objects.filter(task=task).order_by("seq").values_list("seq", "type")) == [
        (1, "TaskStarted"), (2, "ReasoningStepCompleted")]
    assert task.last_seq == 2


def test_make_run_logs_the_product_in_as_the_role_and_migrates_as_the_owner() -> None:
    from backplane.runtime.launcher import APP_ROLE, with_user

    assert APP_ROLE == ROLE
    owner = "postgresql://postgres:@/backplane?host=/tmp/var/pgdata"
    assert with_user(owner, ROLE) == f"postgresql://{ROLE}@/backplane?host=/tmp/var/pgdata"
    assert with_user("postgresql://postgres:secret@db:5432/backplane", ROLE) == f"postgresql://{ROLE}@db:5432/backplane"


def test_migrate_as_the_owner_lets_the_role_log_in_with_the_password_of_database_url(app_role: str) -> None:
    """``manage.py migrate`` with MIGRATION_DATABASE_URL: settings switch it to the owner, and after
    migrating it sets the role's login and password from DATABASE_URL (a no-op migrate here)."""
    database = connection.settings_dict
    socket = f"?host={quote(database['HOST'])}" if database["HOST"].startswith("/") else ""
    netloc = "" if socket else f"{database['HOST']}:{database['PORT']}"
    owner = f"postgresql://{database['USER']}:{quote(database['PASSWORD'] or '')}@{netloc}/{database['NAME']}{socket}"
    app = f"postgresql://{app_role}:app-secret-1@{netloc}/{database['NAME']}{socket}"
    env = {**os.environ, "DATABASE_URL": app, "MIGRATION_DATABASE_URL": owner, "BACKPLANE_ENV": "test"}
    with psycopg.connect(conninfo(database["USER"]), autocommit=True) as admin:
        admin.execute(f'ALTER ROLE "{app_role}" NOLOGIN PASSWORD NULL')
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        login, password = admin.execute(
            "SELECT rolcanlogin, rolpassword FROM pg_authid WHERE rolname = %s", [app_role]).fetchone() or (None, None)
    assert login is True
    assert password and password.startswith("SCRAM-SHA-256$")
    # DATABASE_URL must name the role, or migrate would provision the wrong one.
    env["DATABASE_URL"] = app.replace(f"{app_role}:", "someone_else:")
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "must log in as BACKPLANE_DB_APP_ROLE" in done.stderr
