"""The tool gateway: the backplane calls a registered tool itself (``POST /api/v1/tools/{name}/invoke/``).

One invoke, in order:

1. Cheap checks (tool, task, lease) and a look at the record of this call. An answer on
   record and within the tool's TTL is the cache: it is returned as it is and the tool is
   not called, so neither the breaker nor the rate limit is consulted.
2. Otherwise the request must pass the tool's circuit breaker and rate limit. Both live on
   the Tool row (the task's namespace's tool of that name, else the global one: each row
   has its own), so they hold across web processes: the breaker (recovery/breakers.py, the
   same state machine as the agents') changes under the row lock, the rate-limit window by a
   conditional UPDATE. A refused request changes nothing.
3. ``tool_call_dispatch`` commits ``ToolCallDispatched`` (write before you act).
4. Outside any transaction the input is POSTed to the tool with ``Idempotency-Key``. A call
   that was dispatched but never answered (its agent crashed, or the tool failed) is sent
   again with the same key: that is the in-flight zone, where a tool may see a key twice
   and must act once. For tools that ignore the header, step 1 is what prevents a second
   call once an answer is on record.
5. An answer (2xx, or a 4xx refusal) is recorded by ``tool_call_record_result``
   (``ToolCallResultReceived``) and counts as a success for the breaker. No usable answer
   (transport error, timeout, 5xx, 408, 429) records nothing, counts a breaker failure and
   is a 502: the call stays in flight and a retry sends the same key.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from backplane.delivery.outbound import OutboundRefused, outbound_client
from backplane.eventlog.errors import BackplaneError, IdempotencyMismatch, InvalidInput, NotFound
from backplane.eventlog.selectors import task_visible
from backplane.eventlog.services import ensure_storable_json
from backplane.eventlog.writer import check_lease
from backplane.privacy.sealing import seal_personal
from backplane.privacy.services import personal_open
from backplane.telemetry import counters
from recovery import breakers
from recovery.approvals import approval_awaited
from recovery.errors import RateLimited, ToolUnavailable
from recovery.models import Tool, ToolCall, ToolCallStatus
from recovery.tool_calls import ToolCallOutcome, tool_call_dispatch, tool_call_key, tool_call_record_result

USER_AGENT = "agent-backplane-gateway/1"

_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _http() -> httpx.Client:
    """One client per process, made on first use: building one costs a TLS context (a quarter
    of a second), and it keeps connections to the tools open. httpx clients are thread-safe.
    It connects only to public or allowed addresses and never follows a redirect (outbound.py)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = outbound_client()
        return _client


def _seconds_until(moment: datetime, now: datetime) -> int:
    return max(1, math.ceil((moment - now).total_seconds()))


def tool_for_namespace(*, namespace: str, name: str) -> Tool:
    """The tool ``name`` as the namespace's agents see it: the namespace's own, else the global
    one (blank namespace); never another namespace's, which is as unknown as a missing tool.

    The namespace's row shadows the global one even while inactive: switching a namespace's
    tool off must not send its calls to the global tool's URL instead.
    """
    tool = (Tool.objects.filter(name=name, namespace__in=[namespace, ""])
            .order_by(Case(When(namespace="", then=Value(1)), default=Value(0))).first())
    if tool is None or not tool.is_active:
        raise NotFound("tool not found", {"tool": name})
    return tool


# --- the invoke --------------------------------------------------------------------------------


def tool_invoke(
    *,
    namespace: str | None,
    task_id: uuid.UUID,
    step: int,
    tool_name: str,
    input: dict[str, Any],
    agent: str | None,
    lease_epoch: int | None,
    kinds: Sequence[str] = (),
    reason: str = "",
) -> ToolCallOutcome:
    """Call a registered tool once for this step of this task, or answer from the record. A call
    a tool policy gates raises ``ApprovalPending`` (from ``tool_call_dispatch``) until approved.

    Must not run inside a transaction: the tool is called between two commits.
    """
    # The task first: its namespace says which tool the name means (staff, who have no
    # namespace of their own, call the tools of the task's).
    task = task_visible(namespace=namespace, task_id=task_id)
    tool = tool_for_namespace(namespace=task.namespace, name=tool_name)
    key = tool_call_key(task_id=task_id, step=step, tool=tool.name)
    now = timezone.now()
    # Checked again under the task's row lock by tool_call_dispatch; checking first means a
    # request that will be refused anyway spends neither a rate-limit slot nor the trial.
    ensure_storable_json(input, "input")
    check_lease(task, lease_epoch, agent=agent, kinds=kinds)

    known = ToolCall.objects.filter(pk=key).first()
    if known is not None and known.status != ToolCallStatus.DISPATCHED and known.expires_at <= now:
        # Past its TTL the answer is no longer the cache; drop it as the purge would.
        ToolCall.objects.filter(pk=key, expires_at__lte=now).exclude(status=ToolCallStatus.DISPATCHED).delete()
        known = None
    # An answered call is replayed and a call with another input is refused (422) by
    # tool_call_dispatch without calling the tool; only calls that will go out pass the gate.
    # A sandbox never calls a tool: tool_call_dispatch answers it from the record or refuses it.
    # A call that waits for people's approval does not go out either: each of its dispatches until
    # the decision would otherwise take a rate-limit slot (and maybe the breaker's trial).
    will_call = not task.sandbox and (
        (known is None and not approval_awaited(task, key=key, tool=tool.name, input=input))
        or (known is not None and known.status == ToolCallStatus.DISPATCHED and known.input == input))
    permit = _admit(tool, now=now) if will_call else None

    sent = False
    try:
        outcome = tool_call_dispatch(
            namespace=namespace,
            task_id=task_id,
            step=step,
            tool=tool.name,
            input=input,
            agent=agent,
            lease_epoch=lease_epoch,
            ttl_seconds=tool.ttl_seconds,
            kinds=kinds,
            reason=reason,
        )
        if outcome.call.status != ToolCallStatus.DISPATCHED:
            return ToolCallOutcome(call=outcome.call, replayed=True)
        if permit is None:
            # The answered record we looked at expired and was purged before the dispatch.
            permit = _admit(tool, now=timezone.now())
        sent = True
        try:
            with counters.tool_gateway_call_timed(tool=tool.name):
                # The effect's key: a fork's call of a step its source dispatched is the same effect.
                # The tool is the namespace's own: it gets the personal values opened (or shown as
                # erased), and may mark its answer's (sealed before it is recorded).
                opened = personal_open(task.namespace, input, reader=None, where_read="tool", bounded=False).value
                answer = _send(tool=tool, key=outcome.call.effect_key, input=opened)
        except ToolUnavailable as exc:
            tool_breaker_record_failure(tool_id=tool.pk, reason=exc.message)
            raise
    finally:
        if permit is not None and permit.trial_started_at is not None and not sent:
            _trial_release(tool, permit)
    tool_breaker_record_success(tool_id=tool.pk)
    try:
        answer = ToolAnswer(answer.status, seal_personal(task.namespace, answer.result))
    except BackplaneError as exc:
        # The call was made: what it answered is recorded as a failure that says why.
        answer = ToolAnswer(ToolCallStatus.FAILED, {"error": f"the tool's answer could not be sealed: {exc.message}",
                                                    "details": exc.details})

    try:
        return tool_call_record_result(
            namespace=namespace,
            key=key,
            status=answer.status,
            result=answer.result,
            agent=agent,
            lease_epoch=lease_epoch,
            fenced=False,
        )
    except IdempotencyMismatch:
        # Another invoke of the same in-flight call recorded the tool's answer first; it stands.
        return ToolCallOutcome(call=ToolCall.objects.get(pk=key), replayed=True)


# --- calling the tool --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolAnswer:
    status: str  # ToolCallStatus.SUCCEEDED or FAILED
    result: dict[str, Any]


# Not usable as an answer: the tool may act if asked again (408 timeout, 429 its own limit).
_RETRYABLE_4XX = frozenset({408, 429})


def _send(*, tool: Tool, key: str, input: dict[str, Any]) -> ToolAnswer:
    """POST the input with the call's Idempotency-Key; ToolUnavailable when no usable answer came."""
    body = json.dumps(input, separators=(",", ":"), ensure_ascii=False).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Idempotency-Key": key,
        "User-Agent": USER_AGENT,
    }
    # httpx's timeout bounds each read; the deadline bounds the whole answer.
    deadline = time.monotonic() + tool.timeout_seconds
    try:
        with _http().stream("POST", tool.url, content=body, headers=headers, timeout=tool.timeout_seconds) as response:
            raw, truncated = _read_capped(response, deadline=deadline)
    except OutboundRefused as exc:
        # Answered like a tool that cannot be reached, and counted by its breaker like one.
        raise ToolUnavailable(f"tool {tool.name}: {exc}"[:500], {"tool": tool.name}) from exc
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ToolUnavailable(
            f"tool {tool.name} did not answer: {exc.__class__.__name__}: {exc}"[:500], {"tool": tool.name}
        ) from exc
    code = response.status_code
    if not 200 <= code < 300 and not (400 <= code < 500 and code not in _RETRYABLE_4XX):
        raise ToolUnavailable(f"tool {tool.name} answered HTTP {code}", {"tool": tool.name, "status_code": code})
    value: Any = {"truncated": True, "limit_bytes": settings.BACKPLANE_PAYLOAD_LIMIT_BYTES} if truncated \
        else _parse(raw)
    if code >= 400:
        return ToolAnswer(status=ToolCallStatus.FAILED, result={"status_code": code, "body": value})
    if value is None:
        return ToolAnswer(status=ToolCallStatus.SUCCEEDED, result={})
    return ToolAnswer(status=ToolCallStatus.SUCCEEDED, result=value if isinstance(value, dict) else {"value": value})


