"""Who is calling: an agent with a bearer token, or a staff user with a session.

Either way the view gets a ``Principal`` as ``request.user``; its ``namespace`` scopes
every query (``None`` for staff, who operate across namespaces).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import HTTP_HEADER_ENCODING, authentication, exceptions
from rest_framework.request import Request

from backplane.api.confirmations import confirmations
from backplane.api.throttling import AgentCounting, count_upsert_sql, wait_after_count
from backplane.delivery.models import REVIEW_PERMISSION
from backplane.eventlog.models import LAST_SEEN_RESOLUTION_SECONDS, Agent, hash_token
from backplane.lib.sql_rows import RowLoader

_AGENT_ROWS = RowLoader(Agent)
_AGENT_BY_TOKEN_SQL = f"SELECT {_AGENT_ROWS.columns} FROM backplane_agent WHERE token_hash = %s AND is_active"


@dataclass(frozen=True)
class Principal:
    name: str
    namespace: str | None
    agent: Agent | None = None
    staff_user: AbstractBaseUser | None = None

    @property
    def user(self) -> AbstractBaseUser | None:
        """The staff user behind a session, or the user an agent token is bound to (loaded on demand)."""
        if self.staff_user is not None:
            return self.staff_user
        return self.agent.user if self.agent is not None and self.agent.user_id else None

    is_authenticated = True
    is_anonymous = False

    @property
    def pk(self) -> str:  # DRF's throttles key on request.user.pk
        return f"agent:{self.agent.pk}" if self.agent else f"user:{self.user.pk if self.user else ''}"

    @property
    def is_staff(self) -> bool:
        return self.staff_user is not None

    def can_review(self) -> bool:
        return self.user is not None and bool(getattr(self.user, "is_staff", False)) and self.user.has_perm(
            REVIEW_PERMISSION
        )


def _note_seen(agent: Agent) -> None:
    """Move ``last_seen_at`` when it is older than its resolution: one small UPDATE per agent
    every 30 s at most, whatever the request rate (the condition keeps concurrent requests from
    all writing it)."""
    now = timezone.now()
    stale = now - timedelta(seconds=LAST_SEEN_RESOLUTION_SECONDS)
    if agent.last_seen_at is not None and agent.last_seen_at > stale:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE backplane_agent SET last_seen_at = %s"
            " WHERE id = %s AND (last_seen_at IS NULL OR last_seen_at < %s)",
            [now, agent.pk, stale],
        )


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``; the token's SHA-256 is looked up, never the token."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Principal, str] | None:
        token = bearer_token(request)
        if token is None:
            return None
        # Every request pays for this lookup; as SQL it costs a tenth of the queryset's Python.
        agent = _AGENT_ROWS.fetch_one(_AGENT_BY_TOKEN_SQL, [hash_token(token)])
        # The lookup is by hash; the comparison below is constant-time all the same.
        if agent is None or not agent.token_matches(token):
            raise exceptions.AuthenticationFailed("invalid or inactive token")
        _note_seen(agent)
        return Principal(name=agent.name, namespace=agent.namespace, agent=agent), token

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'


_BEARER_SCHEME = b"bearer"


def bearer_token(request: Request | HttpRequest) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one; AuthenticationFailed
    for a malformed header."""
    # META, as DRF's get_authorization_header reads request.headers, a mapping of every header
    # that Django builds on first use (30-40 µs) and nothing else on a lean request reads.
    raw = request.META.get("HTTP_AUTHORIZATION", b"")
    header = (raw.encode(HTTP_HEADER_ENCODING) if isinstance(raw, str) else raw).split()
    if not header or header[0].lower() != _BEARER_SCHEME:
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
    try:
        return header[1].decode()
    except UnicodeDecodeError:
        raise exceptions.AuthenticationFailed("invalid token") from None


def agent_authenticate_counting(
    request: HttpRequest, counting: AgentCounting
) -> tuple[Principal, float | None] | None:
    """``AgentTokenAuthentication`` and the rate limit's count, for the lean routes: the agent
    and the rate limit's wait (None: within it), or None when the token does not authenticate
    (nothing is counted then, as DRF counts only authenticated requests). Raises
    AuthenticationFailed for a malformed header.

    One statement finds the agent and counts the request, unless a confirmation of the same
    token in this process is younger than ``BACKPLANE_AUTH_CONFIRM_SECONDS``; then the request
    is counted here and served from it (confirmations.py says what holds meanwhile)."""
    token = bearer_token(request)
    if token is None:
        return None
    token_hash = hash_token(token)
    if settings.BACKPLANE_AUTH_CONFIRM_SECONDS > 0:
        return _authenticate_confirming(token, token_hash, counting, settings.BACKPLANE_AUTH_CONFIRM_SECONDS)
    found = _agent_counted(token_hash, counting, 1)
    return None if found is None else _authenticated(token, found[0], counting, found[1])


