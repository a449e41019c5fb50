"""The shared cache's table (settings.CACHES without REDIS_URL): the API's rate limits, shared
by every web process. Made here so that ``migrate`` is all a deployment needs; created even when
REDIS_URL is set now, so that unsetting it later finds the table ready."""

from django.core.management import call_command
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

TABLE = "backplane_cache"


def create_cache_table(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # Django's own command, so the table is exactly what DatabaseCache expects; it skips a
    # table that already exists (one made by hand with createcachetable).
    call_command("createcachetable", TABLE, database=schema_editor.connection.alias, verbosity=0)


def drop_cache_table(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    schema_editor.execute(f"DROP TABLE IF EXISTS {schema_editor.quote_name(TABLE)}")


class Migration(migrations.Migration):
    dependencies = [("recovery", "0003_toolcall_compensation_of")]

    operations = [migrations.RunPython(create_cache_table, drop_cache_table)]
