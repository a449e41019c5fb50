"""Reads that may go to a streaming replica (``DATABASE_REPLICA_URL``), and whether it may be used.

Without ``DATABASE_REPLICA_URL`` there is no ``replica`` database alias and no router: everything
reads and writes the primary. With it:

- Reads go to the replica only inside ``replica_reads`` (a view decorator). Nothing else routes
  there: no global router sends a query to the replica on its own. The decorator is put on the
  dashboard's list and overview pages and on the API's heavy list routes (their modules say
  which). An agent's routes (``api/routes.py``, ``api/agent_front.py``: its task, its events, its appends, its
  claims) never use it, so an agent always reads its own writes. Nor do the API's integrity
  routes: a proof asked for against a tree head just read elsewhere must find that head.
- ``ReplicaRouter`` sends the ORM reads of the product's own apps to the alias the decorator
  chose, and every write to the primary, whatever database an object was read from. Sessions,
  users and the cache table are never routed: a login must not wait for replay.
- Raw SQL of a routed reader asks ``reads_connection()`` for its connection.

Whether the replica may be used is decided by ``replica_state``: reachable within
``PROBE_TIMEOUT`` seconds, a standby, and its replay lag at most
``BACKPLANE_REPLICA_MAX_LAG_SECONDS``. A replica that fails this serves nothing until it passes
again: the reads go to the primary, ``/readyz`` names the fallback and ``/metrics`` exports
``backplane_replica_usable`` and ``backplane_replica_lag_seconds``. A warning is logged once per
change of verdict.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

from backplane.runtime.database_gate import is_connection_failure

logger = logging.getLogger(__name__)

REPLICA = "replica"
# The apps whose reads a replica may serve; Django's own (auth, sessions, the cache table) stay on
# the primary.
ROUTED_APPS = frozenset({"backplane", "recovery", "dashboard"})
# A verdict is reused for this long by every request of the process, so the replica and the
# primary are asked at most about once a second per process, not once per page.
STATE_CACHE_SECONDS = 1.0
PROBE_TIMEOUT = 0.5
# Primary WAL positions remembered by the checks (about two minutes at one check a second).
_LSN_SAMPLES = 128

_reads_alias: ContextVar[str | None] = ContextVar("backplane_reads_alias", default=None)


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


@dataclass(frozen=True)
class ReplicaState:
    """A verdict on the replica. ``lag_seconds`` is an upper bound on how old the oldest commit
    the replica has not replayed is (0 when it has replayed all the primary has written); None
    when it could not be measured."""

    configured: bool
    usable: bool
    lag_seconds: float | None
    problem: str
    checked_at: float

    @property
    def summary(self) -> str:
        """What ``/readyz`` says: ``in use (lag 0.2 s)`` or ``fallback: lag 42 s``."""
        if not self.configured:
            return "not configured"
        if self.usable:
            return f"in use (lag {self.lag_seconds or 0:.1f} s)"
        return f"fallback: {self.problem}"


_NOT_CONFIGURED = ReplicaState(configured=False, usable=False, lag_seconds=None, problem="not configured",
                               checked_at=0.0)


def lsn_value(text: str) -> int:
    """A ``pg_lsn`` (``16/B374D848``) as a number that orders like it."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass(frozen=True)
class _Replay:
    in_recovery: bool
    replay_lsn: int | None
    seconds_since_replayed_commit: float | None


_REPLAY_SQL = """
SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,
       extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8
"""


def _replay_position(params: dict[str, Any]) -> _Replay:
    with psycopg.connect(**params, autocommit=True) as conn:
        row = conn.execute(_REPLAY_SQL).fetchone()
    assert row is not None
    in_recovery, replay_lsn, since_commit = row
    return _Replay(in_recovery=bool(in_recovery), replay_lsn=lsn_value(replay_lsn) if replay_lsn else None,
                   seconds_since_replayed_commit=since_commit)


