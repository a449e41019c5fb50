"""RFC 8785 canonical JSON (JCS) and the prompt hash an ``LLMCalled`` event names its prompt by.

The encoding is the ``rfc8785`` package's, as on the server (``backplane.eventlog.canonical``),
with the server's one adjustment: an integer outside the range every double represents exactly
(beyond 2**53 - 1) is written as the double it denotes, which is what PostgreSQL's JSONB and any
JavaScript verifier make of it. So a hash computed here is the one the server checks.
Written again rather than imported: the client installs without the server, and the server does
not depend on its SDK; tests/client/test_canonical.py holds the two to the same vectors and values.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785

__all__ = ["CanonicalizationError", "canonical_json", "prompt_sha256"]

MAX_SAFE_INTEGER = 2**53 - 1


class CanonicalizationError(ValueError):
    """The value has no canonical JSON form (NaN, an infinity, a lone surrogate, a non-string key, ...)."""


def _as_doubles(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | dict | list | tuple):
        return value
    if isinstance(value, int):
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        try:
            return float(value)
        except OverflowError:
            raise CanonicalizationError(f"number {value} is outside the range of a double") from None
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    return [_as_doubles(item) for item in value]


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value`` (dicts, lists or tuples, str, int, float,
    bool, None)."""
    try:
        return rfc8785.dumps(_as_doubles(value))
    except (rfc8785.CanonicalizationError, ValueError, TypeError, RecursionError) as exc:
        raise CanonicalizationError(str(exc)) from exc


def prompt_sha256(prompt: Any) -> str:
    """Lowercase hex SHA-256 of the prompt's canonical JSON: ``LLMCalled``'s ``prompt_sha256``.
    A string prompt hashes as its JSON string (with the quotes)."""
    return hashlib.sha256(canonical_json(prompt)).hexdigest()
