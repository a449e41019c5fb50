"""Retention's indexes move from last_event_at to finished_last_event_at, which only finished
tasks have (reducer.TaskState): an append to a running task then changes no indexed column of
the task row, so PostgreSQL can update the row in place (a HOT update, no new index entries).
The task table keeps room on each page for those updates (fillfactor)."""

from django.db import migrations, models

_FINISHED = "('completed', 'failed', 'dead_lettered', 'compensated')"


class Migration(migrations.Migration):

    dependencies = [
        ('backplane', '0022_event_span_id'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='task',
            name='task_retention_idx',
        ),
        migrations.RemoveIndex(
            model_name='task',
            name='task_retention_kind_idx',
        ),
        migrations.AddField(
            model_name='task',
            name='finished_last_event_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        # What the reducer makes of every finished task's log (the projection check replays it).
        migrations.RunSQL(
            f"UPDATE backplane_task SET finished_last_event_at = last_event_at WHERE status IN {_FINISHED}",
            migrations.RunSQL.noop,
        ),
        # A HOT update needs free space on the row's own page; new pages keep a fifth for it.
        migrations.RunSQL(
            "ALTER TABLE backplane_task SET (fillfactor = 80)",
            "ALTER TABLE backplane_task RESET (fillfactor)",
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('finished_last_event_at__isnull', False)), fields=['namespace', 'finished_last_event_at'], name='task_retention_idx'),
        ),
        migrations.AddIndex(
            model_name='task',
            index=models.Index(condition=models.Q(('finished_last_event_at__isnull', False)), fields=['namespace', 'kind', 'finished_last_event_at'], name='task_retention_kind_idx'),
        ),
    ]
