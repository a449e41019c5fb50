"""The backplane's Python package: the agent SDK, and helpers for consumers of its messages.

Django-free: :mod:`backplane_client.signing` needs only the standard library and
:mod:`backplane_client.consumer` needs psycopg 3 (imported only when its functions run).

- :func:`verify` checks a webhook's ``Backplane-Signature`` header (HMAC-SHA256, Stripe style).
- :func:`process_once` drops redelivered messages: delivery is at least once, every message
  carries a stable ``message_id``, and the id is recorded in the consumer's own transaction.
- The agent SDK (needs httpx; docs/sdk.md): :class:`AgentClient` and :class:`AsyncAgentClient`,
  the REST clients with retries (:class:`RetryPolicy`); :class:`TaskSession`, a claimed task with
  a background heartbeat, fenced writes and resumable steps (:class:`ToolCall`); the errors
  :class:`BackplaneAPIError`, :class:`LeaseLost`, :class:`ToolCallFailed`. They are imported on
  first use, so the helpers above keep working without httpx.
"""

from __future__ import annotations

import importlib
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
    from backplane_client.agent import AgentClient
    from backplane_client.aio import AsyncAgentClient
    from backplane_client.calls import Lease, event_draft
    from backplane_client.errors import BackplaneAPIError, LeaseLost, ToolCallFailed
    from backplane_client.retry import RetryPolicy
    from backplane_client.session import TaskSession, ToolCall

__all__ = [
    "DEFAULT_TABLE",
    "SIGNATURE_HEADER",
    "AgentClient",
    "AsyncAgentClient",
    "BackplaneAPIError",
    "Envelope",
    "Handler",
    "Lease",
    "LeaseLost",
    "RetryPolicy",
    "SignatureError",
    "TaskSession",
    "ToolCall",
    "ToolCallFailed",
    "ensure_processed_table",
    "event_draft",
    "handle_kombu_message",
    "parse_envelope",
    "process_once",
    "sign",
    "verify",
]

# name -> the module defining it; all of them import httpx.
_AGENT_EXPORTS = {
    "AgentClient": "backplane_client.agent",
    "AsyncAgentClient": "backplane_client.aio",
    "BackplaneAPIError": "backplane_client.errors",
    "Lease": "backplane_client.calls",
    "LeaseLost": "backplane_client.errors",
    "RetryPolicy": "backplane_client.retry",
    "TaskSession": "backplane_client.session",
    "ToolCall": "backplane_client.session",
    "ToolCallFailed": "backplane_client.errors",
    "event_draft": "backplane_client.calls",
}


def __getattr__(name: str) -> Any:
    """The agent SDK's names, imported on first use (PEP 562) so httpx stays optional."""
    module = _AGENT_EXPORTS.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
