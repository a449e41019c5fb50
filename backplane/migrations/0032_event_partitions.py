"""The events table on hash partitions of ``task_id`` (docs/scaling.md, "Partitioning the events
table"; how to run it on a big table: docs/operations.md).

The work is ``backplane.eventlog.partitioning.events_partition``: it copies the events while
the table keeps taking appends, one transaction per batch, and holds appends back twice, briefly
(it logs for how long). Hence ``atomic = False``; an interrupted run is resumed by running
``migrate`` again. Not reversible: the code works on either shape, and going back would be the
same copy in the other direction.

Django's model keeps ``position`` as its primary key: the database's key is ``(position,
task_id)`` (a partitioned table's unique keys must hold the partition key), and one sequence
still gives every position once, so a position names one event as before.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from backplane.eventlog.partitioning import events_partition


def partition(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    events_partition(schema_editor.connection)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("backplane", "0031_personal_data"),
    ]

    operations = [migrations.RunPython(partition, elidable=False)]