def _authenticate_confirming(
    token: str, token_hash: str, counting: AgentCounting, interval: float
) -> tuple[Principal, float | None] | None:
    window_end = counting.window_end
    fresh = confirmations.count_if_fresh(token_hash, window_end=window_end, interval=interval, now=time.monotonic())
    if fresh is None:
        with confirmations.confirming(token_hash, window_end=window_end):
            # Another thread may have confirmed while this one waited for it.
            fresh = confirmations.count_if_fresh(token_hash, window_end=window_end, interval=interval,
                                                 now=time.monotonic())
            if fresh is None:
                return _confirm(token, token_hash, counting, own=1)
    row, count = fresh
    if count <= counting.limit:
        # Found by the exact hash of this token, which a confirmation compared in constant time.
        agent = _AGENT_ROWS.load(row)
        return Principal(name=agent.name, namespace=agent.namespace, agent=agent), None
    # Past the limit by this process's count (this request included): the shared count decides.
    with confirmations.confirming(token_hash, window_end=window_end):
        return _confirm(token, token_hash, counting, own=0)


def _confirm(
    token: str, token_hash: str, counting: AgentCounting, *, own: int
) -> tuple[Principal, float | None] | None:
    """The agent's statement, adding ``own`` and what this process counted since the last
    confirmation; the caller holds the token's ``confirming`` lock."""
    now = time.monotonic()
    handed = confirmations.hand_over(token_hash, window_end=counting.window_end, own=own)
    try:
        found = _agent_counted(token_hash, counting, handed)
    except BaseException:
        confirmations.settle(token_hash, window_end=counting.window_end, handed=handed)
        raise
    if found is None:
        confirmations.forget(token_hash)
        return None
    authenticated = _authenticated(token, found[0], counting, found[1])
    if authenticated is None:
        confirmations.forget(token_hash)
        return None
    confirmations.confirm(token_hash, row=found[0], window_end=counting.window_end, shared_count=found[1],
                          handed=handed, now=now)
    return authenticated


def _agent_counted(token_hash: str, counting: AgentCounting, count: int) -> tuple[tuple[Any, ...], int] | None:
    """The active agent with this token hash and its counter after adding ``count``, in one
    statement; None (nothing counted) when no active agent has it."""
    with connection.cursor() as cursor:
        expires = datetime.fromtimestamp(counting.window_end, tz=UTC)
        cursor.execute(_agent_counted_sql(counting), [token_hash, counting.key_prefix, count, expires])
        found = cursor.fetchone()
    return None if found is None else (tuple(found[:-1]), int(found[-1]))


def _authenticated(
    token: str, row: tuple[Any, ...], counting: AgentCounting, count: int
) -> tuple[Principal, float | None] | None:
    agent = _AGENT_ROWS.load(row)
    if not agent.token_matches(token):
        return None
    _note_seen(agent)
    return Principal(name=agent.name, namespace=agent.namespace, agent=agent), wait_after_count(counting, count)


_agent_counted_sql_cache: dict[str, str] = {}


def _agent_counted_sql(counting: AgentCounting) -> str:
    table = counting.db_cache._table
    sql = _agent_counted_sql_cache.get(table)
    if sql is None:
        upsert = count_upsert_sql(counting.db_cache, "SELECT %s || agent.id, %s::text, %s FROM agent")
        sql = _agent_counted_sql_cache[table] = (
            f"WITH agent AS ({_AGENT_BY_TOKEN_SQL}), counted AS ({upsert}) "
            "SELECT agent.*, (SELECT value FROM counted) FROM agent"
        )
    return sql


class StaffSessionAuthentication(authentication.SessionAuthentication):
    """Logged-in staff may use the API with their session (CSRF enforced on writes)."""

    def authenticate(self, request: Request) -> tuple[Principal, None] | None:
        result = super().authenticate(request)
        if result is None:
            return None
        user = result[0]
        if not user.is_staff:
            return None
        return Principal(name=f"user:{user.get_username()}", namespace=None, staff_user=user), None


class AgentTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "backplane.api.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "Agent token from `manage.py create_agent`"}


class StaffSessionScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "backplane.api.authentication.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
