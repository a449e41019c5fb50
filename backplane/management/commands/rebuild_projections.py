"""``manage.py rebuild_projections [--check | --reconcile --reason TEXT] [--task UUID ...]``:
task rows (and the cost rollups) against their logs."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.eventlog import costs, projections
from backplane.eventlog.models import Task


class Command(BaseCommand):
    help = (
        "Replay every task's log (or the given tasks') through the reducer and rewrite the rows that "
        "differ; with --check, only list them and exit 1 if there are any."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--check", action="store_true", help="change nothing; exit 1 if a row differs")
        mode.add_argument(
            "--reconcile", action="store_true",
            help="keep the rows and record their values in the logs (ProjectionReconciled), for histories "
                 "written before every transition was an event; needs --reason",
        )
        parser.add_argument("--reason", default="", help="why the rows are right (with --reconcile)")
        parser.add_argument("--by", default="operator", help="who decided (with --reconcile)")
        parser.add_argument(
            "--task", dest="task_ids", action="append", type=uuid.UUID, metavar="UUID",
            help="only this task (repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task_ids: list[uuid.UUID] | None = options["task_ids"]
        if task_ids is not None:
            missing = set(task_ids) - set(Task.objects.filter(pk__in=task_ids).values_list("pk", flat=True))
            if missing:
                raise CommandError(f"no task {', '.join(sorted(map(str, missing)))}")
        if options["reconcile"]:
            if not options["reason"].strip():
                raise CommandError("--reconcile needs --reason")
            count = projections.projection_reconcile(task_ids=task_ids, decided_by=options["by"],
                                                     reason=options["reason"])
            self.stdout.write(f"recorded {count} task row(s) in their logs (ProjectionReconciled)")
            return
        if not options["check"]:
            changed = projections.projection_rebuild(task_ids=task_ids)
            self.stdout.write(f"rebuilt {changed} task row(s) from their logs")
            return

        drifted = 0
        for drift in projections.projection_check(task_ids=task_ids):
            drifted += 1
            self.stdout.write(f"task {drift.task_id} differs from its log:")
            for name, (row, log) in drift.differences.items():
                self.stdout.write(
                    f"  {name}: row={projections.shown_value(row)} log={projections.shown_value(log)}"
                )
        if drifted:
            self.stdout.write(f"{drifted} task row(s) differ from their logs")
        # The cost rollups are projections of the log too (backplane/eventlog/costs.py); they are
        # checked whole (they sum over tasks), whatever tasks were named.
        rollups = costs.rollup_differences()
        for line in rollups:
            self.stdout.write(f"cost rollup {line}")
        if rollups:
            self.stdout.write(f"{len(rollups)} cost rollup(s) differ from the sum of their events")
        if drifted or rollups:
            # SystemExit rather than CommandError: the exit code is the answer, the lines above
            # already say why, and callers in process (tests) read the code the same way.
            raise SystemExit(1)
        self.stdout.write("every checked task row matches its log, and every cost rollup the sum of its events")
