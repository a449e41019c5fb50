"""The shared cache's table without write-ahead log: every API request counts itself toward its
agent's rate limit there (api/throttling.py), and on a logged table each count was a commit that
waited for a WAL flush, the same wait an event's commit pays, twice per append. Unlogged, the
count commits without it. What a cache loses by that is the cache: after a crash PostgreSQL
empties an unlogged table, so rate-limit windows start afresh (docs/operations.md)."""

from django.db import migrations

SQL = "ALTER TABLE IF EXISTS backplane_cache SET UNLOGGED"
REVERSE_SQL = "ALTER TABLE IF EXISTS backplane_cache SET LOGGED"


class Migration(migrations.Migration):
    dependencies = [("recovery", "0006_retention")]

    operations = [migrations.RunSQL(SQL, REVERSE_SQL)]
