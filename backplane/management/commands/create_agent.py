from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.eventlog import services
from backplane.eventlog.errors import BackplaneError


class Command(BaseCommand):
    help = "Register an agent and print its API token (shown once; only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--namespace", required=True)
        parser.add_argument("--kinds", default="", help="comma-separated task kinds it may claim (default: all)")

    def handle(self, *args: Any, **options: Any) -> None:
        kinds = [k.strip() for k in options["kinds"].split(",") if k.strip()]
        try:
            created = services.agent_create(name=options["name"], namespace=options["namespace"], kinds=kinds)
        except BackplaneError as exc:
            raise CommandError(f"{exc.message}: {exc.details}") from None
        self.stderr.write(f"Agent {created.agent} created. Its token is shown only now:")
        self.stdout.write(created.token)
