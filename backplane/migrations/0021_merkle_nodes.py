"""Stored perfect subtrees of the sealed Merkle tree (``MerkleNode``), so that a proof reads
O(log n) rows instead of every leaf (backplane/integrity/sealing.py, docs/architecture.md).

1. The table: primary key (level, index); only levels that are multiples of 4 are stored
   (``MERKLE_TILE_HEIGHT``), about one row per 15 leaves.
2. Append-only, like the leaves and tree heads (0008's trigger function). The application's
   role gets its privileges from 0018's default privileges, as every table created since.
3. The backfill: the nodes of every leaf sealed so far, streamed from the leaf table in leaf
   order, 50,000 leaves a read, and written with COPY; memory stays O(log n) whatever the
   size. It holds the sealer's advisory lock meanwhile, so no sealer run interleaves; a sealer
   of the previous release that runs after it (migrations run against a live product) leaves
   leaves without nodes, which the next run of the new sealer fills in the same way.
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

APPEND_ONLY = r"""
CREATE TRIGGER backplane_merklenode_append_only BEFORE UPDATE OR DELETE ON backplane_merklenode
    FOR EACH ROW EXECUTE FUNCTION backplane_reject_change_of_history();
"""

APPEND_ONLY_REVERSE = r"""
DROP TRIGGER IF EXISTS backplane_merklenode_append_only ON backplane_merklenode;
"""


def backfill(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Store the nodes of every sealed leaf (up to the latest signed tree head)."""
    # The product's own code: the nodes must be laid out exactly as the proofs read them.
    from backplane.integrity import sealing

    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [sealing.SEALER_LOCK_KEY])
        cursor.execute("SELECT coalesce(max(tree_size), 0) FROM backplane_signedtreehead")
        (tree_size,) = cursor.fetchone()
    sealing.merkle_nodes_fill_missing(tree_size=tree_size)


class Migration(migrations.Migration):

    dependencies = [
        ('backplane', '0020_task_retention_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='MerkleNode',
            fields=[
                ('pk', models.CompositePrimaryKey('level', 'index', blank=True, editable=False, primary_key=True, serialize=False)),
                ('level', models.PositiveSmallIntegerField()),
                ('index', models.BigIntegerField()),
                ('hash', models.BinaryField()),
            ],
        ),
        migrations.RunSQL(APPEND_ONLY, APPEND_ONLY_REVERSE),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
