import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("backplane", "0023_task_finished_last_event_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="task",
            name="forked_from",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name="forks",
                to="backplane.task",
            ),
        ),
        migrations.AddField(
            model_name="task",
            name="forked_at_seq",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="task",
            name="sandbox",
            field=models.BooleanField(default=False),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("forked_at_seq__isnull", True), ("forked_from__isnull", True)),
                    models.Q(("forked_at_seq__gte", 1), ("forked_from__isnull", False)),
                    _connector="OR",
                ),
                name="task_fork_has_seq",
            ),
        ),
        migrations.AddConstraint(
            model_name="task",
            constraint=models.CheckConstraint(
                condition=models.Q(("sandbox", False)) | models.Q(("forked_from__isnull", False)),
                name="task_sandbox_is_a_fork",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("finished_last_event_at__isnull", False), ("sandbox", True)),
                fields=["finished_last_event_at"],
                name="task_sandbox_retention_idx",
            ),
        ),
    ]
