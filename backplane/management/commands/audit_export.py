from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from backplane.integrity.audit import export


class Command(BaseCommand):
    help = (
        "Export every sealed range not exported yet to the audit destination (what the hourly beat task "
        "does) and print each segment written."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        store = export.audit_store()
        try:
            run = export.audit_export_until_idle(store=store)
        except export.AuditExportFailed as exc:
            raise CommandError(str(exc)) from None
        for segment in run.segments:
            self.stdout.write(
                f"exported segment {segment.number}: leaves {segment.first_leaf}-{segment.last_leaf} "
                f"(tree size {segment.tree_size}, root {segment.root_hash}) to {segment.destination}"
            )
        if run.locked_out:
            self.stdout.write("another audit export is running; it exports what is left")
        elif not run.segments:
            self.stdout.write(f"nothing new to export to {store.url}")
