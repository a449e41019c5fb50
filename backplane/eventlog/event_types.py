"""Which event types exist, who may write them, and what their payloads must hold."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from backplane.eventlog.canonical import canonical_sha256
from backplane.eventlog.errors import InvalidInput

TASK_STARTED = "TaskStarted"
TASK_CLAIMED = "TaskClaimed"
TASK_COMPLETED = "TaskCompleted"
TASK_FAILED = "TaskFailed"
REASONING_STEP_COMPLETED = "ReasoningStepCompleted"
TOOL_CALL_DISPATCHED = "ToolCallDispatched"
TOOL_CALL_RESULT_RECEIVED = "ToolCallResultReceived"
SUB_AGENT_DISPATCHED = "SubAgentDispatched"
SUB_AGENT_ACCEPTED = "SubAgentAccepted"
SUB_AGENT_RESULT_RECEIVED = "SubAgentResultReceived"
TASK_STALLED = "TaskStalled"
TASK_DEAD_LETTERED = "TaskDeadLettered"
DEAD_LETTER_REQUEUED = "DeadLetterRequeued"
DEAD_LETTER_DISCARDED = "DeadLetterDiscarded"
COMPENSATION_REQUESTED = "CompensationRequested"
COMPENSATION_COMPLETED = "CompensationCompleted"
# A holder gave its lease back (no attempt counted); the task is pending again.
LEASE_RELEASED = "LeaseReleased"
# A task that failed for good has compensations due: it is compensating until the last one.
COMPENSATION_STARTED = "CompensationStarted"
# Every due compensation ran (or a reviewer discarded it): the saga is over.
TASK_COMPENSATED = "TaskCompensated"
# An operator decided a task row is right where its log falls short (histories written before
# every transition was an event): the log records the row's values, who decided and why.
PROJECTION_RECONCILED = "ProjectionReconciled"
# The second event of a fork's log: which task, up to which seq and at which hash it continues
# (backplane/eventlog/forks.py). It changes nothing in the fork's projection.
TASK_FORKED = "TaskForked"
# A model call an agent made, as the agent records it: what a sandbox replay answers from.
LLM_CALLED = "LLMCalled"
# A model call of the task took a budget of its scope past 80 % or 95 % of its limit, or to it
# (recovery/budgets.py); written into the log of the task whose call crossed the line.
BUDGET_WARNING = "BudgetWarning"
BUDGET_EXCEEDED = "BudgetExceeded"
# A person (or an agent of the namespace) cancelled the task: it is closed, its lease holder's
# next write is refused; ``compensate`` starts its saga as a failure would (recovery/fleet.py).
TASK_CANCELLED = "TaskCancelled"
# A person sent a failed task back to work with fresh attempts (a bulk retry, recovery/bulk.py).
TASK_RETRIED = "TaskRetried"
# A gated tool call waits for people (recovery/approvals.py): the request with the arguments'
# canonical hash and the policy version; each ends in one of granted, denied or expired, and an
# escalation hands it to another group first.
APPROVAL_REQUESTED = "ApprovalRequested"
APPROVAL_GRANTED = "ApprovalGranted"
APPROVAL_DENIED = "ApprovalDenied"
APPROVAL_ESCALATED = "ApprovalEscalated"
APPROVAL_EXPIRED = "ApprovalExpired"
# A task waits durably for a named signal (recovery/signals.py): the wait, the signal, or the wait
# running out.
SIGNAL_AWAITED = "SignalAwaited"
SIGNAL_RECEIVED = "SignalReceived"
SIGNAL_TIMED_OUT = "SignalTimedOut"

# Written only by the backplane itself; a client sending one gets 400 (docs/api.md).
SERVER_ONLY_TYPES = frozenset(
    {
        TASK_STARTED,
        TASK_CLAIMED,
        TOOL_CALL_DISPATCHED,
        TOOL_CALL_RESULT_RECEIVED,
        SUB_AGENT_DISPATCHED,
        SUB_AGENT_ACCEPTED,
        SUB_AGENT_RESULT_RECEIVED,
        TASK_STALLED,
        TASK_DEAD_LETTERED,
        DEAD_LETTER_REQUEUED,
        DEAD_LETTER_DISCARDED,
        COMPENSATION_REQUESTED,
        COMPENSATION_COMPLETED,
        LEASE_RELEASED,
        COMPENSATION_STARTED,
        TASK_COMPENSATED,
        PROJECTION_RECONCILED,
        TASK_FORKED,
        BUDGET_WARNING,
        BUDGET_EXCEEDED,
        TASK_CANCELLED,
        TASK_RETRIED,
        APPROVAL_REQUESTED,
        APPROVAL_GRANTED,
        APPROVAL_DENIED,
        APPROVAL_ESCALATED,
        APPROVAL_EXPIRED,
        SIGNAL_AWAITED,
        SIGNAL_RECEIVED,
        SIGNAL_TIMED_OUT,
    }
)

CLIENT_TYPE_PATTERN = re.compile(r"^[A-Z][A-Za-z0-9]{2,63}$")


def _require(payload: dict[str, Any], field: str, kind: type, description: str) -> None:
    value = payload.get(field)
    # bool is a subclass of int in Python; a step must not be ``true``.
    valid = field in payload and isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not valid:
        raise InvalidInput(f"payload.{field} must be {description}", {f"payload.{field}": f"required: {description}"})


def validate_client_event(event_type: str, payload: dict[str, Any]) -> None:
    """Reject reserved or malformed types and payloads that break a known type's rules."""
    if event_type in SERVER_ONLY_TYPES:
        raise InvalidInput(
            f"{event_type} is written only by the backplane",
            {"type": f"'{event_type}' is reserved for the server"},
        )
    if not CLIENT_TYPE_PATTERN.match(event_type):
        raise InvalidInput(
            "event type must be PascalCase, 3 to 64 letters or digits",
            {"type": "must match ^[A-Z][A-Za-z0-9]{2,63}$"},
        )
    if event_type == REASONING_STEP_COMPLETED:
        _require(payload, "step", int, "an integer")
    elif event_type == TASK_COMPLETED:
        _require(payload, "output", dict, "an object")
    elif event_type == TASK_FAILED:
        _require(payload, "error", str, "a string")
        _require(payload, "retryable", bool, "a boolean")
    elif event_type == LLM_CALLED:
        validate_llm_called(payload)


SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def prompt_sha256(prompt: Any) -> str:
    """The hash an ``LLMCalled`` names its prompt by: SHA-256 of the prompt's RFC 8785 canonical
    JSON (a string prompt hashes as its JSON string), so any language computes the same one."""
    return canonical_sha256(prompt)


def validate_llm_called(payload: dict[str, Any]) -> None:
    """``model`` and ``prompt_sha256`` are required and ``output`` must be present; ``prompt``,
    when sent, must be what ``prompt_sha256`` names (it may be left out when it is too large to
    record); ``usage`` maps token kinds to counts; ``step``, when sent, is an integer."""
    _require(payload, "model", str, "a string")
    _require(payload, "prompt_sha256", str, "64 lowercase hex digits")
    if not SHA256_HEX.match(payload["prompt_sha256"]):
        raise InvalidInput("payload.prompt_sha256 must be 64 lowercase hex digits",
                           {"payload.prompt_sha256": "the SHA-256 of the prompt's canonical JSON, in hex"})
    if "output" not in payload:
        raise InvalidInput("payload.output is required", {"payload.output": "required: the model's answer"})
    if "prompt" in payload and prompt_sha256(payload["prompt"]) != payload["prompt_sha256"]:
        raise InvalidInput("payload.prompt_sha256 is not the hash of payload.prompt",
                           {"payload.prompt_sha256": "SHA-256 of the RFC 8785 canonical JSON of payload.prompt"})
    if "step" in payload:
        _require(payload, "step", int, "an integer")
    if payload.get("usage") is not None:
        validate_usage(payload["usage"])
    if "cost" in payload:
        reported_cost(payload["cost"])


# The usage an LLMCalled may carry: OpenTelemetry GenAI's gen_ai.usage.* flattened.
# ``input_tokens`` includes both cache figures and ``output_tokens`` includes reasoning, as
# OpenTelemetry counts them (and OpenAI reports them; Anthropic's ``input_tokens`` leaves the
# cache out, which the SDK's adapter adds back).
USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
              "reasoning_output_tokens")


