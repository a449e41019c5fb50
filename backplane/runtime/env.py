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


def database_from_url(url: str) -> DatabaseSettings:
    """Django DATABASES entry from ``postgresql://user:pass@host:port/name?host=/socket/dir``.

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
    # A unix-socket directory travels in ?host=, as libpq URLs allow.
    host = query.pop("host", None) or unquote(parts.hostname or "")
    options: dict[str, Any] = {}
    if "sslmode" in query:
        options["sslmode"] = query.pop("sslmode")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }
