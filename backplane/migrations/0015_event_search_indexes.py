"""The two event indexes the dashboard reads through, built without blocking appends.

``CONCURRENTLY`` cannot run in a transaction, hence ``atomic = False``. A failed concurrent
build leaves an invalid index behind, so each is dropped (if there) before it is built.
"""

from django.db import migrations

# Payload search (backplane/eventlog/selectors.py): the words of every string and number in a payload,
# matched with phraseto_tsquery('simple', ...). bench/dashboard.py measured it against
# jsonb_path_ops containment and pg_trgm (docs/benchmarks.md, "Dashboard"). fastupdate = off:
# with the pending list, searches slowed by 6-23 ms until a flush and the insert that flushed
# paid up to 171 ms; without it every insert pays about 0.2 ms.
PAYLOAD_SEARCH_INDEX = """
CREATE INDEX CONCURRENTLY event_payload_search_idx ON backplane_event
USING gin (jsonb_to_tsvector('simple'::regconfig, payload, '["string", "numeric"]'::jsonb))
WITH (fastupdate = off)
"""
# Events arrive in time order, so a BRIN index (a few hundred bytes per block range) finds
# "the last hour" at almost no cost to appends.
RECORDED_AT_INDEX = "CREATE INDEX CONCURRENTLY event_recorded_at_brin ON backplane_event USING brin (recorded_at)"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("backplane", "0014_agent_last_seen"),
    ]

    operations = [
        migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS event_payload_search_idx", migrations.RunSQL.noop),
        migrations.RunSQL(PAYLOAD_SEARCH_INDEX, "DROP INDEX CONCURRENTLY IF EXISTS event_payload_search_idx"),
        migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS event_recorded_at_brin", migrations.RunSQL.noop),
        migrations.RunSQL(RECORDED_AT_INDEX, "DROP INDEX CONCURRENTLY IF EXISTS event_recorded_at_brin"),
    ]