class ReplicaMonitor:
    """The process's verdict on the replica, and what its checks remember."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: ReplicaState | None = None
        # (monotonic time, primary WAL position read then), oldest first.
        self._primary_lsns: deque[tuple[float, int]] = deque(maxlen=_LSN_SAMPLES)
        self._prober = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replica-probe")
        self._pending: Future[_Replay] | None = None

    def reset(self) -> None:
        """Forget the verdict and the samples (a test that changes the replica under the process)."""
        with self._lock:
            self._state = None
            self._primary_lsns.clear()

    def state(self, *, max_age: float | None = None) -> ReplicaState:
        """The verdict. Two paths: a verdict younger than ``max_age`` (``STATE_CACHE_SECONDS``
        unless given) is returned as it is (most calls); an older one, or none, is replaced by a
        new check, made by one caller at a time while the others wait for it."""
        if not replica_configured():
            return _NOT_CONFIGURED
        with self._lock:
            state = self._state
            if state is not None and time.monotonic() - state.checked_at < (
                    STATE_CACHE_SECONDS if max_age is None else max_age):
                return state
            fresh = self._check()
            if state is None or fresh.usable != state.usable:
                # Once per change between used and passed over, not once per check.
                log = logger.info if fresh.usable else logger.warning
                log("read replica %s", fresh.summary)
            self._state = fresh
            return fresh

    def mark_unusable(self, problem: str) -> None:
        """A read on the replica lost its connection: no request uses it until a check passes again."""
        with self._lock:
            if self._state is None or self._state.usable:
                logger.warning("read replica fallback: %s", problem)
            self._state = ReplicaState(configured=True, usable=False, lag_seconds=None, problem=problem,
                                       checked_at=time.monotonic())

    def _check(self) -> ReplicaState:
        """1. Read the primary's WAL position (on this thread's primary connection).
        2. Read the replica's replay position, on a connection of its own in the probe thread,
           within ``PROBE_TIMEOUT``: libpq cannot time out a connect in under 2 s.
        3. Replayed at least what the primary had written in step 1: lag 0. An idle primary
           writes nothing, so an idle pair is never taken for a lagging one.
        4. Behind: two upper bounds on the age of the oldest commit not replayed, the smaller
           wins. The time since the last replayed commit (too high after a quiet spell: the
           commit replayed last may be old), and the time since an earlier check saw the primary
           at a position the replica has now passed."""
        checked_at = time.monotonic()
        try:
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                cursor.execute("SELECT pg_current_wal_lsn()::text")
                primary_lsn = lsn_value(cursor.fetchone()[0])
        except DatabaseError as exc:
            return self._unusable(f"primary position unknown: {exc.__class__.__name__}", checked_at)
        self._primary_lsns.append((checked_at, primary_lsn))
        params = connections[REPLICA].get_connection_params()
        params["connect_timeout"] = max(2, int(params.get("connect_timeout") or 2))
        # A probe still hanging from before is not started twice; its caller gave up on it.
        if self._pending is None or self._pending.done():
            self._pending = self._prober.submit(_replay_position, params)
        try:
            replay = self._pending.result(timeout=PROBE_TIMEOUT)
        except FutureTimeout:
            return self._unusable(f"unreachable: no answer within {PROBE_TIMEOUT} s", checked_at)
        except psycopg.Error as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return self._unusable(f"unreachable: {exc.__class__.__name__} {first_line}".strip(), checked_at)
        if not replay.in_recovery:
            return self._unusable("not a standby (promoted, or not a replica)", checked_at)
        if replay.replay_lsn is None:
            return self._unusable("replay position unknown", checked_at)
        if replay.replay_lsn >= primary_lsn:
            return ReplicaState(configured=True, usable=True, lag_seconds=0.0, problem="", checked_at=checked_at)
        bounds = [replay.seconds_since_replayed_commit] if replay.seconds_since_replayed_commit is not None else []
        passed = [at for at, lsn in self._primary_lsns if lsn <= replay.replay_lsn]
        if passed:
            bounds.append(time.monotonic() - max(passed))
        if not bounds:
            return self._unusable("lag unknown", checked_at)
        lag = max(0.0, min(bounds))
        if lag > settings.BACKPLANE_REPLICA_MAX_LAG_SECONDS:
            return ReplicaState(configured=True, usable=False, lag_seconds=lag, problem=f"lag {lag:.0f} s",
                                checked_at=checked_at)
        return ReplicaState(configured=True, usable=True, lag_seconds=lag, problem="", checked_at=checked_at)

    @staticmethod
    def _unusable(problem: str, checked_at: float) -> ReplicaState:
        return ReplicaState(configured=True, usable=False, lag_seconds=None, problem=problem, checked_at=checked_at)


monitor = ReplicaMonitor()


def replica_state(*, max_age: float | None = None) -> ReplicaState:
    return monitor.state(max_age=max_age)


def reads_connection() -> BaseDatabaseWrapper:
    """The connection for a routed reader's raw SQL: the replica inside ``replica_reads`` when it
    was usable at the request's start, the primary otherwise."""
    return connections[_reads_alias.get() or DEFAULT_DB_ALIAS]


@contextmanager
def _reading_from(alias: str) -> Iterator[None]:
    token = _reads_alias.set(alias)
    try:
        yield
    finally:
        _reads_alias.reset(token)


P = ParamSpec("P")
R = TypeVar("R")


def replica_reads(view: Callable[P, R]) -> Callable[P, R]:
    """Run a read-only view's queries on the replica when it is usable, on the primary otherwise.

    The choice is made once, when the view starts, so one page reads one database. A replica
    that drops its connection during the view is marked unusable and the view runs again on the
    primary: it only reads, so running it twice changes nothing. Put it on views that write
    nothing and that nobody reads right after their own write (not an agent's route), and below
    the decorators that check who is asking (their reads of the user stay on the primary).
    """

    @functools.wraps(view)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        if not replica_state().usable:
            return view(*args, **kwargs)
        try:
            with _reading_from(REPLICA):
                return view(*args, **kwargs)
        except DatabaseError as exc:
            # Only the replica's own lost connection: the primary's goes to the database gate.
            replica = connections[REPLICA]
            if not (is_connection_failure(exc) and replica.errors_occurred):
                raise
            replica.close_if_unusable_or_obsolete()
            monitor.mark_unusable(f"connection lost: {exc.__class__.__name__}")
        return view(*args, **kwargs)

    return wrapped


class ReplicaRouter:
    """``DATABASE_ROUTERS`` entry, installed only with ``DATABASE_REPLICA_URL``: the product's
    reads go where ``replica_reads`` chose (the primary outside it), writes always to the primary."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        if model._meta.app_label in ROUTED_APPS:
            return _reads_alias.get() or DEFAULT_DB_ALIAS
        return None

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        # Explicit: without a router's answer Django writes an object back to the database it
        # was read from, which for a page's object could be the replica.
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        return True

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == REPLICA else None
