"""``manage.py duties [--check]``: each periodic duty's last success and whether it is overdue."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from backplane.runtime.duties import duties_state


class Command(BaseCommand):
    help = (
        "List the periodic duties (the beat schedule) with their last success and state; with --check, "
        "exit 1 when one is overdue (a container healthcheck for the worker)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--check", action="store_true", help="exit 1 if a duty is overdue")

    def handle(self, *args: Any, **options: Any) -> None:
        states = duties_state()
        width = max(len(state.name) for state in states)
        for state in states:
            if state.age_seconds is None:
                age = "never scheduled"
            elif state.last_succeeded_at is None or state.age_seconds < (
                    timezone.now() - state.last_succeeded_at).total_seconds() - 0.5:
                age = f"{state.age_seconds:.0f}s since beat started watching, no success since"
            else:
                age = f"{state.age_seconds:.0f}s since its last success"
            mark = "OVERDUE" if state.overdue else "ok"
            every = f"every {state.interval_seconds:g}s"
            line = f"{state.name:<{width}}  {every:<12}  {mark:<7}  {age}"
            if state.overdue:
                error = f"  ({state.last_error[:120]})" if state.last_error else ""
                self.stdout.write(self.style.ERROR(line) + error)
            else:
                self.stdout.write(line)
        if options["check"] and any(state.overdue for state in states):
            raise SystemExit(1)
