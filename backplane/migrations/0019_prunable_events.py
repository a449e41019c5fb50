"""Events may leave the database, but only whole exported tasks, and only through retention.

Retention (recovery/retention.py, ``backplane_prune_task`` in recovery's migration 0006) deletes a
finished task's events once every one of them is sealed and exported to the audit destination.
Two things here make that possible without loosening anything else:

1. Leaves outlive their events: ``backplane_merkleleaf.event_id`` loses its foreign key (the
   unique index stays), so the tree, its proofs and its signed heads, which read only the
   leaves' ``event_hash``, are unchanged by a deletion.
2. The event trigger of 0002 lets a DELETE through only when the transaction has turned
   ``backplane.pruning`` on (the pruning function does, around its one DELETE) **and** the row
   has a leaf, sealed with the row's hash, below the tree size the last audit segment covers.
   UPDATE is refused as before, and so is a DELETE without either condition; TRUNCATE keeps its
   own trigger. The application's role still has no DELETE privilege on the table (0018): only
   the pruning function, which runs as the owner, can reach this trigger with a DELETE.
"""

from django.db import migrations, models

REJECT_CHANGE_UNLESS_PRUNING = r"""
CREATE OR REPLACE FUNCTION backplane_event_reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND current_setting('backplane.pruning', true) = 'on'
       AND EXISTS (
           SELECT FROM backplane_merkleleaf l
           WHERE l.event_id = OLD.position
             AND l.event_hash = OLD.hash
             AND l.leaf_index < (SELECT coalesce(max(s.tree_size), 0) FROM backplane_auditsegment s))
    THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'backplane_event is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'events are immutable; append a new event instead';
END
$$;
"""

# 0002's body.
REJECT_CHANGE = r"""
CREATE OR REPLACE FUNCTION backplane_event_reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'backplane_event is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'events are immutable; append a new event instead';
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('backplane', '0018_application_role'),
    ]

    operations = [
        # Reversing restores the foreign key, which fails once a leaf's event was pruned.
        migrations.AlterField(
            model_name='merkleleaf',
            name='event',
            field=models.OneToOneField(db_column='event_id', db_constraint=False, on_delete=models.deletion.DO_NOTHING,
                                       related_name='leaf', to='backplane.event'),
        ),
        migrations.RunSQL(REJECT_CHANGE_UNLESS_PRUNING, REJECT_CHANGE),
    ]
