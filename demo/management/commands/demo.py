"""``manage.py demo``: run the demo fleet against a running product (docs/demo.md).

Without ``--tasks`` it runs until stopped (SIGTERM or Ctrl-C), feeding leads at ``--rate`` per
second; ``make run`` starts it this way unless ``BACKPLANE_DEMO=0``. With ``--tasks N`` it
creates N leads, waits until every one has finished or is waiting for a person, and with
``--report`` writes the crash report (JSON and a Plotly page) and exits 1 on any duplicate
side effect, lost task, broken chain or task row that differs from its log.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from backplane.eventlog.models import Task
from demo import report as crash_report
from demo.downstream import Downstream, downstream_prune
from demo.fleet import (
    Fleet,
    FleetConfig,
    default_base_url,
    demo_dead_letters_decide,
    demo_prune_own_records,
    open_root_tasks,
)
from demo.models import Observation
from demo.toolservice import Faults

logger = logging.getLogger("demo")


class Command(BaseCommand):
    help = "Run the demo fleet: agents that crash in the four failure zones, and the backplane recovering them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--base-url", default=None, help="the running product (default from BACKPLANE_PORT)")
        parser.add_argument("--namespace", default=None,
                            help="default demo-fleet while running, demo-batch with --tasks (a batch beside "
                                 "make run's fleet must not take over its agents)")
        parser.add_argument("--rate", type=float, default=settings.BACKPLANE_DEMO_RATE,
                            help="leads per second while running until stopped")
        parser.add_argument("--max-open", type=int, default=40, help="no new lead while this many are open")
        parser.add_argument("--crash-rate", type=float, default=settings.BACKPLANE_DEMO_CRASH_RATE,
                            help="probability that an attempt at a task is SIGKILLed in a failure zone")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--approver", default="admin",
                            help="running until stopped: the login added to Approvers, who decides enterprise charges")
        parser.add_argument("--orchestrators", type=int, default=None,
                            help="orchestrator processes (default 3 while running, 6 with --tasks)")
        parser.add_argument("--researchers", type=int, default=None,
                            help="research sub-agent processes (default 2 while running, 3 with --tasks)")
        parser.add_argument("--lease-seconds", type=int, default=5)
        parser.add_argument("--keep-seconds", type=int, default=settings.BACKPLANE_DEMO_KEEP_SECONDS,
                            help="finished demo tasks are pruned (retention rule) after this age")
        parser.add_argument("--transient-rate", type=float, default=0.1)
        parser.add_argument("--decline-rate", type=float, default=0.08)
        parser.add_argument("--outage-every", type=float, default=None,
                            help="seconds between crm-lookup outages (default 120 while running, none with --tasks)")
        parser.add_argument("--tasks", type=int, default=None, help="create this many leads, then stop")
        parser.add_argument("--timeout", type=float, default=None, help="with --tasks: give up after this long")
        parser.add_argument("--report", action="store_true", help="with --tasks: write the crash report")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--out", default=None, help="report directory (default var/demo/)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["report"] and options["tasks"] is None:
            raise CommandError("--report needs --tasks N")
        batch = options["tasks"]
        outage = options["outage_every"]
        if outage is None:
            outage = 0.0 if batch is not None else 120.0
        config = FleetConfig(
            base_url=options["base_url"] or default_base_url(),
            namespace=options["namespace"] or ("demo-fleet" if batch is None else "demo-batch"),
            tidy=batch is None, approver=options["approver"] if batch is None else None,
            seed=options["seed"], crash_rate=options["crash_rate"],
            orchestrators=options["orchestrators"] or (3 if batch is None else 6),
            researchers=options["researchers"] or (2 if batch is None else 3), lease_seconds=options["lease_seconds"],
            keep_seconds=options["keep_seconds"],
            faults=Faults(seed=options["seed"], transient_rate=options["transient_rate"],
                          decline_rate=options["decline_rate"], outage_every=outage),
        )
        stop = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        # One line per request from the feeder and the compensator would drown the console.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        fleet = Fleet(config, log_dir=Path(settings.VAR_DIR) / "demo" / "agents" / config.namespace)
        downstream = Downstream(stop)
        try:
            downstream.start()
            fleet.start()
            if options["tasks"] is None:
                self._run_until_stopped(fleet, options, stop)
                return
            code = self._run_batch(fleet, options, stop)
        finally:
            fleet.stop()
            stop.set()
            downstream.join(timeout=10)
        if code:
            raise CommandError("the crash report found problems (see above)", returncode=code)

    # --- running until stopped (make run) ---------------------------------------------------------

    def _run_until_stopped(self, fleet: Fleet, options: dict[str, Any], stop: threading.Event) -> None:
        rate, max_open = options["rate"], options["max_open"]
        next_lead = time.monotonic()
        next_summary = time.monotonic() + 60
        next_prune = time.monotonic() + 60
        logger.warning("demo fleet running: %s leads/s, crash rate %.0f %%, tools at %s (BACKPLANE_DEMO=0 turns "
                       "it off)", rate, 100 * fleet.config.crash_rate, fleet.tools_url)
        while not stop.is_set():
            fleet.tend()
            now = time.monotonic()
            if rate > 0 and now >= next_lead:
                next_lead = now + 1 / rate
                if open_root_tasks(fleet.config.namespace) < max_open:
                    try:
                        fleet.create_leads(1)
                    except Exception as exc:  # noqa: BLE001 (the product may be restarting; try again)
                        logger.warning("demo: could not create a lead: %s", exc)
            if now >= next_prune:
                next_prune = now + 60
                # Its own dead letters first (nobody may be watching), so their tasks can finish
                # and be pruned; the ledger rows of pruned tasks after twice the rule's age, which
                # leaves the export (hourly) time to run before the tasks themselves go.
                demo_dead_letters_decide(namespace=fleet.config.namespace)
                demo_prune_own_records(older_than=timedelta(seconds=2 * fleet.config.keep_seconds))
                downstream_prune(older_than=timedelta(seconds=2 * fleet.config.keep_seconds))
            if now >= next_summary:
                next_summary = now + 60
                crashes = Observation.objects.filter(kind="crash", at__gte=timezone.now() - timedelta(minutes=1))
                logger.warning("demo: %d leads so far, %d crashes in the last minute, %d agent restarts",
                               fleet.created, crashes.count(), fleet.restarts)
            stop.wait(0.1)

    # --- a batch with a report ------------------------------------------------------------------

    def _run_batch(self, fleet: Fleet, options: dict[str, Any], stop: threading.Event) -> int:
        count: int = options["tasks"]
        timeout = options["timeout"] or 120 + 0.5 * count
        started_at = timezone.now()
        deadline = time.monotonic() + timeout
        root_ids: list[str] = []
        failure: list[BaseException] = []

        def create() -> None:
            try:
                for _ in range(count):
                    if stop.is_set():
                        return
                    root_ids.extend(fleet.create_leads(1))
            except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
                failure.append(exc)

        creator = threading.Thread(target=create, name="demo-leads", daemon=True)
        creator.start()
        last_line = time.monotonic()
        settled = False
        while not stop.is_set() and time.monotonic() < deadline:
            fleet.tend()
            if failure:
                raise CommandError(f"could not create the leads: {failure[0]}")
            if not creator.is_alive() and self._all_settled(fleet, root_ids):
                settled = True
                break
            if time.monotonic() - last_line > 10:
                last_line = time.monotonic()
                self.stderr.write(f"demo: {len(root_ids)}/{count} leads created, "
                                  f"{open_root_tasks(fleet.config.namespace)} open, {fleet.restarts} agent restarts")
            stop.wait(2.0)
        finished_at = timezone.now()
        fleet.stop()
        if not options["report"]:
            return 0
        config = {"tasks": count, "crash_rate": fleet.config.crash_rate, "seed": fleet.config.seed,
                  "orchestrators": fleet.config.orchestrators, "researchers": fleet.config.researchers,
                  "lease_seconds": fleet.config.lease_seconds, "namespace": fleet.config.namespace,
                  # Stopped before every task settled: open ones are unfinished, not proven lost.
                  "timed_out": not settled, "interrupted": stop.is_set(),
                  "faults": vars(fleet.config.faults)}
        result = crash_report.build_report(root_ids=root_ids, started_at=started_at, finished_at=finished_at,
                                           config=config, agent_restarts=fleet.restarts)
        out = Path(options["out"] or Path(settings.VAR_DIR) / "demo")
        stamp = started_at.strftime("%Y%m%dT%H%M%S")
        json_path, html_path = out / f"crash-report-{stamp}.json", out / f"crash-report-{stamp}.html"
        crash_report.write_json(result, json_path)
        crash_report.write_html(result, html_path)
        if options["json"]:
            self.stdout.write(json_path.read_text())
        else:
            for line in crash_report.summary_lines(result):
                self.stdout.write(line)
            self.stdout.write(f"report: {json_path} and {html_path}")
        return 1 if result["problems"] else 0

    def _all_settled(self, fleet: Fleet, root_ids: list[str]) -> bool:
        run = fleet.run
        tasks = Task.objects.filter(namespace=fleet.config.namespace).filter(
            Q(metadata__demo_run=run) | Q(parent__metadata__demo_run=run))
        return not crash_report.unsettled(tasks).exists()
