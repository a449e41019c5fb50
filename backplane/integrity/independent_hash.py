"""A second, independent implementation of the event hash rule (docs/api.md), for the verifiers.

The writer hashes through ``backplane.eventlog.canonical`` (Trail of Bits' ``rfc8785`` plus a
fast path over ``json.dumps``) and ``backplane.eventlog.chain``. A chain check that recomputed
hashes with that same code would agree with any bug in it: a writer that left ``prev_hash`` or
the payload out of the hash would produce chains its own checker calls valid. So the checks in
``backplane.integrity`` recompute through this module instead, written from the rule and RFC 8785
alone, and importing neither of those modules. ``tests/backplane/test_promises.py`` holds it to the
published RFC 8785 vectors and to the writer's hashes on random events.

The rule: the Event object as the API shows it, without ``hash`` and ``position``, as RFC 8785
canonical JSON (JCS), SHA-256, lowercase hex. Like the writer, integers beyond 2**53 - 1 are
taken as the double they denote (what a JavaScript verifier's ``JSON.parse`` reads).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

_SAFE_INTEGER = 2**53 - 1

# JSON.stringify's escapes (ECMA-262 QuoteJSONString): the short forms, \u00xx for the other
# control characters, everything else as itself.
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class NotCanonicalizable(ValueError):
    """The value has no RFC 8785 form (NaN, infinities, lone surrogates, non-JSON types)."""


def jcs_number(value: float) -> str:
    """ECMAScript Number::toString of a double (ECMA-262 7.1.12.1), as RFC 8785 §3.2.2.3 asks."""
    if math.isnan(value) or math.isinf(value):
        raise NotCanonicalizable(f"{value!r} is not a JSON number")
    if value == 0:
        return "0"  # -0 too
    sign = "-" if value < 0 else ""
    # repr() is the shortest digit string that round-trips (the "k as small as possible" of the
    # spec); Decimal splits it into those digits and a power of ten.
    digits_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    k = len(digits)
    n = k + int(exponent)  # value = 0.digits × 10**n
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
        text = f"{mantissa}e{'+' if e > 0 else '-'}{abs(e)}"
    return sign + text


def _string(value: str) -> str:
    out = ['"']
    for char in value:
        code = ord(char)
        if 0xD800 <= code <= 0xDFFF:
            raise NotCanonicalizable("a lone surrogate is not valid Unicode")
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif code < 0x20:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _utf16_order(key: str) -> bytes:
    # RFC 8785 §3.2.3: members sorted by the UTF-16 code units of their names; big-endian
    # UTF-16 bytes compare exactly as those code units do.
    return key.encode("utf-16-be", "surrogatepass")


def _serialise(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value) if -_SAFE_INTEGER <= value <= _SAFE_INTEGER else jcs_number(_as_double(value)))
    elif isinstance(value, float):
        out.append(jcs_number(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _serialise(item, out)
        out.append("]")
    elif isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise NotCanonicalizable("object member names must be strings")
        out.append("{")
        for index, key in enumerate(sorted(value, key=_utf16_order)):
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _serialise(value[key], out)
        out.append("}")
    else:
        raise NotCanonicalizable(f"{type(value).__name__} is not a JSON value")


def _as_double(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        raise NotCanonicalizable(f"{value} is outside the range of a double") from None


def jcs(value: Any) -> bytes:
    """RFC 8785 canonical JSON of ``value`` as UTF-8 bytes."""
    out: list[str] = []
    _serialise(value, out)
    return "".join(out).encode("utf-8")


def _api_time(moment: datetime) -> str:
    # docs/api.md: RFC 3339 UTC with microseconds and a Z, exactly as the API prints it.
    if moment.tzinfo is None:
        raise NotCanonicalizable("a naive time has no RFC 3339 form")
    utc = moment.astimezone(UTC)
    return f"{utc:%Y-%m-%dT%H:%M:%S}.{utc.microsecond:06d}Z"


# The event columns the rule covers, in the order ``row_hash`` reads them: the API's Event
# object less ``hash`` and ``position``.
HASHED_EVENT_COLUMNS = (
    "task_id", "seq", "type", "payload", "agent", "idempotency_key", "lamport", "causation_id", "correlation_id",
    "trace_id", "recorded_at", "prev_hash",
)


def api_event_hash(api_event: dict[str, Any]) -> str:
    """The hash of an Event object as the API returns it (``hash`` and ``position`` ignored)."""
    body = {name: value for name, value in api_event.items() if name not in ("hash", "position")}
    return hashlib.sha256(jcs(body)).hexdigest()


def row_hash(row: Sequence[Any]) -> str:
    """The hash of a stored event row (``HASHED_EVENT_COLUMNS``, in order; the payload as the JSON
    text PostgreSQL returns, or already decoded), rebuilt into the API's Event object first."""
    (task_id, seq, type_, payload, agent, key, lamport, causation, correlation, trace, recorded_at,
     prev_hash) = row
    if isinstance(payload, str | bytes):
        payload = json.loads(payload)
    return api_event_hash({
        "task_id": str(task_id),
        "seq": seq,
        "type": type_,
        "payload": payload,
        "agent": agent,
        "idempotency_key": key,
        "lamport": lamport,
        "causation_id": causation,
        "correlation_id": correlation,
        "trace_id": trace,
        "recorded_at": _api_time(recorded_at),
        "prev_hash": prev_hash,
    })
