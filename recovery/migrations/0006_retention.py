"""Retention: rules, and the one way a finished task leaves the database (recovery/retention.py).

The application's role (``BACKPLANE_DB_APP_ROLE``) may not delete events and still may not
(0018). It may call ``backplane_prune_task(task)``, which runs as the owner of the tables
(``SECURITY DEFINER``) and deletes one whole task only if, checked again under the task's row
lock, it may go (``backplane_task_prunable``):

- the task is finished (completed, failed, dead-lettered, compensated);
- its log is whole (as many events as ``last_seq``) and every event has a Merkle leaf sealed
  with its hash, below the tree size the last audit segment covers: it is in the export,
  verifiable offline, before it leaves the database;
- no sub-task of it is left (children go first), and if it has a parent, the parent is finished
  with no dead letter pending (a requeued parent would dispatch its sub-tasks again and must
  find them);
- no dead letter of it (or of its messages) awaits a decision, no message of it awaits
  delivery or holds its key, no integrity alert on it is unacknowledged.

It then deletes, in this order, every row that refers to the task: its dead letters (all
decided), outbox messages, tool calls (and, since 0018, approval requests with their decisions
first), idempotent-replay counters, verified head, integrity alerts (all acknowledged), its
events, and the task row. It returns the number of events
deleted, or NULL when the task is not there, is locked by someone else (skipped, never waited
for), or may not go. The events' DELETE passes their trigger (backplane 0019) only because the
function turns ``backplane.pruning`` on around it, and only for rows whose leaves are exported.
Merkle leaves, signed tree heads and audit segments stay: the tree does not change.

Every table with a foreign key to ``backplane_task`` must be in the list above;
tests/recovery/test_retention.py compares it with the catalogue.
"""

import django.core.validators
from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from psycopg import sql

import recovery.models

FUNCTIONS = r"""
CREATE FUNCTION backplane_task_prunable(candidate uuid) RETURNS boolean
LANGUAGE sql STABLE
-- A dozen index probes and one per event: costly enough that the planner calls it last, and on
-- as few rows as it can (an ordered index scan that stops at the LIMIT, not a sort of them all).
COST 1000
SET search_path = public, pg_temp
AS $$
SELECT EXISTS (
    SELECT FROM backplane_task t
    WHERE t.id = candidate
      AND t.status IN ('completed', 'failed', 'dead_lettered', 'compensated')
      -- The whole log, every event sealed with its hash and exported.
      AND t.last_seq = (SELECT count(*) FROM backplane_event e WHERE e.task_id = t.id)
      AND NOT EXISTS (
          SELECT FROM backplane_event e LEFT JOIN backplane_merkleleaf l ON l.event_id = e.position
          WHERE e.task_id = t.id
            AND (l.leaf_index IS NULL OR l.event_hash <> e.hash
                 OR l.leaf_index >= (SELECT coalesce(max(s.tree_size), 0) FROM backplane_auditsegment s)))
      -- Children go first; a child goes only once its parent can never dispatch it again.
      AND NOT EXISTS (SELECT FROM backplane_task c WHERE c.parent_id = t.id)
      AND (t.parent_id IS NULL OR EXISTS (
          SELECT FROM backplane_task p
          WHERE p.id = t.parent_id
            AND p.status IN ('completed', 'failed', 'dead_lettered', 'compensated')
            AND NOT EXISTS (SELECT FROM backplane_deadletter d WHERE d.task_id = p.id AND d.status = 'pending')))
      -- Nothing awaits a person or the relay.
      AND NOT EXISTS (SELECT FROM backplane_deadletter d WHERE d.task_id = t.id AND d.status = 'pending')
      AND NOT EXISTS (
          SELECT FROM backplane_outboxmessage o
          WHERE o.task_id = t.id
            AND (o.status = 'pending' OR o.holds_key
                 OR EXISTS (SELECT FROM backplane_deadletter d
                            WHERE d.outbox_message_id = o.id AND d.status = 'pending')))
      AND NOT EXISTS (SELECT FROM backplane_integrityalert a WHERE a.task_id = t.id AND a.acknowledged_at IS NULL)
)
$$;

CREATE FUNCTION backplane_prune_task(task_to_prune uuid) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = public, pg_temp
-- Restored when the function returns, whatever it set inside (see the DELETE of the events).
SET backplane.pruning = 'off'
AS $$
DECLARE
    events_deleted bigint;
BEGIN
    -- 1. The task's row, locked: appends, decisions and the verifier's writes wait for it or
    --    hold it; one that is held is skipped until the next run, never waited for.
    PERFORM FROM backplane_task WHERE id = task_to_prune FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- 2. Checked again under the lock (the caller's choice was made without one).
    IF NOT backplane_task_prunable(task_to_prune) THEN
        RETURN NULL;
    END IF;
    -- 3. Whatever refers to the task, then its events, then the task.
    DELETE FROM backplane_deadletter
    WHERE task_id = task_to_prune
       OR outbox_message_id IN (SELECT id FROM backplane_outboxmessage WHERE task_id = task_to_prune);
    DELETE FROM backplane_outboxmessage WHERE task_id = task_to_prune;
    DELETE FROM recovery_toolcall WHERE task_id = task_to_prune;
    DELETE FROM backplane_idempotentreplay WHERE task_id = task_to_prune;
    DELETE FROM backplane_verifiedhead WHERE task_id = task_to_prune;
    DELETE FROM backplane_integrityalert WHERE task_id = task_to_prune;
    -- The event trigger lets these rows go only with the flag on and their leaves exported.
    PERFORM set_config('backplane.pruning', 'on', true);
    DELETE FROM backplane_event WHERE task_id = task_to_prune;
    GET DIAGNOSTICS events_deleted = ROW_COUNT;
    PERFORM set_config('backplane.pruning', 'off', true);
    DELETE FROM backplane_task WHERE id = task_to_prune;
    RETURN events_deleted;
END
$$;

REVOKE ALL ON FUNCTION backplane_prune_task(uuid) FROM PUBLIC;
"""

