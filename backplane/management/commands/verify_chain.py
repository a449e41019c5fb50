from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.eventlog import selectors


class Command(BaseCommand):
    help = "Recompute the hash chains of one task or of every task; exit 1 if any is broken."

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--task", type=uuid.UUID, help="task id")
        target.add_argument("--all", action="store_true", help="every task")

    def handle(self, *args: Any, **options: Any) -> None:
        task_ids = [options["task"]] if options["task"] else None
        tasks = events = 0
        broken = []
        for result in selectors.chain_verify_all(task_ids=task_ids):
            tasks += 1
            events += result.checked
            if not result.valid:
                broken.append(result)
                self.stdout.write(
                    f"BROKEN task {result.task_id}: first invalid seq {result.first_invalid_seq} ({result.problem})"
                )
        if options["task"] and tasks == 0:
            raise CommandError(f"no task {options['task']}")
        self.stdout.write(
            f"verified {tasks} task(s), {events} event(s): {tasks - len(broken)} valid, {len(broken)} broken"
        )
        if broken:
            raise CommandError(f"{len(broken)} broken chain(s)")
