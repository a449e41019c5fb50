"""RFC 8785 (JSON Canonicalization Scheme) and the SHA-256 digests built on it.

The serialisation itself is Trail of Bits' ``rfc8785`` package (ECMAScript number
formatting, keys ordered by UTF-16 code units). One adjustment is ours: JCS models
every number as an IEEE-754 double, while Python and PostgreSQL keep big integers
exact. A float such as ``1e21`` goes into JSONB and comes back as the integer
``1000000000000000000000``; turning integers outside the exactly representable range
into the double they denote makes both spellings canonicalise alike, which is what
any JavaScript verifier (where ``JSON.parse`` yields doubles) computes too.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import rfc8785

# Largest integer every double represents exactly (2**53 - 1): I-JSON's safe range.
_MAX_SAFE_INTEGER = 2**53 - 1


class CanonicalizationError(ValueError):
    """The value cannot be expressed as canonical JSON (NaN, lone surrogates, ...)."""


def _as_doubles(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str | float):
        return value
    if isinstance(value, int):
        if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER:
            return value
        try:
            return float(value)
        except OverflowError:
            raise CanonicalizationError(f"number {value} is outside the range of a double") from None
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_as_doubles(item) for item in value]
    return value


def _is_plain(value: Any) -> bool:
    """True when sorted, compact JSON is already RFC 8785.

    It is, for JSON without floats (ECMAScript number formatting is the one thing only
    ``rfc8785`` gets right) whose object keys all lie in the Basic Multilingual Plane
    (where ordering by code point and by UTF-16 code unit agree). Strings escape alike:
    ``"``, ``\\`` and control characters, with the short forms for \\b \\f \\n \\r \\t and
    lowercase ``\\u00xx`` for the rest; lone surrogates are refused.
    Event payloads are almost always plain, and the encoder is C: this is the hot path's hash.
    """
    # Iterative, and scalars inside containers are checked inline: this walk runs for
    # every event hashed, so it must cost less than the C encoder it unlocks.
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is dict:
            for key, member in item.items():
                if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                    return False
                member_kind = type(member)
                if member_kind is str or member is None or member_kind is bool:
                    continue
                if member_kind is int:
                    if not -_MAX_SAFE_INTEGER <= member <= _MAX_SAFE_INTEGER:
                        return False
                    continue
                pending.append(member)
        elif kind is list or kind is tuple:
            pending.extend(item)
        elif kind is str or item is None or kind is bool:
            continue
        elif kind is int:
            if not -_MAX_SAFE_INTEGER <= item <= _MAX_SAFE_INTEGER:
                return False
        else:
            return False
    return True


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value``."""
    if _is_plain(value):
        # orjson writes plain JSON byte for byte as the standard library's sorted, compact
        # ``json.dumps`` (every code point as a key and as a value: tests/backplane/
        # test_canonical_json.py), in C; its keys sort by UTF-8 bytes, which is code-point order.
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:  # orjson.JSONEncodeError: a lone surrogate, or nesting past 255
            raise CanonicalizationError(f"cannot be canonicalised: {exc}") from None
    try:
        return rfc8785.dumps(_as_doubles(value))
    except CanonicalizationError:
        raise
    except (rfc8785.CanonicalizationError, ValueError, TypeError) as exc:
        raise CanonicalizationError(str(exc)) from exc


def canonical_sha256(value: Any) -> str:
    """Lowercase hex SHA-256 of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
