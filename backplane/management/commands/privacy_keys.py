from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.privacy import keys, services


class Command(BaseCommand):
    help = (
        "The key-encryption keys (docs/privacy.md, \"Keys\"). `check`: exit 1 naming each key that does not "
        "open the data keys wrapped with it. `rotate --new NAME`: add a key to BACKPLANE_KEK_FILE, make it "
        "current and re-wrap every data key with it (no sealed value changes); `rotate` alone re-wraps with the "
        "current key (a KMS provider's, or after an interrupted rotation)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["check", "rotate"])
        parser.add_argument("--new", help="rotate: the new key's name, added to the key file")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "check":
            problems = services.kek_problems()
            for problem in problems:
                self.stderr.write(problem)
            if problems:
                raise CommandError("the key-encryption keys do not open the data keys")
            self.stdout.write("the key-encryption keys open every data key")
            return
        if options["new"]:
            if settings.BACKPLANE_KEK_PROVIDER != "backplane.privacy.keys.FileKeys" or not settings.BACKPLANE_KEK_FILE:
                raise CommandError("--new adds a key to BACKPLANE_KEK_FILE; another provider makes its own keys")
            try:
                keys.kek_file_add(Path(settings.BACKPLANE_KEK_FILE), options["new"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            keys.key_encryption_keys_forget()
        try:
            rewrapped = services.kek_rotate(progress=lambda done: self.stdout.write(f"re-wrapped {done}"))
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        current = keys.key_encryption_keys().current_id()
        self.stdout.write(f"{rewrapped} data keys re-wrapped with key-encryption key {current!r}; the others may go "
                          "once every web process runs with the new file")
