"""Typed readers for the environment that fail loudly.

A misspelt number or boolean in production must stop the process at start-up,
not become a silent default that surfaces as odd behaviour hours later.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any, NotRequired, TypedDict
from urllib.parse import parse_qs, unquote, urlsplit


class ImproperlyConfiguredEnv(RuntimeError):
    """An environment variable is missing or cannot be parsed."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfiguredEnv(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        value = default
    else:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfiguredEnv(f"{name}={value} is above the maximum {maximum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        value = default
    else:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} is below the minimum {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def env_networks(name: str, default: list[str]) -> list[IPNetwork]:
    """Comma-separated CIDRs (``10.0.0.0/8,fd00::/8``; a bare address is a /32 or /128). One
    with host bits set (``10.0.0.1/8``) is refused like a typo, not silently widened."""
    networks: list[IPNetwork] = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=True))
        except ValueError as exc:
            raise ImproperlyConfiguredEnv(f"{name}: {item!r} is not a network ({exc})") from None
    return networks


class DatabaseSettings(TypedDict):
    """One entry of Django's ``DATABASES``: what ``database_from_url`` reads, and the keys the
    settings module adds."""

    ENGINE: str
    NAME: str
    USER: str
    PASSWORD: str
    HOST: str
    PORT: str
    OPTIONS: dict[str, Any]
    CONN_MAX_AGE: NotRequired[int]
    CONN_HEALTH_CHECKS: NotRequired[bool]
    TIME_ZONE: NotRequired[str | None]
    TEST: NotRequired[dict[str, str]]
    DISABLE_SERVER_SIDE_CURSORS: NotRequired[bool]


# libpq parameters a URL's query may carry into the connection, besides ``host``.
_PASSED_QUERY_PARAMETERS = ("sslmode", "target_session_attrs", "load_balance_hosts")


def database_from_url(url: str) -> DatabaseSettings:
    """Django DATABASES entry from ``postgresql://user:pass@host:port/name?host=/socket/dir``.

    Several hosts, as libpq's URLs allow (``postgresql://u:p@h1:5432,h2:5433/name
    ?target_session_attrs=read-write``), become HOST ``"h1,h2"`` and PORT ``"5432,5433"``, which
    psycopg hands to libpq as they are: it tries the hosts in order and keeps the first that
    answers as ``target_session_attrs`` asks, so a failover needs no change of settings.

    Only PostgreSQL is accepted: the design depends on row locks, SKIP LOCKED,
    triggers, JSONB and LISTEN/NOTIFY.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ImproperlyConfiguredEnv(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ImproperlyConfiguredEnv("DATABASE_URL has no database name")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    # urlsplit's hostname and port understand one host only; the host list is read here.
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts, ports = zip(*(_host_and_port(entry) for entry in hostlist.split(",")), strict=True)
    # A unix-socket directory travels in ?host=, as libpq URLs allow.
    host = query.pop("host", None) or ",".join(hosts)
    options: dict[str, Any] = {key: query.pop(key) for key in _PASSED_QUERY_PARAMETERS if key in query}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(user),
        "PASSWORD": unquote(password),
        "HOST": host,
        # libpq reads one port for every host, or one per host (an empty one: the default port).
        "PORT": ",".join(ports) if any(ports) else "",
        "OPTIONS": options,
    }


def _host_and_port(entry: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``[::1]:port`` or ``:port`` (no host: the default socket)."""
    if entry.startswith("["):
        address, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
        host = address
    else:
        host, _, port = entry.partition(":")
    if port and not port.isdigit():
        raise ImproperlyConfiguredEnv(f"DATABASE_URL: {entry!r} has a port that is not a number")
    return unquote(host), port