def _read_capped(response: httpx.Response, *, deadline: float) -> tuple[bytes, bool]:
    """The body, up to the payload limit (True: there was more, and it was not read)."""
    limit = settings.BACKPLANE_PAYLOAD_LIMIT_BYTES
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), True
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the answer took longer than the tool's timeout")
    return b"".join(chunks), False


def _parse(raw: bytes) -> Any:
    """The body as JSON when it is JSON we can store and hash, else as text; None when empty."""
    if not raw.strip():
        return None
    try:
        value = json.loads(raw)
        ensure_storable_json(value, "result")
    except (ValueError, RecursionError, InvalidInput):
        # Not JSON, or JSON the log cannot hold (NaN, U+0000, lone surrogates): keep the text.
        return raw.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    return value


# --- the gate: circuit breaker, then rate limit ------------------------------------------------


@dataclass(frozen=True)
class Permit:
    # Set when this request is the one call let through a half-open breaker: its trial.
    trial_started_at: datetime | None = None


def _admit(tool: Tool, *, now: datetime) -> Permit:
    permit = tool_breaker_admit(tool=tool, now=now)
    try:
        tool_rate_limit_take(tool=tool, now=now)
    except RateLimited:
        _trial_release(tool, permit)
        raise
    return permit


# The tool's circuit breaker is the one state machine of recovery/breakers.py (store TOOLS);
# these are its entry points for the gateway and the admin.


def tool_breaker_admit(*, tool: Tool, now: datetime) -> Permit:
    """Let a call through, make it the half-open breaker's trial, or refuse it with CircuitOpen.

    ``tool`` was read at the start of the request; a breaker that opens a moment later lets
    that one call through, which is harmless. The trial is claimed under the row lock: of the
    requests that find the cool-down over, exactly one gets it. A trial that never reports
    (its process died) is given up after the tool's timeout plus a cool-down.
    """
    return Permit(trial_started_at=breakers.breaker_admit(breakers.TOOLS, tool, now=now).trial_started_at)


def _trial_release(tool: Tool, permit: Permit) -> None:
    """The trial was admitted but the tool was not called: back to open with the cool-down
    already spent, so the next request becomes the trial."""
    if permit.trial_started_at is not None:
        breakers.breaker_release_trial(breakers.TOOLS, tool.pk, trial_started_at=permit.trial_started_at,
                                       reason="the trial call was not sent")


def tool_breaker_record_failure(*, tool_id: int, reason: str) -> Tool:
    """Count a failure; the threshold opens the breaker, a failed trial opens it again."""
    with transaction.atomic(durable=True):
        tool = breakers.TOOLS.lock(tool_id)
        breakers.breaker_count_failures(breakers.TOOLS, [(tool, 1, None)], reason=reason, now=timezone.now())
    return tool


def tool_breaker_record_success(*, tool_id: int) -> None:
    """An answer came: the breaker closes and the failure count starts again."""
    with transaction.atomic(durable=True):
        breakers.breaker_count_success(breakers.TOOLS, Tool.objects.filter(pk=tool_id), reason="the tool answered",
                                       now=timezone.now())


def tool_breaker_reset(*, tool_id: int, decided_by: str, reason: str = "") -> None:
    """An operator closes the breaker by hand."""
    breakers.breaker_close(breakers.TOOLS, tool_id, decided_by=decided_by, reason=reason)


def tool_rate_limit_take(*, tool: Tool, now: datetime) -> None:
    """Take one call from the tool's per-minute budget, or raise RateLimited.

    One UPDATE counts the call into the current window or starts a new one; a full window
    matches no row. Concurrent requests (any process) queue on the row and PostgreSQL
    re-checks the WHERE clause against the count the previous one left, so no more than
    the limit ever get through. A window newer than ours (another process's clock is
    ahead) is counted into, never moved back.
    """
    if tool.rate_limit_per_minute == 0:
        return
    window = now.replace(second=0, microsecond=0)
    stale = Q(rate_window_start__isnull=True) | Q(rate_window_start__lt=window)
    taken = (
        Tool.objects.filter(pk=tool.pk)
        .filter(stale | Q(rate_window_count__lt=F("rate_limit_per_minute")))
        .update(
            rate_window_start=Case(When(stale, then=Value(window)), default=F("rate_window_start")),
            rate_window_count=Case(When(stale, then=Value(1)), default=F("rate_window_count") + 1),
        )
    )
    if not taken:
        retry_after = _seconds_until(window + timedelta(minutes=1), now)
        raise RateLimited(
            f"tool {tool.name} allows {tool.rate_limit_per_minute} calls a minute",
            retry_after=retry_after,
            details={"tool": tool.name, "limit_per_minute": tool.rate_limit_per_minute, "retry_after": retry_after},
        )
