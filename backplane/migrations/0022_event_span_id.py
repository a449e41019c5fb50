"""The span that wrote each event (telemetry/tracing.py), so the backplane's later work on a
task joins the task's trace. Nullable, so adding it rewrites no row of the append-only table
(PostgreSQL only records the column) and the triggers that refuse UPDATE are not involved."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("backplane", "0021_merkle_nodes")]

    operations = [
        migrations.AddField(
            model_name="event",
            name="span_id",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
    ]
