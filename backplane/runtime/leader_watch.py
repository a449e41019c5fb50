"""Keeps a PgBouncer pointed at a Patroni cluster's primary (docs/production.md, "PgBouncer").

PgBouncer 1.18 has no ``target_session_attrs``: it connects to the one host its ``[databases]``
names, so after a failover something outside it must name the new primary and RELOAD it. This
is that something, run beside PgBouncer by the operator (``python -m backplane.runtime.leader_watch``)
and by the failover test (tests/e2e/test_failover.py) as a process of its own: one code path for both.

Every ``interval`` it asks each member's Patroni REST API ``GET /primary``. A member counts as the
primary only if it answers 200 (it holds the leader key) *and* its body says ``"role": "primary"``
(its PostgreSQL has left recovery): Patroni answers 200 from the moment it takes the key, before
the promotion is over, and a PgBouncer pointed at a standby would fail every write. When exactly
one member counts and PgBouncer points elsewhere, the watch writes PgBouncer's ``[databases]``
file (``%include``d by pgbouncer.ini) and sends ``RELOAD`` on its admin console. While no member
or more than one counts (during a failover) it changes nothing: PgBouncer's clients wait
(``query_wait_timeout``) or fail, and the product answers 503.

Why retargeting cannot lose or duplicate an acknowledged append:

1. An append is acknowledged only after its commit returned, and with ``synchronous_mode_strict``
   a commit returns only once the synchronous standby has it; Patroni promotes only that standby.
   So every acknowledged row is on the new primary before the watch can see it as primary.
2. After the RELOAD, PgBouncer closes a server connection to the old host once it is released
   (PgBouncer's docs, RELOAD); a transaction still running on it finishes or fails there. The old
   primary is dead (a killed postmaster, or fenced by the watchdog before the leader key expires),
   or demoted, or its commits wait forever for a synchronous standby that was promoted away: none
   of these commits returns, so none is acknowledged, and pg_rewind discards it when the old
   member rejoins.
3. A client that got no answer sends the same idempotency key again; it lands on the new primary,
   which either has the row (a 200 replay with the first seq and hash) or not (a fresh 201): once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

PRIMARY_TIMEOUT = 1.0


@dataclass(frozen=True)
class PatroniMember:
    """A member as the watch sees it: its REST API, and the PostgreSQL address PgBouncer should use."""

    api_url: str
    host: str
    port: int


def member_is_primary(member: PatroniMember, *, client: httpx.Client) -> bool:
    """The member holds the leader key and its PostgreSQL has been promoted (module docstring)."""
    try:
        answer = client.get(member.api_url.rstrip("/") + "/primary", timeout=PRIMARY_TIMEOUT)
    except httpx.HTTPError:
        return False  # a member whose Patroni is dead or unreachable is never the primary to pick
    if answer.status_code != 200:
        return False
    try:
        return bool(answer.json().get("role") == "primary")
    except ValueError:
        return False


def primary_of(members: list[PatroniMember], *, client: httpx.Client) -> PatroniMember | None:
    """The one member that is primary, or None while there is none or, in a split view, several."""
    primaries = [member for member in members if member_is_primary(member, client=client)]
    return primaries[0] if len(primaries) == 1 else None


def pgbouncer_point_at(*, databases_file: Path, admin_url: str, host: str, port: int) -> None:
    """Write ``* = host=… port=…`` to the ``[databases]`` file pgbouncer.ini ``%include``s, then
    ``RELOAD``: new server connections go to ``host``, old ones close once released."""
    # Written aside and renamed over the file, so a RELOAD (ours or anyone's SIGHUP) never reads
    # half a line.
    handle, staging = tempfile.mkstemp(dir=databases_file.parent, prefix=".databases-")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(f"* = host={host} port={port}\n")
        os.chmod(staging, 0o644)
        os.replace(staging, databases_file)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=2) as conn:
        conn.execute("RELOAD")


@dataclass
class PrimaryWatch:
    """Calls ``point_at(member)`` whenever the cluster's primary is a member other than the one
    last pointed at. ``retargets`` records (time.monotonic(), member) for each call."""

    members: list[PatroniMember]
    point_at: Callable[[PatroniMember], None]
    interval: float = 1.0
    current: PatroniMember | None = None
    retargets: list[tuple[float, PatroniMember]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _client: httpx.Client = field(default_factory=httpx.Client, init=False)

    def step(self) -> bool:
        """One look at the cluster; whether PgBouncer was pointed somewhere new."""
        primary = primary_of(self.members, client=self._client)
        if primary is None or primary == self.current:
            return False
        self.point_at(primary)
        self.current = primary
        self.retargets.append((time.monotonic(), primary))
        return True

    def run(self) -> None:
        """Steps every ``interval`` until ``stop()``; a failed RELOAD is tried again next step."""
        while not self._stop.is_set():
            try:
                self.step()
            except psycopg.Error as exc:
                print(f"leader watch: pointing PgBouncer at the primary failed, retrying: {exc}",
                      file=sys.stderr, flush=True)
            self._stop.wait(self.interval)

    def start(self) -> PrimaryWatch:
        """``run()`` in a daemon thread."""
        self._thread = threading.Thread(target=self.run, name="primary-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._client.close()


def _member_argument(value: str) -> PatroniMember:
    api_url, _, address = value.partition("=")
    host, _, port = address.rpartition(":")
    if not api_url or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not API_URL=HOST:PORT")
    return PatroniMember(api_url=api_url, host=host, port=int(port))


def main(argv: list[str] | None = None) -> int:
    """Runs the watch in the foreground until SIGINT/SIGTERM (docs/production.md, "PgBouncer")."""
    parser = argparse.ArgumentParser(prog="python -m backplane.runtime.leader_watch")
    parser.add_argument("--member", action="append", required=True, type=_member_argument,
                        help="a Patroni member as REST_API_URL=POSTGRES_HOST:PORT, once per member")
    parser.add_argument("--databases-file", required=True, type=Path,
                        help="the file pgbouncer.ini %%includes under [databases]; the watch owns it")
    parser.add_argument("--admin-url", required=True,
                        help="PgBouncer's admin console, e.g. postgresql://pgbouncer_admin:…@127.0.0.1:6432/pgbouncer")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the cluster")
    args = parser.parse_args(argv)

    def point_at(member: PatroniMember) -> None:
        pgbouncer_point_at(databases_file=args.databases_file, admin_url=args.admin_url,
                           host=member.host, port=member.port)
        print(f"{datetime.now(UTC).isoformat(timespec='milliseconds')} leader watch: PgBouncer now points at "
              f"{member.host}:{member.port} ({member.api_url})", flush=True)

    watch = PrimaryWatch(members=args.member, point_at=point_at, interval=args.interval)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        watch.run()
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
