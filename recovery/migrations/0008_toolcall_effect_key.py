from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("recovery", "0007_cache_table_unlogged"),
    ]

    operations = [
        # Every call recorded before forks existed is its own effect.
        migrations.AddField(
            model_name="toolcall",
            name="effect_key",
            field=models.CharField(default="", max_length=64),
            preserve_default=False,
        ),
        migrations.RunSQL(
            "UPDATE recovery_toolcall SET effect_key = idempotency_key",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                condition=models.Q(("effect_key", models.F("idempotency_key")), _negated=True),
                fields=["effect_key"],
                name="toolcall_effect_idx",
            ),
        ),
    ]
