"""Retention's candidates (recovery/retention.py): a namespace's finished tasks, or those of one
kind in it, longest quiet first, so a batch reads them in order and stops at its LIMIT. Partial
(finished tasks only) and built ``CONCURRENTLY`` (hence ``atomic = False``) so appends, which
update task rows, never wait for the build; a failed concurrent build leaves an invalid index
behind, so each is dropped (if there) before it is built."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('backplane', '0019_prunable_events'),
    ]

    operations = [
        migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS task_retention_idx", migrations.RunSQL.noop),
        AddIndexConcurrently(
            model_name='task',
            index=models.Index(condition=models.Q(('status__in', ['compensated', 'completed', 'dead_lettered',
                                                                  'failed'])),
                               fields=['namespace', 'last_event_at'], name='task_retention_idx'),
        ),
        migrations.RunSQL("DROP INDEX CONCURRENTLY IF EXISTS task_retention_kind_idx", migrations.RunSQL.noop),
        AddIndexConcurrently(
            model_name='task',
            index=models.Index(condition=models.Q(('status__in', ['compensated', 'completed', 'dead_lettered',
                                                                  'failed'])),
                               fields=['namespace', 'kind', 'last_event_at'], name='task_retention_kind_idx'),
        ),
    ]
