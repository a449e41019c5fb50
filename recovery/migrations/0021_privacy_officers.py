from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

# The privacy officers' role (docs/production.md, "Roles"; docs/privacy.md): they read as viewers
# do, read personal data in clear (each read recorded) and erase data subjects.
PRIVACY_OFFICERS = "Privacy officers"
PERMISSIONS = {"open_personal_data": "Can read personal data in clear", "erase_subject": "Can erase a data subject"}


def make_privacy_officers(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    ContentType = apps.get_model("contenttypes", "ContentType")
    # Made here rather than after migrate (post_migrate), so that the group can hold them now.
    subjects, _ = ContentType.objects.get_or_create(app_label="backplane", model="datasubject")
    granted = [Permission.objects.get_or_create(content_type=subjects, codename=codename, defaults={"name": name})[0]
               for codename, name in PERMISSIONS.items()]
    group, _ = Group.objects.get_or_create(name=PRIVACY_OFFICERS)
    group.permissions.add(*granted, *Permission.objects.filter(content_type__app_label="recovery",
                                                              codename="view_backplane"))


def remove_privacy_officers(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    apps.get_model("auth", "Group").objects.filter(name=PRIVACY_OFFICERS).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("recovery", "0020_budgets_that_ask"),
        ("backplane", "0031_personal_data"),
    ]

    operations = [migrations.RunPython(make_privacy_officers, remove_privacy_officers)]
