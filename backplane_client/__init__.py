"""Helpers for consumers of the backplane's messages.

Django-free: :mod:`backplane_client.signing` needs only the standard library and
:mod:`backplane_client.consumer` needs psycopg 3 (imported only when its functions run).

- :func:`verify` checks a webhook's ``Backplane-Signature`` header (HMAC-SHA256, Stripe style).
- :func:`process_once` drops redelivered messages: delivery is at least once, every message
  carries a stable ``message_id``, and the id is recorded in the consumer's own transaction.
- :class:`AgentClient` (:mod:`backplane_client.agent`, needs httpx) is the agents' REST client;
  it is imported on first use, so the helpers above keep working without httpx.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from backplane_client.agent import AgentClient, BackplaneAPIError, Lease, event_draft

__all__ = [
    "DEFAULT_TABLE",
    "SIGNATURE_HEADER",
    "AgentClient",
    "BackplaneAPIError",
    "Envelope",
    "Handler",
    "Lease",
    "SignatureError",
    "ensure_processed_table",
    "event_draft",
    "handle_kombu_message",
    "parse_envelope",
    "process_once",
    "sign",
    "verify",
]

_AGENT_EXPORTS = frozenset({"AgentClient", "BackplaneAPIError", "Lease", "event_draft"})


def __getattr__(name: str) -> Any:
    """The agent client's names, imported on first use (PEP 562) so httpx stays optional."""
    if name in _AGENT_EXPORTS:
        from backplane_client import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
