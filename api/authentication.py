"""Who is calling, and whether they are within the rate limit: an agent with a bearer token, or a
staff user with a session.

Either way a view gets a ``Principal``; its ``namespace`` scopes every query (``None`` for staff,
who operate across namespaces, unless the user is scoped to one: recovery.models.StaffScope).
What a principal may do is declared on each route (api/permissions.py). ``agent_authenticate``
and ``staff_authenticate`` are the one way to authenticate and count a request: the agent routes
(api/routes.py) call them directly, and DRF's authenticator and throttle classes below wrap them
for the routes DRF serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import AbstractUser
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import HTTP_HEADER_ENCODING, authentication, exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from api.throttling import COUNT_SQL, Window, count_request, counter_key, current_window
from backplane.eventlog.models import LAST_SEEN_RESOLUTION_SECONDS, Agent, hash_token, user_actor
from backplane.lib.sql_rows import RowLoader
from recovery.selectors import staff_namespace

# What a 401 says a client should send (DRF's WWW-Authenticate for the same answer).
WWW_AUTHENTICATE = 'Bearer realm="api"'


@dataclass(frozen=True)
class Principal:
    name: str
    namespace: str | None
    agent: Agent | None = None
    staff_user: AbstractUser | None = None

    @property
    def user(self) -> AbstractUser | None:
        """The staff user behind a session, or the user an agent token is bound to (loaded on demand)."""
        if self.staff_user is not None:
            return self.staff_user
        return self.agent.user if self.agent is not None and self.agent.user_id else None

    is_authenticated = True
    is_anonymous = False

    @property
    def pk(self) -> str:  # the rate limit's counter is per principal
        if self.agent is not None:
            return f"agent:{self.agent.pk}"
        return f"user:{self.user.pk if self.user else ''}"

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds an agent's token is limited to (claims and writes); () for no limit."""
        return tuple(self.agent.kinds) if self.agent is not None else ()

    @property
    def is_staff(self) -> bool:
        return self.staff_user is not None


@dataclass(frozen=True)
class AgentCredentials:
    """DRF's ``request.auth`` for an agent: the rate limit's wait its request got when the token
    was looked up (None: within the limit), which DRF's throttle then reports."""

    wait: float | None


# --- agents: the token's agent and the request's count, in one statement ------------------------

_AGENT_ROWS = RowLoader(Agent)
_COUNT_THE_AGENT_SQL = COUNT_SQL.format(source="SELECT %s || agent.id, '1', %s FROM agent")
# Run on Django's connection here, and on the event loop by the HTTP front's agent routes (api/agent_front.py).
AGENT_COUNTED_SQL = (
    f"WITH agent AS (SELECT {_AGENT_ROWS.columns} FROM backplane_agent WHERE token_hash = %s AND is_active), "
    f"counted AS ({_COUNT_THE_AGENT_SQL}) SELECT agent.*, (SELECT value FROM counted) FROM agent"
)
# ``last_seen_at`` moves when it is older than its resolution: one small UPDATE per agent every
# 30 s at most, whatever the request rate (the condition keeps concurrent requests from all
# writing it).
NOTE_SEEN_SQL = (
    "UPDATE backplane_agent SET last_seen_at = %s"
    " WHERE id = %s AND (last_seen_at IS NULL OR last_seen_at < %s)"
)
_BEARER_SCHEME = b"bearer"


def bearer_token(request: HttpRequest) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None without one; AuthenticationFailed
    for a malformed header."""
    raw = request.META.get("HTTP_AUTHORIZATION", b"")
    return bearer_token_of(raw.encode(HTTP_HEADER_ENCODING) if isinstance(raw, str) else raw)


def bearer_token_of(authorization: bytes) -> str | None:
    """``bearer_token`` of the header's raw value (as an ASGI scope carries it)."""
    header = authorization.split()
    if not header or header[0].lower() != _BEARER_SCHEME:
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <token>'")
    try:
        return header[1].decode()
    except UnicodeDecodeError:
        raise exceptions.AuthenticationFailed("invalid token") from None


