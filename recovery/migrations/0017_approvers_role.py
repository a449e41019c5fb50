from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# The approvers' role (docs/production.md, "Roles"): they read as viewers do; which requests they
# decide is said by the tool policies that name their group.
APPROVERS = "Approvers"


def make_approvers(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name=APPROVERS)
    # Made by recovery 0013 on every database this migration runs on.
    group.permissions.add(*Permission.objects.filter(content_type__app_label="recovery", codename="view_backplane"))


def remove_approvers(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    Group = apps.get_model("auth", "Group")
    Group.objects.filter(name=APPROVERS).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("recovery", "0016_approval_requests"),
    ]

    operations = [migrations.RunPython(make_approvers, remove_approvers)]
