from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.eventlog.costs import prices_load


class Command(BaseCommand):
    help = "Add the rates of the prices file that the price table lacks (insert-only; docs/costs.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--file", type=Path, default=None, help="default: BACKPLANE_PRICES_FILE")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"] or settings.BACKPLANE_PRICES_FILE
        if not path.is_file():
            raise CommandError(f"no prices file at {path}")
        try:
            added = prices_load(path)
        except (ValueError, KeyError) as exc:
            raise CommandError(f"{path}: {exc}") from exc
        self.stdout.write(f"{added} rate(s) added from {path}")
