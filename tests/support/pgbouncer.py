"""A private PgBouncer for tests: Debian's ``pgbouncer`` (``make pgbouncer``) as a child process, in
transaction pooling mode, on a free port of 127.0.0.1, in front of one PostgreSQL server, with its
config, log and pid file under one temporary folder.

Clients log in to it with ``auth_type = trust``: acceptable only because it listens on the
loopback alone, for the length of a test (production's PgBouncer authenticates its clients,
docs/production.md). Towards PostgreSQL it logs in as the client's user with the password the
``auth_file`` holds for that user (none for the embedded server, which trusts its unix socket).
``[databases] * = host=… port=…`` passes every database name through, so pytest-django's test
databases and private servers' databases need no entry each.

PgBouncer refuses to run as root; as root it is started with ``user =`` set to the owner of the
server's unix socket directory (the embedded server's system user, whose data directory holds the
socket and is closed to others), and that user owns the folder.

``[databases]`` lives in a file of its own that pgbouncer.ini ``%include``s, as in production, where
the leader watch (backplane/runtime/leader_watch.py) owns that file. ``kill()`` is a SIGKILL; ``start()``
again starts it on the same port and config. ``retarget()`` points it at another server the way the
watch does after a failover: the same function rewrites the file and sends RELOAD.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from backplane.runtime.leader_watch import pgbouncer_point_at

PGBOUNCER = Path(os.environ.get("BACKPLANE_PGBOUNCER", "/usr/sbin/pgbouncer"))
READY_SECONDS = 30.0


def pgbouncer_missing_reason() -> str | None:
    """Why no PgBouncer can start here (to fail with), or None."""
    if not PGBOUNCER.exists():
        return f"no pgbouncer at {PGBOUNCER}: run `make pgbouncer` (Debian's pgbouncer)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _server_of(database_url: str) -> tuple[str, str, str, str]:
    """(host or socket directory, port, user, password) of a ``DATABASE_URL``."""
    from backplane.runtime.env import database_from_url

    database = database_from_url(database_url)
    if "," in str(database["HOST"]):
        raise ValueError("PgBouncer 1.18 has no target_session_attrs: point it at one server (see retarget)")
    return (str(database["HOST"] or "/var/run/postgresql"), str(database["PORT"] or "5432"),
            str(database["USER"]), str(database["PASSWORD"] or ""))


class PgBouncer:
    """One pgbouncer process in front of the server ``database_url`` names."""

    def __init__(self, database_url: str, *, pool_size: int = 4, port: int | None = None,
                 max_client_conn: int = 1000, base: Path | None = None) -> None:
        self.host, self.server_port, self.user, password = _server_of(database_url)
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.port = port or free_port()
        self.base = base or Path(tempfile.mkdtemp(prefix="backplane-pgbouncer-"))
        self.base.chmod(0o755)
        self.config_path = self.base / "pgbouncer.ini"
        self.log_path = self.base / "pgbouncer.log"
        self.users_path = self.base / "users.txt"
        self.databases_path = self.base / "databases.ini"
        self.users_path.write_text(f'"{self.user}" "{password}"\n')
        self._run_as = self._unprivileged_user()
        if self._run_as is not None:
            account = pwd.getpwnam(self._run_as)
            for path in (self.base, self.users_path):
                os.chown(path, account.pw_uid, account.pw_gid)
        self.users_path.chmod(0o600)
        self.databases_path.write_text(f"* = host={self.host} port={self.server_port}\n")
        self._write_config()
        self.process: subprocess.Popen[bytes] | None = None

    def _unprivileged_user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        if self.host.startswith("/"):
            return pwd.getpwuid(Path(self.host).stat().st_uid).pw_name
        return "nobody"

    def _write_config(self) -> None:
        lines = [
            "[databases]",
            f"%include {self.databases_path}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.users_path}",
            f"admin_users = {self.user}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "reserve_pool_size = 0",
            f"max_client_conn = {self.max_client_conn}",
            # After a failed login to the server PgBouncer waits this long before the next attempt
            # (15 s by default): a restarted PostgreSQL would sit unused for that long.
            "server_login_retry = 1",
            # A client whose transaction waits for a server connection gives up after this long
            # (120 s by default), so a stopped database is an error in seconds, not minutes.
            "query_wait_timeout = 10",
            f"logfile = {self.log_path}",
            f"pidfile = {self.base / 'pgbouncer.pid'}",
        ]
        if self._run_as is not None:
            lines.append(f"user = {self._run_as}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def url(self, database: str, *, user: str | None = None) -> str:
        """A ``DATABASE_URL`` through this PgBouncer."""
        return f"postgresql://{quote(user or self.user, safe='')}:@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def start(self, timeout: float = READY_SECONDS) -> PgBouncer:
        assert self.process is None or self.process.poll() is not None, "pgbouncer is already running"
        (self.base / "pgbouncer.pid").unlink(missing_ok=True)  # a killed one's, which would stop this one
        self.process = subprocess.Popen([str(PGBOUNCER), str(self.config_path)], cwd=self.base,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"pgbouncer exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            try:
                self.admin("SHOW VERSION")
                return self
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"pgbouncer did not accept connections within {timeout:.0f} s:\n"
                                     f"{self.log()[-3000:]}")
            time.sleep(0.05)

    def admin(self, command: str) -> list[dict[str, Any]]:
        """One command on PgBouncer's admin console (``SHOW POOLS``, ``RELOAD``), its rows as dicts."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2) as conn:
            cursor = conn.execute(command)
            if cursor.description is None:
                return []
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def server_pids(self, database: str) -> set[int]:
        """The PostgreSQL backends PgBouncer holds open for ``database`` (``SHOW SERVERS``)."""
        return {int(row["remote_pid"]) for row in self.admin("SHOW SERVERS") if row["database"] == database}

    def client_count(self, database: str) -> int:
        return sum(1 for row in self.admin("SHOW CLIENTS") if row["database"] == database)

    def retarget(self, database_url: str) -> None:
        """Point every database at the server ``database_url`` names and RELOAD: new transactions
        go there; server connections to the old one are closed once released."""
        self.host, self.server_port, _, _ = _server_of(database_url)
        pgbouncer_point_at(databases_file=self.databases_path, admin_url=self.url("pgbouncer"),
                           host=self.host, port=int(self.server_port))

    def kill(self) -> None:
        """SIGKILL: every client and server connection is dropped by the kernel."""
        assert self.process is not None and self.process.poll() is None, "pgbouncer is not running"
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def close(self) -> None:
        """Stop it and remove its folder."""
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def pgbouncer_in_front_of(database_url: str, **kwargs: Any) -> Iterator[PgBouncer]:
    """A started PgBouncer, closed on leaving; a test fails (never skips) when pgbouncer is missing."""
    reason = pgbouncer_missing_reason()
    if reason:
        pytest.fail(reason)
    bouncer = PgBouncer(database_url, **kwargs)
    try:
        yield bouncer.start()
    finally:
        bouncer.close()


