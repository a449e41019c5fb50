"""``make run``: the whole product in one foreground command, supervised.

1. Takes ``var/run/launcher.lock`` (one ``make run`` per var directory; a second one says who
   runs and exits 1, touching nothing), then cleans up after a previous run that was killed:
   the processes recorded in ``var/run/launcher.json`` that still run (matched by pid *and*
   start time) are stopped. A web port held by anything else is reported before anything starts.
2. Starts the embedded PostgreSQL through its guard (``embedded_db guard``, a supervised child
   that adopts a server left running, restarts a dead one and stops it when we stop or die),
   unless ``DATABASE_URL`` is set; migrates as the owner of the tables; makes sure an admin
   login exists and prints it. Everything after migrate logs in as the application's role,
   which cannot change events (backplane/runtime/db_roles.py).
3. Runs the ASGI server (web), a Celery worker, Celery beat and, unless ``BACKPLANE_DEMO=0``,
   the demo fleet (``manage.py demo``, docs/demo.md) under ``Supervisor``: a child that dies
   is restarted with a backoff and the restart logged at WARNING; every child dies with the
   launcher, SIGKILL included (``PR_SET_PDEATHSIG``).
4. Watches the duties (``DutyWatchdog``): a worker can wedge with its process alive; when
   periodic duties are overdue although the worker and beat had the time to run them, both
   are restarted.
   Every child counts into the same metrics directory (``BACKPLANE_METRICS_DIR``, by default
   ``var/metrics``), which ``/metrics`` sums: emptied before the first child starts, and a dead
   child's pid is given to prometheus_client's ``mark_process_dead`` once the supervisor reaped it.
5. Ctrl-C or SIGTERM stops the demo, web, beat, worker, then the database, each within a grace
   period and then SIGKILLed.

``--clean`` (``make clean-db``) does step 1 without starting anything and also stops a
database left running; it refuses while a launcher runs.

Nothing here sets Django up: the launcher reads the duty table with plain SQL
(``backplane.runtime.duty_sql``) and leaves everything else to its children.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from urllib.parse import quote, urlsplit, urlunsplit

import psutil

from backplane.runtime import embedded_db
from backplane.runtime.duty_sql import OVERDUE_SQL, allowance_seconds
from backplane.runtime.env import env_bool
from backplane.runtime.supervisor import (
    InstanceLock,
    ProcessRecord,
    Program,
    ProgramSpec,
    Supervisor,
    die_with_parent,
    read_json,
    stop_recorded,
    write_json_atomically,
)

BASE_DIR = Path(__file__).resolve().parents[2]
logger = logging.getLogger("backplane.runtime.launcher")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The supervisor's loop: how soon a death is noticed and a due restart made.
TICK_SECONDS = 0.1
# Stopped in this order (the demo fleet first: it is a client); the database last, once nothing uses it.
APP_PROGRAMS = ("demo", "web", "beat", "worker")
DATABASE_PROGRAM = "database"
DATABASE_READY_SECONDS = 180.0  # a first start runs initdb
# A leftover guard stops its PostgreSQL on SIGTERM, which may take a checkpoint.
LEFTOVER_GRACE = {"app": 10.0, DATABASE_PROGRAM: 60.0}


APP_ROLE = "backplane_app"  # settings.BACKPLANE_DB_APP_ROLE's default


def with_user(url: str, user: str) -> str:
    """``url`` logging in as ``user`` (no password: the embedded server trusts local connections)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}@{host}"))


# The demo fleet's downstream queue (demo/downstream.py's QUEUE; tests/demo/test_downstream.py holds
# the two equal).
DEMO_QUEUE = "demo-downstream"

class SetupFailed(RuntimeError):
    """A start-up step failed; the message says which and why."""


