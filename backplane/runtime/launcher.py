"""``make run``: the whole product in one foreground command.

Starts the embedded PostgreSQL (unless ``DATABASE_URL`` is set), migrates, makes sure an
admin login exists and prints it, then runs the ASGI server, a Celery worker and Celery
beat. Ctrl-C or SIGTERM stops every process it started and then the database; so does
the death of any one of them (a half-running product is worse than a stopped one).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

BASE_DIR = Path(__file__).resolve().parents[2]
logger = logging.getLogger("backplane.runtime.launcher")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 15.0


class Launcher:
    def __init__(self, *, host: str, port: int, var_dir: Path) -> None:
        self.host = host
        self.port = port
        self.var_dir = var_dir
        self.pgdata = var_dir / "pgdata"
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.started_database = False
        self.stop_requested: str | None = None
        self.parent_pid = os.getppid()
        self.env = dict(os.environ)
        self.env.setdefault("BACKPLANE_ENV", "development")
        self.env["BACKPLANE_VAR_DIR"] = str(var_dir)
        self.env.setdefault("PYTHONUNBUFFERED", "1")

    # --- setup ------------------------------------------------------------------------------

    def start_database(self) -> None:
        if self.env.get("DATABASE_URL"):
            logger.info("using DATABASE_URL; no embedded PostgreSQL started")
            return
        from backplane.runtime import embedded_db

        url = embedded_db.start(self.pgdata)
        self.started_database = True
        (self.var_dir / "database_url").write_text(url + "\n")
        self.env["DATABASE_URL"] = url
        logger.info("embedded PostgreSQL running, data in %s", self.pgdata)

    def manage(self, *args: str) -> None:
        subprocess.run([sys.executable, str(BASE_DIR / "manage.py"), *args], env=self.env, check=True, cwd=BASE_DIR)

    # --- the product's processes ------------------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> None:
        # Each child leads its own session so a terminal's Ctrl-C reaches only us, and we
        # stop them in order; their own children (Celery's pool) go with their group.
        self.children[name] = subprocess.Popen(argv, env=self.env, cwd=BASE_DIR, start_new_session=True)
        logger.info("started %s (pid %d)", name, self.children[name].pid)

    def spawn_all(self) -> None:
        python = sys.executable
        self.spawn(
            "web",
            [python, "-m", "uvicorn", "backplane.asgi:application", "--host", self.host, "--port", str(self.port),
             "--no-access-log", "--lifespan", "off"],
        )
        self.spawn(
            "worker",
            [python, "-m", "celery", "-A", "backplane", "worker", "--loglevel", "INFO", "--concurrency", "2",
             "--hostname", f"worker@{os.uname().nodename}"],
        )
        self.spawn(
            "beat",
            [python, "-m", "celery", "-A", "backplane", "beat", "--loglevel", "INFO",
             "--schedule", str(self.var_dir / "celerybeat-schedule"), "--pidfile", ""],
        )

    def wait(self) -> int:
        """Block until a stop signal, a child's death, or the death of our parent (make)."""
        while self.stop_requested is None:
            for name, child in self.children.items():
                code = child.poll()
                if code is not None:
                    logger.error("%s exited with code %s; stopping everything", name, code)
                    return 1
            if os.getppid() != self.parent_pid:
                logger.warning("parent process went away; stopping everything")
                return 1
            time.sleep(0.3)
        logger.info("received %s; stopping everything", self.stop_requested)
        return 0

    def shutdown(self) -> None:
        for child in self.children.values():
            # The leader only: Celery and uvicorn shut their own workers down cleanly.
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS
        for name, child in self.children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0fs; killing it", name, GRACE_SECONDS)
            # Whatever is left in the group (a stuck pool process) is killed either way.
            self._signal_group(child, signal.SIGKILL)
            child.wait()
        if self.started_database:
            from backplane.runtime import embedded_db

            embedded_db.stop(self.pgdata)
            logger.info("embedded PostgreSQL stopped")

    @staticmethod
    def _signal_group(child: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            pass

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = signal.Signals(signum).name

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)
        self.var_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_database()
            self.manage("migrate", "--noinput")
            # The login printed opens the dashboard; the admin stays at /admin/.
            self.manage("ensure_admin", "--url", f"http://{self.host}:{self.port}/")
            if self.stop_requested:
                return 0
            self.spawn_all()
            return self.wait()
        except subprocess.CalledProcessError as exc:
            logger.error("setup step failed: %s", exc)
            return 1
        finally:
            self.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backplane.runtime.launcher")
    parser.add_argument("--host", default=os.environ.get("BACKPLANE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("BACKPLANE_PORT", "8000")))
    parser.add_argument("--var-dir", type=Path, default=Path(os.environ.get("BACKPLANE_VAR_DIR", BASE_DIR / "var")))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(message)s")
    return Launcher(host=args.host, port=args.port, var_dir=args.var_dir.resolve()).run()


if __name__ == "__main__":
    sys.exit(main())
