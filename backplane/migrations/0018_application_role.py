"""Grant the application's role (``settings.BACKPLANE_DB_APP_ROLE``) what it needs, and no more.

The owner (who runs the migrations) keeps the tables; the application's role gets SELECT,
INSERT, UPDATE and DELETE on every table of the schema except ``backplane_event``, where it may
only SELECT and INSERT, and USAGE on the sequences. Not owning a table, it can neither ALTER it
nor DISABLE its triggers; not being a superuser, it cannot SET session_replication_role to skip
them. ``ALTER DEFAULT PRIVILEGES`` gives the same grants on the tables and sequences that later
migrations create (run by the same owner): a later table that must be append-only too has to
REVOKE in its own migration, as this one does for the events.

The role is created (without login) when it does not exist yet, which needs CREATEROLE; its
login and password are set after each migrate (backplane/runtime/db_roles.py). Roles belong to
the whole server, so reversing this migration revokes the grants but leaves the role.
"""

from django.conf import settings
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from psycopg import sql

TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
EVENT_TABLE = "backplane_event"


def grant(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    role = sql.Identifier(settings.BACKPLANE_DB_APP_ROLE)
    with schema_editor.connection.cursor() as cursor:
        # Roles are the cluster's, not the database's: two databases migrated at once (the test
        # workers' on one server) may both find the role missing, and the second CREATE then
        # fails on the catalogue's unique index. Either error means the role is there.
        cursor.execute(sql.SQL(
            "DO $$ BEGIN CREATE ROLE {} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;"
            " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$").format(role))
        statements = [
            "GRANT USAGE ON SCHEMA public TO {role}",
            f"GRANT {TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA public TO {{role}}",
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}",
            f"REVOKE ALL ON {EVENT_TABLE} FROM {{role}}",
            f"GRANT SELECT, INSERT ON {EVENT_TABLE} TO {{role}}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT {TABLE_PRIVILEGES} ON TABLES TO {{role}}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT USAGE, SELECT ON SEQUENCES TO {role}",
        ]
        for statement in statements:
            cursor.execute(sql.SQL(statement).format(role=role))


def revoke(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    role = sql.Identifier(settings.BACKPLANE_DB_APP_ROLE)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [settings.BACKPLANE_DB_APP_ROLE])
        if cursor.fetchone() is None:
            return
        statements = [
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE {TABLE_PRIVILEGES} ON TABLES FROM {{role}}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE USAGE, SELECT ON SEQUENCES FROM {role}",
            "REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}",
            "REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {role}",
        ]
        for statement in statements:
            cursor.execute(sql.SQL(statement).format(role=role))


class Migration(migrations.Migration):
    dependencies = [("backplane", "0017_outbox_claims_lanes_ordering")]

    operations = [migrations.RunPython(grant, revoke)]