class Launcher:
    def __init__(self, *, host: str, port: int, var_dir: Path, celery_log_level: str = "WARNING") -> None:
        self.host = host
        self.port = port
        self.var_dir = var_dir
        self.pgdata = var_dir / "pgdata"
        self.url_file = var_dir / "database_url"
        self.run_dir = var_dir / "run"
        self.state_file = self.run_dir / "launcher.json"
        self.lock = InstanceLock(self.run_dir / "launcher.lock")
        self.celery_log_level = celery_log_level
        self.stop_requested: str | None = None
        self.parent_pid = os.getppid()
        self.env = dict(os.environ)
        self.env.setdefault("BACKPLANE_ENV", "development")
        self.env["BACKPLANE_VAR_DIR"] = str(var_dir)
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.embedded_database = not self.env.get("DATABASE_URL")
        # Where every child writes its counters (settings.py reads BACKPLANE_METRICS_DIR): given
        # to them explicitly, so a child in production mode agrees with the directory emptied here.
        self.metrics_dir = Path(self.env.get("BACKPLANE_METRICS_DIR") or var_dir / "metrics")
        self.env["BACKPLANE_METRICS_DIR"] = str(self.metrics_dir)
        if env_bool("BACKPLANE_DEMO", True):
            # The demo's downstream consumer reads every topic (demo/downstream.py, which this
            # lower part may not import): declared as one of the product's own queues, so the relay
            # binds it before its first publish and the backplane's own topics have a route to it.
            declared = self.env.get("BACKPLANE_OUTBOX_QUEUES", "")
            self.env["BACKPLANE_OUTBOX_QUEUES"] = ",".join(filter(None, [declared, f"{DEMO_QUEUE}=#"]))
        self.child_pids: dict[str, int] = {}
        self.supervisor = Supervisor(env=self.env, cwd=BASE_DIR, on_spawn=self._record_children,
                                     before_backoff=self._last_look)
        self.watchdog: DutyWatchdog | None = None
        self.login_banner = ""
        self.announced = False
        self._next_web_probe = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def local_url(self) -> str:
        """Where a process on this machine reaches the web server (a wildcard bind is not an address)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://{host}:{self.port}"

    # --- one launcher per var directory, and what a killed one left behind -------------------

    def already_running_message(self) -> str:
        state = read_json(self.state_file) or {}
        launcher = state.get("launcher") or {}
        if launcher.get("pid"):
            return (f"Agent Backplane is already running on {self.var_dir}: launcher pid {launcher['pid']}, "
                    f"{state.get('url', '?')} . Stop it first (Ctrl-C in its terminal, or kill {launcher['pid']}).")
        return f"another launcher holds {self.lock.path}; it is starting or stopping"

    def clean_leftovers(self) -> None:
        """Stop what a killed launcher left running: only processes recorded in the state file
        whose pid and start time both match (a reused pid is someone else's)."""
        state = read_json(self.state_file)
        if state is None:
            return
        records = {name: ProcessRecord.from_json(data) for name, data in (state.get("children") or {}).items()}
        app = {name: record for name, record in records.items() if name != DATABASE_PROGRAM}
        stopped = stop_recorded(app, grace=LEFTOVER_GRACE["app"])
        if DATABASE_PROGRAM in records:
            stopped += stop_recorded({DATABASE_PROGRAM: records[DATABASE_PROGRAM]},
                                     grace=LEFTOVER_GRACE[DATABASE_PROGRAM])
        if stopped:
            previous = (state.get("launcher") or {}).get("pid", "?")
            logger.warning("the previous launcher (pid %s) died without stopping its processes; stopped %s",
                           previous, ", ".join(stopped))
        self.state_file.unlink(missing_ok=True)

    def port_problem(self) -> str | None:
        """Why the web server could not listen, or None. Asked before anything starts."""
        try:
            family, kind, proto, _, address = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
        except OSError as exc:
            return f"cannot resolve host {self.host!r}: {exc}"
        with socket.socket(family, kind, proto) as probe:
            # As uvicorn binds: a closed connection's TIME_WAIT does not count as taken.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    return f"cannot listen on {self.host}:{self.port}: {exc}"
                return (f"port {self.port} on {self.host} is in use by {self._port_owner()}, which this launcher "
                        f"did not start, so it is left alone. Stop it, or choose another port "
                        f"(BACKPLANE_PORT=8001 make run).")
        return None

    def _port_owner(self) -> str:
        try:
            connections = psutil.net_connections(kind="inet")
        except psutil.Error:
            return "another program"
        for conn in connections:
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self.port and conn.pid:
                try:
                    return f"pid {conn.pid} ({' '.join(psutil.Process(conn.pid).cmdline())[:200]})"
                except psutil.Error:
                    return f"pid {conn.pid}"
        return "another program"

    def _record_children(self, program: Program | None = None) -> None:
        """Keep ``launcher.json`` current: us and every child, by pid and start time."""
        if program is not None and program.pid is not None:
            previous = self.child_pids.get(program.name)
            if previous is not None and previous != program.pid:
                # A restart: the supervisor reaped the previous one, whatever stopped it.
                self.mark_metrics_dead(previous)
            self.child_pids[program.name] = program.pid
        me = ProcessRecord.of(os.getpid())
        write_json_atomically(self.state_file, {
            "launcher": me.as_json() if me else {"pid": os.getpid()},
            "url": self.url,
            "var_dir": str(self.var_dir),
            "children": {name: record.as_json() for name, record in self.supervisor.records().items()},
        })

    # --- the children's counters ---------------------------------------------------------------

    def empty_metrics_dir(self) -> None:
        """A run counts from zero: what a previous run's processes wrote goes before any child
        starts (Prometheus takes the drop for a counter reset, as after any restart)."""
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        for path in self.metrics_dir.glob("*.db"):
            path.unlink(missing_ok=True)

    def mark_metrics_dead(self, pid: int) -> None:
        """prometheus_client's bookkeeping for a process that died: its live gauges leave the sums
        (its counters stay in them, as they must). Imported here: the launcher never counts, and
        a process that imports it before Django's settings must not fix prometheus_client's mode."""
        from prometheus_client.multiprocess import mark_process_dead

        from backplane.telemetry.process_files import metrics_process_name

        mark_process_dead(metrics_process_name(pid), str(self.metrics_dir))

    # --- setup -------------------------------------------------------------------------------

    def start_database(self) -> None:
        if not self.embedded_database:
            logger.info("using DATABASE_URL; no embedded PostgreSQL started")
            return
        if embedded_db.is_running(self.pgdata):
            logger.warning("PostgreSQL was left running on %s (pid %s); adopting it",
                           self.pgdata, embedded_db.postmaster_pid(self.pgdata))
        # The guard writes the URL once the server answers; an old file must not pass for that.
        self.url_file.unlink(missing_ok=True)
        self.spawn(DATABASE_PROGRAM, [sys.executable, "-m", "backplane.runtime.embedded_db", "guard",
                                      "--pgdata", str(self.pgdata), "--url-file", str(self.url_file)])
        deadline = time.monotonic() + DATABASE_READY_SECONDS
        while not self.url_file.exists():
            if self.stop_requested:
                return
            if time.monotonic() > deadline:
                raise SetupFailed(f"PostgreSQL did not start within {DATABASE_READY_SECONDS:.0f} s")
            self.supervisor.tick()  # a guard that died is started again
            time.sleep(TICK_SECONDS)
        # Two roles, as in production (backplane/runtime/db_roles.py): migrate runs as the
        # server's superuser, which owns the tables; web, worker, beat and the admin command log
        # in as the application's role, which migrate lets log in (local trust, no password).
        owner_url = self.url_file.read_text().strip()
        self.env["MIGRATION_DATABASE_URL"] = owner_url
        self.env["DATABASE_URL"] = with_user(owner_url, self.env.get("BACKPLANE_DB_APP_ROLE", APP_ROLE))
        self.supervisor.programs[DATABASE_PROGRAM].proven = True
        logger.info("embedded PostgreSQL running, data in %s", self.pgdata)

    def manage(self, *args: str, capture: bool = False) -> str:
        done = subprocess.run(
            [sys.executable, str(BASE_DIR / "manage.py"), *args], env=self.env, cwd=BASE_DIR, check=True,
            stdout=subprocess.PIPE if capture else None, text=True, preexec_fn=die_with_parent(signal.SIGKILL),
        )
        return done.stdout or ""

    def ensure_admin(self) -> None:
        # The login printed opens the dashboard; the admin stays at /admin/.
        self.login_banner = self.manage("ensure_admin", "--url", self.url, capture=True)
        sys.stdout.write(self.login_banner)
        sys.stdout.flush()

    # --- the product's processes -------------------------------------------------------------

    def program_spec(self, name: str, argv: list[str]) -> ProgramSpec:
        if name == DATABASE_PROGRAM:
            # SIGTERM when we die: the guard stops PostgreSQL cleanly (pg_ctl stop -m fast).
            return ProgramSpec(name, argv, death_signal=signal.SIGTERM, stop_grace=60.0, stdin_pipe=True)
        # Celery's warm shutdown waits for running duties; the others stop at once.
        return ProgramSpec(name, argv, death_signal=signal.SIGKILL, stop_grace=15.0 if name == "worker" else 10.0)

    def spawn(self, name: str, argv: list[str]) -> None:
        self.supervisor.start(self.program_spec(name, argv))

    def spawn_all(self) -> None:
        python = sys.executable
        self.spawn(
            "web",
            [python, "-m", "uvicorn", "backplane.asgi:application", "--host", self.host, "--port", str(self.port),
             "--no-access-log", "--lifespan", "off", "--timeout-graceful-shutdown", "5"],
        )
        # Pool and concurrency come from settings (CELERY_WORKER_POOL, CELERY_WORKER_CONCURRENCY).
        self.spawn(
            "worker",
            [python, "-m", "celery", "-A", "backplane", "worker", "--loglevel", self.celery_log_level,
             "--hostname", f"worker@{os.uname().nodename}"],
        )
        self.spawn(
            "beat",
            [python, "-m", "celery", "-A", "backplane", "beat", "--loglevel", self.celery_log_level,
             "--schedule", str(self.var_dir / "celerybeat-schedule"), "--pidfile", ""],
        )
        # The demo fleet (docs/demo.md): agents working, crashing and being recovered, so the
        # dashboard shows the product doing its job from the first minute. A client like any other.
        if env_bool("BACKPLANE_DEMO", True):
            self.spawn("demo", [python, str(BASE_DIR / "manage.py"), "demo", "--base-url", self.local_url])

    def supervise(self) -> int:
        """Until a stop signal or the death of our parent (make): restart what dies, watch the
        duties, announce the product once the web server answers."""
        self.watchdog = DutyWatchdog(self.supervisor, self.env["DATABASE_URL"])
        while self.stop_requested is None:
            self.supervisor.tick()
            self.watchdog.tick()
            self._probe_web()
            if os.getppid() != self.parent_pid:
                logger.warning("parent process went away; stopping everything")
                return 1
            time.sleep(TICK_SECONDS)
        logger.info("received %s; stopping everything", self.stop_requested)
        return 0

    def _probe_web(self) -> None:
        """A web process that accepts a connection has proven itself (its backoff resets)."""
        web = self.supervisor.running("web")
        now = time.monotonic()
        if web is None or web.proven or now < self._next_web_probe:
            return
        self._next_web_probe = now + 0.2
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        try:
            socket.create_connection((host, self.port), timeout=0.2).close()
        except OSError:
            return
        web.proven = True
        if not self.announced:
            self.announced = True
            logger.info("Agent Backplane is up at %s", self.url)
            sys.stdout.write(self.login_banner)
            sys.stdout.flush()

    def _last_look(self, program: Program) -> None:
        if program.pid is not None:
            self.mark_metrics_dead(program.pid)
        if program.name in ("worker", "beat") and self.watchdog is not None:
            self.watchdog.look()

    def shutdown(self) -> None:
        self.supervisor.stop(APP_PROGRAMS)
        if DATABASE_PROGRAM in self.supervisor.programs:
            self.supervisor.stop([DATABASE_PROGRAM])
            # The guard stops PostgreSQL; if the guard itself was killed, we do.
            if embedded_db.is_running(self.pgdata):
                embedded_db.stop(self.pgdata)
            logger.info("embedded PostgreSQL stopped")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = signal.Signals(signum).name

    def stopping(self) -> bool:
        """Whether a stop signal arrived; ``_on_signal`` may set it between any two steps."""
        return self.stop_requested is not None

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        self.var_dir.mkdir(parents=True, exist_ok=True)
        if not self.lock.acquire():
            logger.error("%s", self.already_running_message())
            return 1
        try:
            self.clean_leftovers()
            self.empty_metrics_dir()
            problem = self.port_problem()
            if problem:
                logger.error("%s", problem)
                return 1
            self._record_children()
            try:
                self.start_database()
                if self.stopping():
                    return 0
                self.manage("migrate", "--noinput")
                # A lost or wrong key-encryption key stops here, naming it (docs/privacy.md).
                self.manage("privacy_keys", "check")
                self.ensure_admin()
                if self.stopping():
                    return 0
                self.spawn_all()
                return self.supervise()
            except subprocess.CalledProcessError as exc:
                logger.error("setup step failed: %s", exc)
                return 1
            except SetupFailed as exc:
                logger.error("%s", exc)
                return 1
            finally:
                self.shutdown()
        finally:
            self.state_file.unlink(missing_ok=True)
            self.lock.release()

    def clean(self) -> int:
        """``make clean-db``: stop what a killed launcher left behind, the database included."""
        if not self.lock.acquire():
            logger.error("%s `make clean-db` leaves a running product alone.", self.already_running_message())
            return 1
        try:
            self.clean_leftovers()
            if embedded_db.is_running(self.pgdata):
                pid = embedded_db.postmaster_pid(self.pgdata)
                embedded_db.stop(self.pgdata)
                logger.info("stopped the PostgreSQL left running on %s (pid %s)", self.pgdata, pid)
            else:
                logger.info("no PostgreSQL running on %s", self.pgdata)
            return 0
        finally:
            self.lock.release()


# --- the duty watchdog ---------------------------------------------------------------------


@dataclass(frozen=True)
class DutyReading:
    overdue: dict[str, float]  # duty -> seconds since its last success (or since beat began watching)
    intervals: dict[str, float]
    last_success: datetime | None  # the newest success of any duty
    last_watch_start: datetime | None  # when a beat last began watching (its beat_init)
    runs: dict[str, int] = field(default_factory=dict)  # duty -> finished runs, ever
    failures: dict[str, int] = field(default_factory=dict)  # duty -> runs that raised, ever


def read_duties(database_url: str) -> DutyReading:
    import psycopg

    # connect_timeout: a database that does not answer must not hold the supervisor's loop
    # for long (it restarts the other children from the same thread).
    with psycopg.connect(database_url, connect_timeout=2, autocommit=True,
                         options="-c statement_timeout=2000") as conn:
        overdue = {str(name): float(age) for name, age in conn.execute(OVERDUE_SQL).fetchall()}
        rows = conn.execute(
            "SELECT name, interval_seconds, last_succeeded_at, watch_started_at, runs_total, failures_total"
            " FROM backplane_duty ORDER BY name"
        ).fetchall()
    successes = [row[2] for row in rows if row[2] is not None]
    watch_starts = [row[3] for row in rows if row[3] is not None]
    return DutyReading(
        overdue=overdue,
        intervals={str(row[0]): float(row[1]) for row in rows},
        last_success=max(successes, default=None),
        last_watch_start=max(watch_starts, default=None),
        runs={str(row[0]): int(row[4]) for row in rows},
        failures={str(row[0]): int(row[5]) for row in rows},
    )


def duty_summary(previous: DutyReading | None, current: DutyReading, minutes: float) -> str:
    """One line for the console: what each duty did since the last summary, and what is overdue.

    The worker and beat log at WARNING (a line per duty run would bury everything else), so
    this line is how a person at the console sees that the duties run at all."""
    parts = []
    for name in sorted(current.runs):
        ran = current.runs[name] - (previous.runs.get(name, 0) if previous else 0)
        failed = current.failures.get(name, 0) - (previous.failures.get(name, 0) if previous else 0)
        parts.append(f"{name} {max(ran, 0)}" + (f" ({failed} failed)" if failed > 0 else ""))
    overdue = ", ".join(sorted(current.overdue)) or "none"
    return f"duties in the last {minutes:.0f} min: {', '.join(parts) or 'no runs recorded'}; overdue: {overdue}"


class DutyWatchdog:
    """Restarts the worker and beat when periodic duties are overdue although both (and the
    database) have been up longer than those duties' allowance: a worker whose process is alive
    but runs nothing, or a beat that stopped publishing.

    It reads ``backplane_duty`` every ``poll_seconds`` (every ``quick_poll_seconds`` while the
    worker or beat has not yet proven itself since its start, which is also what resets their
    restart backoff). With the database unreachable it judges nothing: the database is the
    problem then, and its guard restarts it. A restart that did not help (the duty itself
    fails every time) doubles the time given before the next one, up to 32 times.
    """

    def __init__(self, supervisor: Supervisor, database_url: str, *, poll_seconds: float = 5.0,
                 quick_poll_seconds: float = 1.0, restart_grace: float = 3.0, summary_seconds: float = 60.0) -> None:
        self.supervisor = supervisor
        self.database_url = database_url
        self.poll_seconds = poll_seconds
        self.quick_poll_seconds = quick_poll_seconds
        # A wedged worker ignores SIGTERM: its group is SIGKILLed after this.
        self.restart_grace = restart_grace
        self.next_poll = 0.0
        self.database_up_since: float | None = None
        self.restarts_in_a_row = 0
        self.summary_seconds = summary_seconds
        self.next_summary = time.monotonic() + summary_seconds
        self.summarized: DutyReading | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if now < self.next_poll:
            return
        unproven = [p for p in map(self.supervisor.running, ("worker", "beat")) if p is not None and not p.proven]
        self.next_poll = now + (self.quick_poll_seconds if unproven else self.poll_seconds)
        reading = self.look()
        if reading is not None:
            self._judge(reading, time.monotonic())
            self._summarize(reading, time.monotonic())

    def _summarize(self, reading: DutyReading, now: float) -> None:
        if self.summarized is None:
            # The first reading is the baseline: the counts are totals since the duties began.
            self.summarized = reading
            return
        if now < self.next_summary:
            return
        self.next_summary = now + self.summary_seconds
        # WARNING, the level the worker and beat log at: the console shows it by default.
        logger.warning("%s", duty_summary(self.summarized, reading, self.summary_seconds / 60))
        self.summarized = reading

    def look(self) -> DutyReading | None:
        """Read the duties and credit the worker and beat with what they did since they started."""
        import psycopg

        try:
            reading = read_duties(self.database_url)
        except psycopg.Error as exc:
            if self.database_up_since is not None:
                logger.info("duty watchdog: database unreachable (%s); duties are not judged while it is down",
                            exc.__class__.__name__)
            self.database_up_since = None
            return None
        if self.database_up_since is None:
            self.database_up_since = time.monotonic()
        worker, beat = self.supervisor.programs.get("worker"), self.supervisor.programs.get("beat")
        if worker is not None and _since_start(worker, reading.last_success):
            worker.proven = True
        if beat is not None and _since_start(beat, reading.last_watch_start):
            beat.proven = True
        return reading

    def _judge(self, reading: DutyReading, now: float) -> None:
        if not reading.overdue:
            self.restarts_in_a_row = 0
            return
        worker, beat = self.supervisor.running("worker"), self.supervisor.running("beat")
        if worker is None or beat is None or self.database_up_since is None:
            return  # one of them is being restarted already
        chance = min(worker.uptime(now) or 0.0, beat.uptime(now) or 0.0, now - self.database_up_since)
        patience = 2 ** min(self.restarts_in_a_row, 5)
        late = {name: age for name, age in reading.overdue.items()
                if chance > patience * allowance_seconds(reading.intervals.get(name, 0.0))}
        if not late:
            return
        logger.warning(
            "duties overdue although the worker and beat have run for %.0f s: %s; restarting the worker and beat%s",
            chance, ", ".join(f"{name} (no success for {age:.0f} s)" for name, age in sorted(late.items())),
            f" (restart {self.restarts_in_a_row + 1} in a row: a duty that fails every time is not cured "
            f"by restarts, see backplane_duty.last_error)" if self.restarts_in_a_row else "",
        )
        self.restarts_in_a_row += 1
        self.supervisor.restart("worker", grace=self.restart_grace)
        self.supervisor.restart("beat", grace=self.restart_grace)


def _since_start(program: Program, mark: datetime | None) -> bool:
    return mark is not None and program.started_wall is not None and mark >= program.started_wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backplane.runtime.launcher")
    parser.add_argument("--host", default=os.environ.get("BACKPLANE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("BACKPLANE_PORT", "8000")))
    parser.add_argument("--var-dir", type=Path, default=Path(os.environ.get("BACKPLANE_VAR_DIR", BASE_DIR / "var")))
    parser.add_argument("--celery-log-level", default=os.environ.get("BACKPLANE_CELERY_LOG_LEVEL", "WARNING"),
                        help="the worker's and beat's log level (INFO logs every duty run)")
    parser.add_argument("--clean", action="store_true",
                        help="start nothing: stop what a killed launcher left running, the database included "
                             "(refused while a launcher runs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(message)s")
    launcher = Launcher(host=args.host, port=args.port, var_dir=args.var_dir.resolve(),
                        celery_log_level=args.celery_log_level)
    return launcher.clean() if args.clean else launcher.run()


if __name__ == "__main__":
    sys.exit(main())