def validate_usage(usage: Any) -> None:
    """Refuse usage that could not be priced without guessing: unknown keys, negative or
    non-integer counts, parts larger than the whole they belong to."""
    if not isinstance(usage, dict):
        raise InvalidInput("payload.usage must be an object", {"payload.usage": f"keys: {', '.join(USAGE_KEYS)}"})
    unknown = sorted(set(usage) - set(USAGE_KEYS))
    if unknown:
        raise InvalidInput("payload.usage has unknown token kinds",
                           {"payload.usage": f"unknown {', '.join(unknown)}; known: {', '.join(USAGE_KEYS)}"})
    for key, value in usage.items():
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKEN_COUNT:
            raise InvalidInput(f"payload.usage.{key} must be a count",
                               {f"payload.usage.{key}": f"a non-negative integer, at most {MAX_TOKEN_COUNT}"})
    cached = usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    if cached > usage.get("input_tokens", 0):
        raise InvalidInput("cached input tokens are part of input_tokens, and more than it",
                           {"payload.usage.input_tokens": "includes cache_read_ and cache_creation_input_tokens"})
    if usage.get("reasoning_output_tokens", 0) > usage.get("output_tokens", 0):
        raise InvalidInput("reasoning tokens are part of output_tokens, and more than it",
                           {"payload.usage.output_tokens": "includes reasoning_output_tokens"})


# The bounds of an amount a client reports (a model call's or a paid tool's cost): at most 12
# digits before the point and 12 after it, never negative. Twelve after it is the scale of the
# rollup and budget spend columns (numeric(30, 12)), so the rollups sum exactly what the events
# say; twelve before it is far past any one call's price in any currency (10^12 units) and leaves
# the rollups' 18 integer digits room for a million such calls. The text is read only when it is
# short (an amount has no reason to be longer), so no exponent is ever expanded.
AMOUNT_MAX_INTEGER_DIGITS = 12
AMOUNT_MAX_FRACTION_DIGITS = 12
AMOUNT_MAX_CHARS = 64
# A token count of one call: 10^12 is six orders of magnitude past any context window, and keeps
# the rollups' bigint sums (9.2 x 10^18) safe for millions of such calls.
MAX_TOKEN_COUNT = 10**12


def amount_within_bounds(amount: Decimal) -> bool:
    """Whether a finite, non-negative ``amount`` has at most ``AMOUNT_MAX_INTEGER_DIGITS`` digits
    before the point and ``AMOUNT_MAX_FRACTION_DIGITS`` after it once its trailing zeros are
    gone. Reads the digits and exponent only: no context operation, so nothing can overflow."""
    if not amount.is_finite() or amount.is_signed() and amount != 0:
        return False
    _, digits, exponent = amount.as_tuple()
    assert isinstance(exponent, int)  # finite
    significant = len(digits)
    while significant > 1 and digits[significant - 1] == 0:
        significant -= 1
        exponent += 1
    if amount == 0:
        return True
    return significant + exponent <= AMOUNT_MAX_INTEGER_DIGITS and -exponent <= AMOUNT_MAX_FRACTION_DIGITS


def amount_parsed(raw: Any, *, field: str) -> Decimal:
    """A client's amount (a decimal string, ``"0.0042"``, exponent form allowed) within the bounds
    above, or ``InvalidInput`` naming ``field``. Negative zero is zero."""
    bounds = (f"a non-negative decimal string with at most {AMOUNT_MAX_INTEGER_DIGITS} digits before the point "
              f"and {AMOUNT_MAX_FRACTION_DIGITS} after it, e.g. \"0.0042\"")
    amount: Decimal | None = None
    if isinstance(raw, str) and len(raw) <= AMOUNT_MAX_CHARS:
        try:
            amount = Decimal(raw)
        except InvalidOperation:
            amount = None
    if amount is None or not amount_within_bounds(amount):
        raise InvalidInput(f"{field} must be {bounds}", {field: bounds})
    return abs(amount) if amount == 0 else amount


def reported_cost(cost: Any) -> tuple[Decimal, str]:
    """What a provider reported a call cost, ``{"amount": "<decimal>", "currency": "USD"}``, checked."""
    if not isinstance(cost, dict) or set(cost) - {"amount", "currency"}:
        raise InvalidInput("payload.cost must be {amount, currency}, as the provider reported it",
                           {"payload.cost": "amount (a decimal string) and currency; the backplane adds the rest"})
    currency = cost.get("currency")
    if not isinstance(currency, str) or not re.fullmatch("[A-Z]{3}", currency):
        raise InvalidInput("payload.cost.currency must be an ISO 4217 code", {"payload.cost.currency": "e.g. USD"})
    return amount_parsed(cost.get("amount"), field="payload.cost.amount"), currency
