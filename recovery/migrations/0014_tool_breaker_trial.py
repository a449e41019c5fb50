# The gateway's "probe" is the breaker's trial (recovery/breakers.py): one name for one idea.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0013_roles_and_staff_scope"),
    ]

    operations = [
        migrations.RenameField(model_name="tool", old_name="probe_started_at", new_name="trial_started_at"),
    ]
