"""Helpers for consumers of the backplane's messages.

Django-free: :mod:`backplane_client.signing` needs only the standard library and
:mod:`backplane_client.consumer` needs psycopg 3 (imported only when its functions run).

- :func:`verify` checks a webhook's ``Backplane-Signature`` header (HMAC-SHA256, Stripe style).
- :func:`process_once` drops redelivered messages: delivery is at least once, every message
  carries a stable ``message_id``, and the id is recorded in the consumer's own transaction.
"""

from __future__ import annotations

from backplane_client.consumer import (
    DEFAULT_TABLE,
    Envelope,
    Handler,
    ensure_processed_table,
    handle_kombu_message,
    parse_envelope,
    process_once,
)
from backplane_client.signing import SIGNATURE_HEADER, SignatureError, sign, verify

__all__ = [
    "DEFAULT_TABLE",
    "SIGNATURE_HEADER",
    "Envelope",
    "Handler",
    "SignatureError",
    "ensure_processed_table",
    "handle_kombu_message",
    "parse_envelope",
    "process_once",
    "sign",
    "verify",
]