DROP_FUNCTIONS = r"""
DROP FUNCTION IF EXISTS backplane_prune_task(uuid);
DROP FUNCTION IF EXISTS backplane_task_prunable(uuid);
"""


def grant_execute(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Only the application's role may call the pruning function (0018 creates the role)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [settings.BACKPLANE_DB_APP_ROLE])
        if cursor.fetchone() is not None:
            cursor.execute(sql.SQL("GRANT EXECUTE ON FUNCTION backplane_prune_task(uuid) TO {}").format(
                sql.Identifier(settings.BACKPLANE_DB_APP_ROLE)))


class Migration(migrations.Migration):

    dependencies = [
        ('backplane', '0020_task_retention_indexes'),
        ('recovery', '0005_tool_namespace'),
    ]

    operations = [
        migrations.CreateModel(
            name='RetentionRule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('namespace', models.CharField(max_length=100, validators=[django.core.validators.RegexValidator(
                    '^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$',
                    "letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)")])),
                ('kind', models.CharField(blank=True, default='', help_text='Blank: every kind of the namespace.',
                                          max_length=100)),
                ('keep_seconds', models.PositiveIntegerField(
                    help_text='How long a finished task is kept after its last event (e.g. 86400 for a day).')),
                ('statuses', ArrayField(
                    base_field=models.CharField(choices=[('completed', 'Completed'), ('failed', 'Failed'),
                                                 ('dead_lettered', 'Dead Lettered'),
                                                 ('compensated', 'Compensated')], max_length=20),
                    default=recovery.models.default_retained_statuses,
                    help_text='Which finished tasks the rule prunes.', size=None)),
                ('is_active', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('tasks_pruned', models.PositiveBigIntegerField(default=0)),
                ('events_pruned', models.PositiveBigIntegerField(default=0)),
                ('last_pruned_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'constraints': [models.CheckConstraint(
                    condition=models.Q(('statuses__contained_by', ['completed', 'failed', 'dead_lettered',
                                                                   'compensated']), ('statuses__len__gt', 0)),
                    name='retention_rule_finished_statuses')],
            },
        ),
        migrations.RunSQL(FUNCTIONS, DROP_FUNCTIONS),
        migrations.RunPython(grant_execute, migrations.RunPython.noop),
    ]
