# The demo's downstream consumer records each message id it processed (backplane_client.consumer).
# Made here, by the owner of the schema, not by the consumer at start-up: under `make run` the
# processes log in as the application's role, which may not create tables (backplane 0018 gives
# it its privileges on the tables the owner makes).

from typing import Any

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from backplane_client.consumer import ensure_processed_table

TABLE = "demo_processed_messages"  # demo/downstream.py's TABLE (tests/demo/test_downstream.py)


def create_table(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ensure_processed_table(schema_editor.connection.connection, TABLE)


class Migration(migrations.Migration):
    dependencies = [
        ("demo", "0001_initial"),
        ("backplane", "0018_application_role"),
    ]

    operations = [
        migrations.RunPython(create_table, migrations.RunPython.noop),
    ]
