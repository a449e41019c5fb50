"""Retention prunes a task's approval requests and their decisions with it (recovery 0006's
``backplane_prune_task``, the same function with two more DELETEs before the tool calls').

A task is pruned only once finished, exported and verifiable offline; its approval requests and
decisions are in its events (``ApprovalRequested`` … ``ApprovalGranted``), which the export keeps."""

import importlib

from django.db import migrations

_RETENTION = importlib.import_module("recovery.migrations.0006_retention")
_START = _RETENTION.FUNCTIONS.index("CREATE FUNCTION backplane_prune_task")
_END = _RETENTION.FUNCTIONS.index("$$;", _START) + len("$$;")
PRUNE_TASK_0006 = _RETENTION.FUNCTIONS[_START:_END].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)

_TOOL_CALLS = "    DELETE FROM recovery_toolcall WHERE task_id = task_to_prune;\n"
assert _TOOL_CALLS in PRUNE_TASK_0006
PRUNE_TASK = PRUNE_TASK_0006.replace(_TOOL_CALLS, (
    "    DELETE FROM recovery_approvaldecision\n"
    "    WHERE request_id IN (SELECT id FROM recovery_approvalrequest WHERE task_id = task_to_prune);\n"
    "    DELETE FROM recovery_approvalrequest WHERE task_id = task_to_prune;\n"
) + _TOOL_CALLS)


class Migration(migrations.Migration):

    dependencies = [
        ("recovery", "0017_approvers_role"),
    ]

    operations = [migrations.RunSQL(PRUNE_TASK, PRUNE_TASK_0006)]
