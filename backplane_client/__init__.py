"""The backplane's Python package: the agent SDK, and helpers for consumers of its messages.

Django-free: :mod:`backplane_client.signing` needs only the standard library and
:mod:`backplane_client.consumer` needs psycopg 3 (imported only when its functions run).

- :func:`verify` checks a webhook's ``Backplane-Signature`` header (HMAC-SHA256, Stripe style).
- :func:`process_once` drops redelivered messages: delivery is at least once, every message
  carries a stable ``message_id``, and the id is recorded in the consumer's own transaction.
- :func:`prompt_sha256` (RFC 8785, needs rfc8785): the hash an ``LLMCalled`` event names its
  prompt by, SHA-256 of the prompt's RFC 8785 canonical JSON (:func:`canonical_json`).
- The agent SDK (needs httpx; docs/sdk.md): :class:`AgentClient` and :class:`AsyncAgentClient`,
  the REST clients with retries (:class:`RetryPolicy`); :class:`TaskSession`, a claimed task with
  a background heartbeat, fenced writes and resumable steps and model calls (:class:`ToolCall`);
  :func:`replay`, an agent run against a task's record in a sandbox (:class:`ReplayResult`,
  docs/replay.md); the errors :class:`BackplaneAPIError`, :class:`LeaseLost`,
  :class:`SandboxRefused`, :class:`ToolCallFailed`, :class:`ModelCallNotRecorded`. They are
  imported on first use, so the helpers above keep working without httpx.
- What a model call used and cost, as ``LLMCalled`` records it (:mod:`backplane_client.usage`,
  standard library only, also imported on first use): :func:`usage_from_openai` and
  :func:`usage_from_anthropic` read a provider's answer into our ``usage`` keys without counting
  cached or reasoning tokens twice, :func:`model_cost` writes a provider-reported price, and
  :class:`Usage`, :class:`Cost` and :class:`ModelAnswer` type them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from backplane_client.canonical import CanonicalizationError, canonical_json, prompt_sha256
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
    from backplane_client.calls import Lease, event_draft, personal
    from backplane_client.errors import (
        ApprovalDenied,
        ApprovalExpired,
        AwaitingApproval,
        BackplaneAPIError,
        LeaseLost,
        SandboxRefused,
        ToolCallFailed,
    )
    from backplane_client.retry import RetryPolicy
    from backplane_client.sandbox import ModelCallNotRecorded, ReplayResult, replay
    from backplane_client.session import TaskSession, ToolCall
    from backplane_client.usage import (
        USAGE_KEYS,
        Cost,
        ModelAnswer,
        Usage,
        model_cost,
        usage_from_anthropic,
        usage_from_openai,
    )

__all__ = [
    "DEFAULT_TABLE",
    "SIGNATURE_HEADER",
    "USAGE_KEYS",
    "AgentClient",
    "ApprovalDenied",
    "ApprovalExpired",
    "AsyncAgentClient",
    "AwaitingApproval",
    "BackplaneAPIError",
    "CanonicalizationError",
    "Cost",
    "Envelope",
    "Handler",
    "Lease",
    "LeaseLost",
    "ModelAnswer",
    "ModelCallNotRecorded",
    "ReplayResult",
    "RetryPolicy",
    "SandboxRefused",
    "SignatureError",
    "TaskSession",
    "ToolCall",
    "ToolCallFailed",
    "Usage",
    "canonical_json",
    "ensure_processed_table",
    "event_draft",
    "handle_kombu_message",
    "model_cost",
    "parse_envelope",
    "personal",
    "process_once",
    "prompt_sha256",
    "replay",
    "sign",
    "usage_from_anthropic",
    "usage_from_openai",
    "verify",
]

# name -> the module defining it, imported on first use: all but backplane_client.usage import httpx.
_LAZY_EXPORTS = {
    "AgentClient": "backplane_client.agent",
    "ApprovalDenied": "backplane_client.errors",
    "ApprovalExpired": "backplane_client.errors",
    "AsyncAgentClient": "backplane_client.aio",
    "AwaitingApproval": "backplane_client.errors",
    "BackplaneAPIError": "backplane_client.errors",
    "Lease": "backplane_client.calls",
    "LeaseLost": "backplane_client.errors",
    "ModelCallNotRecorded": "backplane_client.sandbox",
    "ReplayResult": "backplane_client.sandbox",
    "RetryPolicy": "backplane_client.retry",
    "SandboxRefused": "backplane_client.errors",
    "TaskSession": "backplane_client.session",
    "ToolCall": "backplane_client.session",
    "ToolCallFailed": "backplane_client.errors",
    "event_draft": "backplane_client.calls",
    "personal": "backplane_client.calls",
    "replay": "backplane_client.sandbox",
    "USAGE_KEYS": "backplane_client.usage",
    "Cost": "backplane_client.usage",
    "ModelAnswer": "backplane_client.usage",
    "Usage": "backplane_client.usage",
    "model_cost": "backplane_client.usage",
    "usage_from_anthropic": "backplane_client.usage",
    "usage_from_openai": "backplane_client.usage",
}


def __getattr__(name: str) -> Any:
    """The agent SDK's names, imported on first use (PEP 562) so httpx stays optional."""
    module = _LAZY_EXPORTS.get(name)
    if module is not None:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