def main(argv: list[str] | None = None) -> int:
    """``make pgbouncer-run``: one PgBouncer in front of ``make run``'s database (or DATABASE_URL) in
    the foreground until Ctrl-C; it prints the settings that put the product behind it."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.pgbouncer")
    parser.add_argument("--port", type=int, default=6432, help="PgBouncer's port on 127.0.0.1")
    parser.add_argument("--pool-size", type=int, default=20, help="server connections per database and user")
    parser.add_argument("--var-dir", default="var", help="make run's var directory (its database_url file)")
    args = parser.parse_args(argv)
    reason = pgbouncer_missing_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    url_file = Path(args.var_dir) / "database_url"
    direct = os.environ.get("DATABASE_URL") or (url_file.read_text().strip() if url_file.exists() else "")
    if not direct:
        print(f"no DATABASE_URL and no {url_file}: start `make run` first", file=sys.stderr)
        return 1
    from backplane.runtime.env import database_from_url

    bouncer = PgBouncer(direct, pool_size=args.pool_size, port=args.port)
    try:
        bouncer.start()
        name = str(database_from_url(direct)["NAME"])
        print(f"PgBouncer {bouncer.port} (transaction pooling, {args.pool_size} server connections) in front of "
              f"{direct}\n\nDATABASE_URL={bouncer.url(name)}\nDATABASE_DIRECT_URL={direct}\n"
              f"BACKPLANE_DB_POOLER=transaction\n\nlog: {bouncer.log_path}; Ctrl-C stops it", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C, cleaning up
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        bouncer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
