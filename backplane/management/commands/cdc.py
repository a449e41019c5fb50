"""The CDC relay's part on the server and its Kafka Connect files (backplane/delivery/cdc.py).

    manage.py cdc setup [--password P]   the role, the publication and the slot (as the owner)
    manage.py cdc config --dir D         D/worker.properties and D/connector.properties
    manage.py cdc status                 the slot: active, WAL status, bytes behind
    manage.py cdc teardown               drop the slot, the publication and the role
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from backplane.delivery import cdc


class Command(BaseCommand):
    help = "Set up, configure, inspect or tear down the CDC relay (Debezium through Kafka Connect)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        setup = actions.add_parser("setup", help="create the role, the publication and the replication slot")
        setup.add_argument("--password", default=settings.BACKPLANE_CDC_PASSWORD,
                           help="the role's password (default BACKPLANE_CDC_PASSWORD)")
        config = actions.add_parser("config", help="write Kafka Connect's worker and connector files")
        config.add_argument("--dir", type=Path, required=True, help="where to write them (and keep the offsets)")
        config.add_argument("--rest-port", type=int, default=8083, help="the worker's REST port on 127.0.0.1")
        actions.add_parser("status", help="the replication slot's state")
        actions.add_parser("teardown", help="drop the slot, the publication and the role")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "setup":
                done = cdc.cdc_setup(password=options["password"] or None)
            elif action == "teardown":
                done = cdc.cdc_teardown()
            elif action == "config":
                done = self._write_config(options["dir"], options["rest_port"])
            else:
                state = cdc.slot_state()
                done = [f"slot {settings.BACKPLANE_CDC_SLOT}: " + (
                    f"active={state.active} wal_status={state.wal_status} lag_bytes={state.lag_bytes}"
                    if state.exists else "missing")]
        except cdc.CdcSetupError as exc:
            raise CommandError(str(exc)) from exc
        for line in done or ["nothing to do"]:
            self.stdout.write(line)

    def _write_config(self, directory: Path, rest_port: int) -> list[str]:
        directory.mkdir(parents=True, exist_ok=True)
        worker = directory / "worker.properties"
        connector = directory / "connector.properties"
        worker.write_text(cdc.properties_text(cdc.worker_properties(state_dir=directory, rest_port=rest_port)))
        connector.write_text(cdc.properties_text(cdc.connector_properties()))
        connector.chmod(0o600)  # it holds the role's password
        return [f"wrote {worker}", f"wrote {connector}"]