@dataclass(frozen=True)
class AgentLookup:
    """A token's ``AGENT_COUNTED_SQL``: its parameters, and the rate-limit window they count in."""

    token: str
    window: Window

    @property
    def params(self) -> list[Any]:
        # The lookup is by the token's hash, so the key prefix makes the counter agent:<id>'s.
        return [hash_token(self.token), counter_key("agent:"), self.window.expires]

    def principal(self, row: Sequence[Any] | None) -> tuple[Principal, AgentCredentials]:
        """The agent of the statement's row, and the wait its count earned; AuthenticationFailed
        for no row (a token unknown or inactive: nothing was counted)."""
        if row is None:
            raise exceptions.AuthenticationFailed("invalid or inactive token")
        agent = _AGENT_ROWS.load(row[:-1])
        # Found by the hash; compared again in constant time all the same.
        if not agent.token_matches(self.token):
            raise exceptions.AuthenticationFailed("invalid or inactive token")
        principal = Principal(name=agent.name, namespace=agent.namespace, agent=agent)
        return principal, AgentCredentials(wait=self.window.wait_after(int(row[-1])))


def agent_lookup(token: str) -> AgentLookup:
    return AgentLookup(token=token, window=current_window())


def note_seen_params(agent: Agent) -> list[Any] | None:
    """``NOTE_SEEN_SQL``'s parameters when the agent's ``last_seen_at`` is older than its
    resolution; None when it is recent enough (no statement)."""
    now = timezone.now()
    stale = now - timedelta(seconds=LAST_SEEN_RESOLUTION_SECONDS)
    if agent.last_seen_at is not None and agent.last_seen_at > stale:
        return None
    return [now, agent.pk, stale]


def agent_authenticate(request: HttpRequest) -> tuple[Principal, AgentCredentials] | None:
    """The agent behind a bearer token, its request counted toward the rate limit in the same
    statement; None without a bearer token. AuthenticationFailed for a token that is malformed,
    unknown or inactive (nothing is counted then). A revoked or rotated token fails at once:
    every request reads the agent's row."""
    token = bearer_token(request)
    if token is None:
        return None
    lookup = agent_lookup(token)
    with connection.cursor() as cursor:
        cursor.execute(AGENT_COUNTED_SQL, lookup.params)
        principal, credentials = lookup.principal(cursor.fetchone())
        assert principal.agent is not None
        seen = note_seen_params(principal.agent)
        if seen is not None:
            cursor.execute(NOTE_SEEN_SQL, seen)
    return principal, credentials


# --- staff: Django's session, CSRF enforced on writes ------------------------------------------


def staff_authenticate(request: HttpRequest) -> Principal | None:
    """The staff user logged in on this session, in the namespace they are scoped to (None: every
    namespace); None for anyone else. A write without a valid CSRF token is PermissionDenied, as
    DRF's SessionAuthentication decides it (for any active user, staff or not, before anything
    else). What they may do is their permissions' (api/permissions.py)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_active:
        return None
    reason = _csrf_failure(request)
    if reason is not None:
        raise exceptions.PermissionDenied(f"CSRF Failed: {reason}")
    if not user.is_staff:
        return None
    return Principal(name=user_actor(user), namespace=staff_namespace(user_id=user.pk), staff_user=user)


def _csrf_failure(request: HttpRequest) -> str | None:
    check = authentication.CSRFCheck(lambda _: HttpResponse())  # the response is never asked for
    # Populates request.META["CSRF_COOKIE"], which process_view reads.
    check.process_request(request)
    # DRF's CSRFCheck answers the reason as a string instead of a response.
    reason: object = check.process_view(request, lambda _: HttpResponse(), (), {})
    return reason if isinstance(reason, str) else None


# --- DRF's classes, for the routes DRF serves ---------------------------------------------------


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>`` (``agent_authenticate``)."""

    def authenticate(self, request: Request) -> tuple[Principal, AgentCredentials] | None:
        return agent_authenticate(request._request)

    def authenticate_header(self, request: Request) -> str:
        return WWW_AUTHENTICATE


class StaffSessionAuthentication(authentication.BaseAuthentication):
    """A logged-in staff user's session (``staff_authenticate``)."""

    def authenticate(self, request: Request) -> tuple[Principal, None] | None:
        principal = staff_authenticate(request._request)
        return None if principal is None else (principal, None)


class PrincipalRateThrottle(BaseThrottle):
    """The wait an agent's authentication counted, or a staff user's request counted here."""

    def __init__(self) -> None:
        self.retry_after: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        if isinstance(request.auth, AgentCredentials):
            self.retry_after = request.auth.wait
        else:
            user: object = request.user  # DRF types it as a Django user; ours is always a Principal
            if isinstance(user, Principal):
                self.retry_after = count_request(user.pk)
        return self.retry_after is None

    def wait(self) -> float | None:
        return self.retry_after


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "Agent token from `manage.py create_agent`"}


class StaffSessionScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.StaffSessionAuthentication"
    name = "staffSession"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
