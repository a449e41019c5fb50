"""The application's database role, separate from the owner of the tables.

The product connects as ``BACKPLANE_DB_APP_ROLE`` (``backplane_app``): it may read and write the
tables it uses and insert events, but it owns nothing, so it can neither alter a table nor
switch the event table's append-only triggers off, and it is no superuser, so it cannot skip
triggers with ``session_replication_role = replica``. Migrations run as the owner
(``MIGRATION_DATABASE_URL``, see settings.py). Two pieces keep the role right:

- migration ``0018_application_role`` grants the privileges, including default privileges so
  that tables created by later migrations are granted too (``backplane_event``: SELECT and
  INSERT only);
- :func:`ensure_app_login`, run after every ``manage.py migrate`` as the owner, makes the role
  able to log in with the password of ``DATABASE_URL`` (so a deployment needs no separate SQL
  step, and a changed password is applied by the next migrate).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from psycopg import sql

# What the role must never be: checked again at every migrate, in case someone granted it.
RESTRICTED = "NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"


def ensure_app_login(*, using: str = "default", role: str, password: str) -> None:
    """Create ``role`` (or alter it) so that it logs in with ``password`` and nothing more.

    An empty password leaves the password alone (the embedded server trusts local connections).
    Needs CREATEROLE (or superuser) on the migrating connection, which the owner has.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        exists = cursor.fetchone() is not None
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        (superuser,) = cursor.fetchone() or (False,)
        # Only a superuser may name SUPERUSER, REPLICATION or BYPASSRLS in ALTER ROLE, even to say
        # NO (an owner with CREATEROLE on a managed server is none): then the role is checked instead.
        restricted = RESTRICTED if superuser or not exists else ""
        statement = sql.SQL("{} ROLE {} LOGIN " + restricted).format(
            sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(role))
        if password:
            statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
        cursor.execute(statement)
        cursor.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(connections[using].settings_dict["NAME"]), sql.Identifier(role)))
        cursor.execute(
            "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls FROM pg_roles "
            "WHERE rolname = %s", [role])
        (privileged,) = cursor.fetchone() or (False,)
    if privileged:
        raise ImproperlyConfigured(
            f"the application's database role {role!r} must not be a superuser or have CREATEROLE, CREATEDB, "
            f"REPLICATION or BYPASSRLS: it could then change events (ALTER ROLE {role} NOSUPERUSER ... as a superuser)")


def on_post_migrate(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """post_migrate handler (backplane/apps.py): provision the login while migrating as the owner."""
    login = getattr(settings, "BACKPLANE_DB_APP_LOGIN", None)
    if login is not None and using == "default":
        ensure_app_login(using=using, role=settings.BACKPLANE_DB_APP_ROLE, password=login["password"])
