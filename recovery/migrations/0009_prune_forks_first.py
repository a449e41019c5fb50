"""A task with forks waits for them, as a task with sub-tasks does (forks go first): a fork's
history is read through its source (backplane/eventlog/lineage.py), and the row is its foreign key."""

from django.db import migrations

PRUNABLE_WITH_FORKS = r"""
CREATE OR REPLACE FUNCTION backplane_task_prunable(candidate uuid) RETURNS boolean
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
      -- Forks go first too: a fork's history is read through its source.
      AND NOT EXISTS (SELECT FROM backplane_task f WHERE f.forked_from_id = t.id)
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
"""

PRUNABLE_BEFORE_FORKS = r"""
CREATE OR REPLACE FUNCTION backplane_task_prunable(candidate uuid) RETURNS boolean
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
"""


class Migration(migrations.Migration):

    dependencies = [
        ("recovery", "0008_toolcall_effect_key"),
        ("backplane", "0024_task_forks"),
    ]

    operations = [
        migrations.RunSQL(PRUNABLE_WITH_FORKS, PRUNABLE_BEFORE_FORKS),
    ]
