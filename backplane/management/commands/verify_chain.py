from __future__ import annotations

import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.integrity import verification


class Command(BaseCommand):
    help = (
        "Recompute the hash chains of one task or of every task; with --seals, also check the latest signed "
        "tree head against the events. Exit 1 if anything is broken."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--task", type=uuid.UUID, help="task id")
        target.add_argument("--all", action="store_true", help="every task")
        parser.add_argument(
            "--seals", action="store_true",
            help="also verify the latest signed tree head: its signature, and the Merkle root recomputed from "
                 "every sealed event's content (what the full verification duty does)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task_ids = [options["task"]] if options["task"] else None
        tasks = events = 0
        broken = []
        for result in verification.chains_check(task_ids=task_ids):
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
        seals_broken = options["seals"] and not self._seals_valid()
        if broken:
            raise CommandError(f"{len(broken)} broken chain(s)")
        if seals_broken:
            raise CommandError("the latest signed tree head does not match the events")

    def _seals_valid(self) -> bool:
        check = verification.seals_verify()
        if check.tree_size == 0:
            self.stdout.write("seals: nothing sealed yet")
        elif check.finding is None:
            self.stdout.write(f"seals: the signed tree head of size {check.tree_size} verifies against the events"
                              + (f" ({check.pruned} pruned after export)" if check.pruned else ""))
        else:
            self.stdout.write(f"BROKEN seals at tree size {check.tree_size}: {check.finding.problem}")
        return check.finding is None
