"""Per-key order within a namespace, and subscriptions limited to namespaces (docs/delivery.md).

``OutboxMessage.key_scope`` joins the per-key order condition and its partial index: the
namespace for an agent's messages, ``@backplane`` for the backplane's own. ``WebhookSubscription.
namespaces`` limits a subscription to some namespaces' messages.

Locks, on a large table:

1. ``ADD COLUMN key_scope … DEFAULT '' NOT NULL`` changes the catalogue only (no rewrite): its
   ACCESS EXCLUSIVE lock is held for milliseconds, once the transactions already running on the
   table (appends and relay claims, all short) have ended.
2. The backfill sets ``key_scope`` and the ``namespace`` header on the rows that can still take
   part in ordering: every row not delivered (pending, and dead ones, which a requeue makes
   pending again). Delivered rows keep '' (they never wait nor hold again and are pruned within
   ``BACKPLANE_OUTBOX_RETENTION_SECONDS``). It runs in batches of ``BATCH`` ids, each committed on
   its own (``atomic = False``), so it holds row locks on one batch at a time and no table lock
   beyond what any UPDATE takes; appends never wait for it.
3. The new index is built ``CONCURRENTLY`` before the old one is dropped the same way, so claims
   stay indexed throughout and appends, which insert outbox rows, never wait for a build. A
   failed concurrent build leaves an invalid index behind, so it is dropped (if there) first.

The backfill keeps every key's order: rows are only split into scopes, each in its id order. A
row whose headers name an agent (``outbox_headers`` puts the event's agent there; the backplane's
own messages carry none, or a null one) goes to its task's namespace — a message an agent wrote
on a ``backplane.*`` topic before they were reserved included, so it no longer holds the
backplane's messages of its key; every other row goes to ``@backplane``. Rows written by a
process still running the previous code while this runs get '' and are ordered among themselves,
as before.
"""

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.core.validators import RegexValidator
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

BATCH = 10_000
SERVER_KEY_SCOPE = "@backplane"  # backplane.delivery.outbox.SERVER_KEY_SCOPE, as of this migration

_BACKFILL_SQL = """
UPDATE backplane_outboxmessage m
SET key_scope = CASE WHEN m.headers ->> 'agent' IS NOT NULL AND s.namespace IS NOT NULL THEN s.namespace
                     ELSE %(server)s END,
    headers = m.headers || jsonb_build_object('namespace', s.namespace)
FROM (
    SELECT o.id, t.namespace FROM backplane_outboxmessage o LEFT JOIN backplane_task t ON t.id = o.task_id
    WHERE o.id > %(after)s AND o.id <= %(upto)s AND o.status <> 'delivered' AND o.key_scope = ''
) s
WHERE m.id = s.id
"""


def backfill_key_scopes(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM backplane_outboxmessage")
        low, high = cursor.fetchone()
        if low is None:
            return
        after = low - 1
        while after < high:
            cursor.execute(_BACKFILL_SQL, {"server": SERVER_KEY_SCOPE, "after": after, "upto": after + BATCH})
            after += BATCH


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('backplane', '0026_fleet_operations'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxmessage',
            name='key_scope',
            field=models.CharField(db_default='', max_length=100),
        ),
        migrations.AddField(
            model_name='webhooksubscription',
            name='namespaces',
            field=ArrayField(base_field=models.CharField(max_length=100, validators=[RegexValidator('^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$', "a namespace: letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)")]), blank=True, default=list, help_text="Only messages of these namespaces, comma-separated (empty: every namespace's, and the backplane's own messages of no namespace, e.g. alerts).", size=None),
        ),
        migrations.RunPython(backfill_key_scopes, migrations.RunPython.noop, elidable=True),
        migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS outbox_scoped_key_blocking_idx", migrations.RunSQL.noop),
        AddIndexConcurrently(
            model_name='outboxmessage',
            index=models.Index(condition=models.Q(('status', 'pending'), ('holds_key', True), _connector='OR'), fields=['key', 'key_scope', 'destination', 'subscription', 'id'], name='outbox_scoped_key_blocking_idx'),
        ),
        RemoveIndexConcurrently(
            model_name='outboxmessage',
            name='outbox_key_blocking_idx',
        ),
    ]
