"""Counters and histograms, summed across processes: prometheus_client's multiprocess mode.

Every process (web, Celery worker, beat, ``manage.py relay``) writes its values to memory-mapped
files of its own in ``settings.PROMETHEUS_MULTIPROC_DIR`` (named by host and pid) and ``/metrics``
(``backplane/metrics.py``) sums the files of the directory at scrape time, so a figure is the
same whichever web process answers the scrape, and a process that died still counts. The mode
is chosen when ``prometheus_client.values`` is first imported, from ``PROMETHEUS_MULTIPROC_DIR``
in the environment: settings sets it before anything imports prometheus_client.

The call sites use the small functions below, never the metric objects, and call them once what
they count has committed (``transaction.on_commit`` inside a transaction): a write that rolls
back is not counted. Labels are bounded: kinds, outcomes, destination kinds and event types the
backplane defines; the open-ended ones are folded (``event_type_label`` in the observer that
counts events; ``tool_label``, ``model_label``, ``provider_label`` and ``namespace_label``
here). No task id, agent name, URL or key is ever a label.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial, wraps
from typing import ParamSpec, TypeVar

from prometheus_client import Counter, Histogram

from backplane.telemetry import gen_ai

P = ParamSpec("P")
R = TypeVar("R")

# Seconds, from an append that finds its row free to one stuck behind a lock.
_APPEND_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Tool calls take what the tool takes: from a cache-like answer to minutes of work.
_TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

EVENTS_APPENDED = Counter(
    "backplane_events_appended", "Events committed to the log, by type (types a client defined are counted as custom)",
    ["type"])
APPEND_DURATION = Histogram(
    "backplane_append_duration_seconds", "Time the event-append service took for one append or batch that it answered",
    buckets=_APPEND_BUCKETS)
IDEMPOTENT_REPLAYS = Counter(
    "backplane_idempotent_replays", "Requests answered from what was already recorded instead of being applied again",
    ["kind"])
CLAIMS = Counter(
    "backplane_claims", "Tasks claimed under a lease; recovered=true: work an earlier holder left unfinished",
    ["recovered"])
STALLS = Counter("backplane_stalls", "Leases the stall detector took back, by why the task stalled", ["reason"])
RECOVERIES = Counter(
    "backplane_recoveries", "What the stall detector did with a stalled task: requeued it, or dead-lettered it",
    ["outcome"])
COMPENSATIONS = Counter("backplane_compensations", "Compensations (saga steps) reported, by outcome", ["outcome"])
DELIVERIES = Counter("backplane_deliveries", "Outbox messages delivered, by kind of destination", ["destination"])
DELIVERY_FAILURES = Counter(
    "backplane_delivery_failures",
    "Failed delivery attempts, by kind of destination and what became of the message: failed (retried "
    "later), dead (a dead letter), lost (another relay had claimed it since)",
    ["destination", "outcome"])
TOOL_CALLS_DISPATCHED = Counter("backplane_tool_calls_dispatched", "Tool calls recorded before they were made",
                                ["tool"])
TOOL_CALLS = Counter("backplane_tool_calls", "Tool-call results recorded, by tool and status", ["tool", "status"])
TOOL_CALL_DURATION = Histogram(
    "backplane_tool_call_duration_seconds", "From a tool call's dispatch to its recorded result", ["tool"],
    buckets=_TOOL_BUCKETS)
TOOL_GATEWAY_DURATION = Histogram(
    "backplane_tool_gateway_duration_seconds",
    "The gateway's HTTP call to a registered tool; outcome answered, or unavailable (no usable answer)",
    ["tool", "outcome"], buckets=_TOOL_BUCKETS)
# A person's decision takes minutes to days: buckets from 10 s to a week.
_DECISION_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0,
                     7 * 86400.0)
APPROVAL_DECISION_TIME = Histogram(
    "backplane_approval_time_to_decision_seconds",
    "From an approval request to its end, by outcome: granted, denied or expired", ["outcome"],
    buckets=_DECISION_BUCKETS)
APPROVAL_OUTCOMES = ("granted", "denied", "expired")
DEAD_LETTERS_CREATED = Counter("backplane_dead_letters_created", "Dead letters made, by source", ["source"])
DEAD_LETTERS_DECIDED = Counter(
    "backplane_dead_letters_decided", "Dead letters a reviewer decided, by decision", ["decision"])
# delivery.models.DeadLetterSource's values (checked by tests/backplane/telemetry/test_metrics_counters.py).
DEAD_LETTER_SOURCES = ("audit_export", "compensation", "outbox", "task", "tool_call")
DEAD_LETTER_DECISIONS = ("discarded", "requeued")
BREAKER_TRANSITIONS = Counter(
    "backplane_breaker_transitions", "Circuit-breaker transitions, by kind of breaker and the state entered",
    ["kind", "to_state"])
# Model calls (``LLMCalled``), after OpenTelemetry's GenAI metric ``gen_ai.client.token.usage``:
# its buckets (powers of 4, 1 to 4^13 tokens), one observation per call and token type. "input"
# and "output" are a call's totals; the other types are parts of them (cache reads and writes of
# the input, reasoning of the output), observed only when the call had some.
GEN_AI_TOKEN_TYPES = tuple(gen_ai.TOKEN_TYPES.values())
_TOKEN_BUCKETS = tuple(float(4**n) for n in range(14))
GEN_AI_TOKEN_USAGE = Histogram(
    "backplane_gen_ai_client_token_usage",
    "Tokens per model call (gen_ai.client.token.usage), by token type (cache_* are part of input, reasoning_output "
    "of output), provider and model; sandbox replays left out", ["token_type", "provider", "model"],
    buckets=_TOKEN_BUCKETS)
GEN_AI_COST = Counter(
    "backplane_gen_ai_cost",
    "What model calls cost, as recorded with each (the provider's figure or the price table's), by namespace, "
    "model and currency; calls with no price add nothing here (see backplane_gen_ai_calls)",
    ["namespace", "model", "currency"])
GEN_AI_CALLS = Counter(
    "backplane_gen_ai_calls",
    "Model calls recorded, by namespace, model and where their cost came from: provider, price_table, or unpriced "
    "(no price known: the cost is unknown, not zero); sandbox replays left out",
    ["namespace", "model", "cost_source"])


def _initialise_known_series() -> None:
    """Known label values start at 0 in every process, so ``rate()`` and the alerts see the first
    increase instead of a series that appears out of nowhere (Prometheus' advice)."""
    for recovered in ("true", "false"):
        CLAIMS.labels(recovered=recovered)
    for reason in ("lease_expired", "no_progress"):
        STALLS.labels(reason=reason)
    for outcome in ("requeued", "dead_lettered"):
        RECOVERIES.labels(outcome=outcome)
    for outcome in ("succeeded", "failed"):
        COMPENSATIONS.labels(outcome=outcome)
    for destination in ("broker", "webhook"):
        DELIVERIES.labels(destination=destination)
        for outcome in ("failed", "dead"):
            DELIVERY_FAILURES.labels(destination=destination, outcome=outcome)
    for source in DEAD_LETTER_SOURCES:
        DEAD_LETTERS_CREATED.labels(source=source)
    for decision in DEAD_LETTER_DECISIONS:
        DEAD_LETTERS_DECIDED.labels(decision=decision)
    for outcome in APPROVAL_OUTCOMES:
        APPROVAL_DECISION_TIME.labels(outcome=outcome)
    for kind in ("agent", "tool"):
        for state in ("open", "half_open", "closed"):
            BREAKER_TRANSITIONS.labels(kind=kind, to_state=state)


_initialise_known_series()


# --- labels that would otherwise be open-ended ----------------------------------------------------


class BoundedLabel:
    """An open-ended label kept bounded: the first ``limit`` distinct values a process sees that
    look like names (``pattern``) are labels of their own, every other value is "other"."""

    def __init__(self, *, limit: int, pattern: str) -> None:
        self.limit = limit
        self._pattern = re.compile(pattern)
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit and self._pattern.fullmatch(value):
                self._seen.add(value)
                return value
        return "other"


# Tool names are registered by administrators for the gateway, but an agent that calls a tool
# itself names it in its dispatch.
MAX_TOOL_LABELS = 100
tool_label = BoundedLabel(limit=MAX_TOOL_LABELS, pattern=r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# A model call names its provider and model itself, and any namespace may record one.
MAX_MODEL_LABELS = 100
model_label = BoundedLabel(limit=MAX_MODEL_LABELS, pattern=r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")
provider_label = BoundedLabel(limit=20, pattern=r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
namespace_label = BoundedLabel(limit=100, pattern=r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


# --- what the call sites count ----------------------------------------------------------------------


def events_appended_count(*, type_label: str, count: int) -> None:
    EVENTS_APPENDED.labels(type=type_label).inc(count)


def observe_append_duration(service: Callable[P, R]) -> Callable[P, R]:
    """Decorates the append service: the time of each call that returns an answer (an append, a
    batch or a replay); a refusal (an exception) is not an append and is not observed."""

    @wraps(service)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.perf_counter()
        outcome = service(*args, **kwargs)
        append_duration_observe(time.perf_counter() - started)
        return outcome

    return timed


def append_duration_observe(seconds: float) -> None:
    """The time of one append that answered (the async append, which no decorator wraps)."""
    APPEND_DURATION.observe(seconds)


def idempotent_replay_count(*, kind: str) -> None:
    IDEMPOTENT_REPLAYS.labels(kind=kind).inc()


def claim_count(*, recovered: bool) -> None:
    CLAIMS.labels(recovered="true" if recovered else "false").inc()


def stall_count(*, reason: str, outcome: str) -> None:
    """A stalled task (``reason``: lease_expired, no_progress) and what recovery did (``outcome``)."""
    STALLS.labels(reason=reason).inc()
    RECOVERIES.labels(outcome=outcome).inc()


def approval_decision_observe(*, outcome: str, seconds: float) -> None:
    APPROVAL_DECISION_TIME.labels(outcome=outcome).observe(max(0.0, seconds))


def compensation_count(*, outcome: str) -> None:
    COMPENSATIONS.labels(outcome=outcome).inc()


def deliveries_count(*, destination: str, count: int) -> None:
    if count:
        DELIVERIES.labels(destination=destination).inc(count)


def delivery_failure_count(*, destination: str, outcome: str) -> None:
    DELIVERY_FAILURES.labels(destination=destination, outcome=outcome).inc()


def tool_call_dispatched_count(*, tool: str) -> None:
    TOOL_CALLS_DISPATCHED.labels(tool=tool_label(tool)).inc()


def tool_call_result_count(*, tool: str, status: str, seconds: float) -> None:
    """A result recorded ``seconds`` after its call was dispatched."""
    label = tool_label(tool)
    TOOL_CALLS.labels(tool=label, status=status).inc()
    TOOL_CALL_DURATION.labels(tool=label).observe(max(0.0, seconds))


@contextmanager
def tool_gateway_call_timed(*, tool: str) -> Iterator[None]:
    """Times the gateway's call to a tool: an exception means no usable answer came."""
    started = time.perf_counter()
    outcome = "unavailable"
    try:
        yield
        outcome = "answered"
    finally:
        TOOL_GATEWAY_DURATION.labels(tool=tool_label(tool), outcome=outcome).observe(time.perf_counter() - started)


def dead_letters_created_count(*, source: str, count: int) -> None:
    if count:
        DEAD_LETTERS_CREATED.labels(source=source).inc(count)


def dead_letter_decided_count(*, decision: str) -> None:
    DEAD_LETTERS_DECIDED.labels(decision=decision).inc()


def breaker_transition_count(*, kind: str, to_state: str) -> None:
    BREAKER_TRANSITIONS.labels(kind=kind, to_state=to_state).inc()


def gen_ai_call_count(*, namespace: str, call: gen_ai.ModelCall) -> None:
    """A model call: its tokens by type (``GEN_AI_TOKEN_TYPES``; none when it reported no usage)
    and what it cost (nothing when it has no price: counted by its ``cost_source`` only)."""
    namespace, model = namespace_label(namespace), model_label(call.model)
    GEN_AI_CALLS.labels(namespace=namespace, model=model, cost_source=call.cost_source).inc()
    if call.amount is not None and call.currency:
        GEN_AI_COST.labels(namespace=namespace, model=model, currency=call.currency).inc(float(call.amount))
    tokens = call.tokens()
    if tokens is None:
        return
    provider = provider_label(call.provider) if call.provider else "unknown"
    for token_type in GEN_AI_TOKEN_TYPES:
        count = tokens.get(token_type, 0)
        if count or token_type in ("input", "output"):
            GEN_AI_TOKEN_USAGE.labels(token_type=token_type, provider=provider, model=model).observe(count)


def model_calls_count_after_commit(written: gen_ai.Written) -> Callable[[], None] | None:
    """Writer observer (``DashboardConfig.ready`` registers it): count the write's model calls
    once, and only if, it commits. Sandboxes are left out, as they are of the cost rollups: a
    replay is not the fleet's spending."""
    if written.task.sandbox:
        return None
    calls = gen_ai.model_calls(written.events)
    return partial(_model_calls_count, written.task.namespace, calls) if calls else None


def _model_calls_count(namespace: str, calls: list[gen_ai.ModelCall]) -> None:
    for call in calls:
        gen_ai_call_count(namespace=namespace, call=call)
