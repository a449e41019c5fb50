"""Webhook signatures in the style of Stripe's.

The backplane POSTs each message as a JSON body with the header::

    Backplane-Signature: t=<unix seconds>,v1=<hex>

where ``<hex>`` is the lowercase hex HMAC-SHA256 of ``f"{t}.".encode() + body`` keyed with
the subscription's secret (UTF-8). Why this shape:

- The timestamp is inside the signed bytes, so an attacker cannot take a captured request
  and re-send it later with a fresh ``t``; the receiver rejects timestamps outside a
  tolerance window (replay protection).
- The signature covers the raw body bytes, so verify *before* parsing the JSON, with the
  bytes exactly as received (re-serialising parsed JSON changes them).
- Several ``v1=`` entries may appear while a secret is being rotated; the request is
  genuine if any of them matches. Unknown schemes (``v0=``, ``v2=`` ...) are ignored so
  the format can grow.

Only the standard library is used, so receivers need nothing beyond this file.
"""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["SIGNATURE_HEADER", "SCHEME", "SignatureError", "compute_signature", "sign", "verify"]

SIGNATURE_HEADER = "Backplane-Signature"
SCHEME = "v1"
DEFAULT_TOLERANCE_SECONDS = 300


class SignatureError(ValueError):
    """The ``Backplane-Signature`` header is malformed, stale, or does not match the body."""


def _check_inputs(secret: str, body: bytes) -> None:
    if not isinstance(secret, str) or not secret:
        raise ValueError("the webhook secret must be a non-empty string")
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"the body must be the raw request bytes, not {type(body).__name__}")


def compute_signature(secret: str, timestamp: int, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256 over ``f"{timestamp}."`` followed by the body bytes."""
    _check_inputs(secret, body)
    mac = hmac.new(secret.encode("utf-8"), f"{timestamp}.".encode("ascii"), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """Return the ``Backplane-Signature`` header value for ``body`` (now, unless ``timestamp``)."""
    if timestamp is None:
        timestamp = int(time.time())
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise ValueError(f"timestamp must be a non-negative integer of unix seconds, got {timestamp!r}")
    return f"t={timestamp},{SCHEME}={compute_signature(secret, timestamp, body)}"


def _parse(header: str) -> tuple[int, list[str]]:
    """Split ``t=...,v1=...[,v1=...]`` into the timestamp and the v1 signatures."""
    if not isinstance(header, str) or not header.strip():
        raise SignatureError(f"missing {SIGNATURE_HEADER} header")
    timestamps: list[str] = []
    signatures: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise SignatureError(f"malformed {SIGNATURE_HEADER} header: expected key=value items, got {item!r}")
        if key == "t":
            timestamps.append(value)
        elif key == SCHEME:
            signatures.append(value)
        # Other schemes are ignored on purpose (forward compatibility).
    if len(timestamps) != 1:
        raise SignatureError(
            f"malformed {SIGNATURE_HEADER} header: expected exactly one t=<unix seconds>, got {len(timestamps)}"
        )
    # isdecimal() alone would accept non-ASCII digits, which int() would also accept.
    if not (timestamps[0].isascii() and timestamps[0].isdigit()):
        raise SignatureError(f"malformed {SIGNATURE_HEADER} header: t={timestamps[0]!r} is not unix seconds")
    if not signatures:
        raise SignatureError(f"{SIGNATURE_HEADER} header has no {SCHEME}= signature")
    return int(timestamps[0]), signatures


def verify(
    secret: str,
    header: str,
    body: bytes,
    *,
    tolerance_seconds: int = DEFAULT_TOLERANCE_SECONDS,
    now: int | None = None,
) -> int:
    """Check a ``Backplane-Signature`` header against the raw body; return its timestamp.

    Raises :class:`SignatureError` when the header is malformed, carries no ``v1``
    signature, none of its ``v1`` signatures matches, or its timestamp is more than
    ``tolerance_seconds`` away from ``now`` (in either direction: a timestamp from the
    future is as suspicious as an old one). The signature is checked before the timestamp,
    so "outside tolerance" is only ever reported for a genuinely signed (replayed) request.
    Comparisons are constant-time.
    """
    _check_inputs(secret, body)
    if tolerance_seconds < 0:
        raise ValueError("tolerance_seconds must not be negative")
    timestamp, candidates = _parse(header)
    expected = compute_signature(secret, timestamp, body).encode("ascii")
    matched = False
    for candidate in candidates:
        # Compare bytes: compare_digest refuses non-ASCII str, and a header is attacker input.
        # Every candidate is compared (no early exit) so timing does not reveal which matched.
        matched |= hmac.compare_digest(expected, candidate.encode("utf-8", "backslashreplace"))
    if not matched:
        raise SignatureError(f"{SIGNATURE_HEADER} does not match the body (wrong secret or tampered body)")
    current = int(time.time()) if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise SignatureError(
            f"{SIGNATURE_HEADER} timestamp {timestamp} is {current - timestamp}s away from now ({current}), "
            f"outside the tolerance of {tolerance_seconds}s (possible replay)"
        )
    return timestamp
