"""A claimed task as an agent works on it: heartbeats, fenced writes, resumable steps.

A :class:`TaskSession` is what an agent holds between claiming a task and finishing it. It
exists so that the three rules of working under a lease are kept without thinking about them:

1. *Stay alive*: a background thread heartbeats well inside the lease, and stops for good the
   moment the server says the lease is gone (``409 stale_lease``/``task_closed``, ``404``).
2. *Write only while holding*: every write carries the lease epoch; once the lease is known to
   be lost the session refuses writes itself (:class:`LeaseLost`, nothing sent), and a write
   the server refuses as stale marks the session lost too. A replaced holder must stop: the
   new holder is already resuming from the log.
3. *Never do a step twice*: the recovery context (read once, cached) says which reasoning steps
   are logged, which model calls and tool calls have answers and which sub-agents have results;
   ``reason``, ``resume``, ``model_call``, ``tool_call``/``call_tool`` and ``subtask`` use it, and
   the contract's stable keys make even a blind repeat harmless.

A session writes nothing when its block ends, not even on an exception: an agent that failed
in the middle leaves its lease to expire, so the stall detector counts the attempt (a release
would not, and a crashing bug would loop forever). Call :meth:`TaskSession.fail` or
:meth:`TaskSession.release` to end sooner.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from backplane_client import calls
from backplane_client.calls import APPROVAL_WAIT_SECONDS, JSON, Lease, TaskId, event_draft
from backplane_client.canonical import canonical_json
from backplane_client.errors import (
    LEASE_LOST_CODES,
    AwaitingApproval,
    BackplaneAPIError,
    LeaseLost,
    ToolCallFailed,
    ToolOutcomeMissing,
)
from backplane_client.methods import Sender
from backplane_client.retry import RetryPolicy
from backplane_client.usage import Cost, Usage

__all__ = ["ModelFunction", "TaskSession", "ToolCall", "ToolFunction", "heartbeat_interval_for", "llm_called_payload"]

logger = logging.getLogger("backplane_client")

T = TypeVar("T")
#: What ``call_tool`` runs when the call needs making: ``fn(effect_key, input) -> result``.
ToolFunction = Callable[[str, dict[str, Any]], Mapping[str, Any]]
#: What ``model_call`` runs when the step has no recorded answer: ``call(prompt)`` returns the
#: model's answer as a :class:`~backplane_client.usage.ModelAnswer`, ``{"output": <any JSON>,
#: "usage": {"input_tokens": int, ...}, "cost": {"amount": str, "currency": str}}`` (usage, cost optional).
ModelFunction = Callable[[Any], Mapping[str, Any]]

MIN_HEARTBEAT_INTERVAL = 0.2
DEFAULT_LEASE_SECONDS = 30.0  # the contract's default, for a lease whose deadline cannot be read
ANSWERED = frozenset({"succeeded", "failed"})
NEEDS_CALLING = frozenset({"dispatched", "in_flight"})
AWAITING_APPROVAL = "awaiting_approval"
TERMINAL_SUBTASK = frozenset({"completed", "failed", "dead_lettered", "compensated"})
#: A prompt whose canonical JSON is longer than this is recorded by its hash only.
PROMPT_RECORD_LIMIT = 64 * 1024


def llm_called_payload(
    *, step: int, model: str, prompt: Any, output: Any, usage: Usage | Mapping[str, int] | None = None,
    provider: str | None = None, cost: Cost | Mapping[str, str] | None = None,
) -> JSON:
    """An ``LLMCalled`` payload: the model, the prompt's hash (SHA-256 of its RFC 8785 canonical
    JSON) and the prompt itself unless that is over ``PROMPT_RECORD_LIMIT`` bytes, the output,
    and ``usage`` (:mod:`backplane_client.usage`), ``step``, ``provider`` and ``cost``.

    Only the types are checked here, so that a provider's own usage object passed as it comes
    fails now and says what to pass instead; the keys and their sums are the server's to check
    (one rule, one place).
    """
    if usage is not None and not isinstance(usage, Mapping):
        raise TypeError(f"usage must be a mapping of token counts, not {type(usage).__name__}: pass "
                        "usage_from_openai(response) or usage_from_anthropic(response) (backplane_client.usage)")
    if cost is not None and not isinstance(cost, Mapping):
        raise TypeError(f"cost must be {{'amount': '<decimal>', 'currency': 'USD'}}, not {type(cost).__name__}: "
                        "pass model_cost(amount) (backplane_client.usage)")
    canonical = canonical_json(prompt)
    payload: JSON = {"step": step, "model": model, "prompt_sha256": hashlib.sha256(canonical).hexdigest(),
                     "output": output}
    if len(canonical) <= PROMPT_RECORD_LIMIT:
        payload["prompt"] = prompt
    if usage is not None:
        payload["usage"] = dict(usage)
    if provider is not None:
        payload["provider"] = provider
    if cost is not None:
        payload["cost"] = dict(cost)
    return payload


def heartbeat_interval_for(lease: Lease, *, now: datetime | None = None) -> float:
    """A third of the lease: two heartbeats may fail (a blip, a slow server) before it runs out.

    The lease's length is the one asked for in the claim when known; otherwise it is measured
    as ``expires_at`` minus now, which is off by the clock skew between agent and server.
    """
    if lease.lease_seconds is not None:
        seconds = float(lease.lease_seconds)
    else:
        try:
            expires_at = datetime.fromisoformat(lease.expires_at)
        except ValueError:
            seconds = DEFAULT_LEASE_SECONDS
        else:
            seconds = (expires_at - (now or datetime.now(UTC))).total_seconds()
    return max(MIN_HEARTBEAT_INTERVAL, seconds / 3)


class ToolCall:
    """One tool call of a session, as the idempotency proxy answered its dispatch.

    ``needed`` is true when the tool must be called now (``status`` ``dispatched``, or
    ``in_flight``: dispatched by an earlier attempt that never recorded an answer). Call it with
    the header ``Idempotency-Key: <effect_key>`` — a well-behaved tool then acts at most once per
    key, however often it is asked — and set the outcome with :meth:`succeeded` or :meth:`failed`
    (or assign ``result``, which counts as success). When ``needed`` is false the proxy already
    had the answer: ``status`` is ``succeeded`` or ``failed`` and ``result`` holds it.

    ``key`` is the call's own idempotency key (its record is kept under it); ``effect_key`` is
    the key of the effect, the one the tool must see. They are equal but in a fork, for a step
    its source dispatched before the fork point and never heard back from: the tool may have
    acted on the source's key already, so the fork asks with that key again.
    """

    def __init__(self, *, step: int, tool: str, input: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
        self.step = step
        self.tool = tool
        self.input: JSON = dict(input)
        self.key: str = answer["idempotency_key"]
        # Older servers answer without it; their key is the effect's.
        self.effect_key: str = answer.get("effect_key") or self.key
        self.status: str = answer["status"]
        self.replayed: bool = bool(answer.get("replayed", False))
        self.needed: bool = self.status in NEEDS_CALLING
        self.result: JSON | None = None if self.needed else answer.get("result")
        self._outcome: str | None = None

    def __repr__(self) -> str:
        return f"<ToolCall step={self.step} tool={self.tool!r} status={self.status} key={self.key[:12]}…>"

    @property
    def answered(self) -> bool:
        """Whether an answer is on record (``succeeded`` or ``failed``)."""
        return self.status in ANSWERED

    def succeeded(self, result: Mapping[str, Any]) -> None:
        """The tool answered: record ``result`` as the call's success when the block ends."""
        self._set_outcome("succeeded", result)

    def failed(self, result: Mapping[str, Any]) -> None:
        """The tool refused for good: record ``result`` as a failure, so no later attempt repeats it."""
        self._set_outcome("failed", result)

    def _set_outcome(self, status: str, result: Mapping[str, Any]) -> None:
        if not self.needed or self.answered:
            raise RuntimeError(f"tool call {self.key} already has its answer ({self.status}); nothing to record")
        self._outcome = status
        self.result = dict(result)

    def outcome(self) -> tuple[str, JSON]:
        """What to record: the status and result set in the block (``result`` alone: success)."""
        if self.result is None:
            raise ToolOutcomeMissing(
                f"tool call {self.tool!r} at step {self.step} needed making but the block set no outcome: "
                "call call.succeeded(result) or call.failed(result), or assign call.result"
            )
        return self._outcome or "succeeded", self.result

    def recorded(self, record: Mapping[str, Any]) -> None:
        """Take the answer as the proxy recorded it (a repeat gets the first one recorded)."""
        self.status = record["status"]
        self.result = record.get("result")


class TaskSession:
    """Work on one claimed task under its lease; see the module's docstring for the why.

    Use it as a context manager: entering starts the heartbeat thread, leaving stops it (and
    sends nothing else). Not meant to be shared between threads, except that :attr:`lost` may
    be read from anywhere.
    """

    def __init__(self, client: Sender, lease: Lease, *, heartbeat_interval: float | None = None) -> None:
        self.client = client
        self.lease = lease
        self.task_id: str = lease.task_id
        self.lease_epoch: int = lease.lease_epoch
        self.task: JSON = lease.task
        self.input: JSON = dict(lease.task.get("input") or {})
        self.recovered: bool = lease.recovered
        #: The lease's deadline as the latest heartbeat answered it.
        self.expires_at: str = lease.expires_at
        self.heartbeat_interval = max(MIN_HEARTBEAT_INTERVAL, heartbeat_interval or heartbeat_interval_for(lease))
        #: Heartbeats the server accepted so far.
        self.heartbeats = 0
        self._context: JSON | None = None
        # What this session itself recorded, so its own steps count as done without a re-read.
        self._steps_done: set[int] = set()
        self._step_payloads: dict[int, JSON] = {}
        self._answers: dict[tuple[int, str], JSON] = {}
        self._model_calls: dict[int, JSON] = {}
        self._lost = threading.Event()
        self._lost_error: BackplaneAPIError | None = None
        self._ended: str | None = None
        # complete/fail/release and a heartbeat never overlap: a heartbeat racing the final
        # write would be refused (the lease is gone) and mark a finished session "lost".
        self._ending = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        state = "lost" if self.lost else (self._ended or "held")
        return f"<TaskSession task={self.task_id} epoch={self.lease_epoch} {state}>"

    # --- the lease -------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the lease is known to be gone (refused heartbeat or write)."""
        return self._lost.is_set()

    @property
    def lost_error(self) -> BackplaneAPIError | None:
        """The answer that showed the lease lost, if it is."""
        return self._lost_error

    @property
    def ended(self) -> str | None:
        """How this session ended the task (``completed``, ``failed`` or ``released``), or None."""
        return self._ended

    def start(self) -> TaskSession:
        """Start heartbeating (what entering the ``with`` block does)."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.task_id[:8]}",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop heartbeating, waiting briefly for a heartbeat in flight. Sends nothing."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.heartbeat_interval + 5.0)

    def __enter__(self) -> TaskSession:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _heartbeat_loop(self) -> None:
        # Short, fast retries inside one beat; the loop itself is the long-term retry.
        policy = RetryPolicy(attempts=3, base_delay=min(0.2, self.heartbeat_interval / 4),
                             max_delay=self.heartbeat_interval / 2)
        while not self._stop.wait(self.heartbeat_interval):
            with self._ending:
                if self._stop.is_set():
                    return
                try:
                    answer = self.client.send(calls.heartbeat(self.task_id, self.lease_epoch), retry=policy)
                except BackplaneAPIError as exc:
                    if exc.code in LEASE_LOST_CODES or exc.status == 404:
                        self._mark_lost(exc)
                        return
                    logger.warning("heartbeat for task %s refused: %s", self.task_id, exc)
                except (httpx.HTTPError, ValueError) as exc:
                    logger.warning("heartbeat for task %s got no answer: %r", self.task_id, exc)
                else:
                    self.expires_at = answer["expires_at"]
                    self.heartbeats += 1

    def _mark_lost(self, error: BackplaneAPIError) -> None:
        if not self._lost.is_set():
            self._lost_error = error
            self._lost.set()
            self._stop.set()
            logger.warning("lease on task %s (epoch %d) lost: %s", self.task_id, self.lease_epoch, error)

    def _check_held(self) -> None:
        if self._lost.is_set():
            raise LeaseLost.before_sending(self.task_id, self._lost_error, "the lease was lost")
        if self._ended is not None:
            raise LeaseLost.before_sending(self.task_id, None, f"this session already {self._ended} the task")

    def _write(self, send: Callable[[], T]) -> T:
        """Send a write under the lease; a refusal as stale marks the session lost."""
        self._check_held()
        try:
            return send()
        except LeaseLost as exc:
            self._mark_lost(exc)
            raise

    def _end(self, how: str, send: Callable[[], T]) -> T:
        with self._ending:
            answer = self._write(send)
            self._ended = how
            self._stop.set()
        return answer

    # --- what is already done ---------------------------------------------------------------

    def context(self) -> JSON:
        """The recovery context (``GET /tasks/{id}/recovery-context/``), read on first use and kept."""
        if self._context is None:
            self._context = self.client.send(calls.recovery_context(self.task_id))
        return self._context

    def refresh_context(self) -> JSON:
        """Read the recovery context again (after other agents or sub-agents wrote to the task)."""
        self._context = None
        return self.context()

    @property
    def attempt(self) -> int:
        """Which attempt at the task this is (1 for the first holder), from the context or the task."""
        if self._context is not None:
            return int(self._context["attempt"])
        return int(self.task.get("attempts") or 0) + 1

    def step_done(self, step: int) -> bool:
        """Whether reasoning step ``step`` is in the log (the context's ``completed_steps``)."""
        return step in self._steps_done or any(s["step"] == step for s in self.context()["completed_steps"])

    def tool_result(self, step: int, tool: str) -> JSON | None:
        """The recorded answer of the call of ``tool`` at ``step``, as ``{"status", "result",
        "idempotency_key"}``, or None while it has none (never made, or in flight)."""
        if (step, tool) in self._answers:
            return dict(self._answers[step, tool])
        for call in self.context()["tool_calls"]:
            if call["step"] == step and call["tool"] == tool and call["status"] in ANSWERED:
                return {"status": call["status"], "result": call["result"], "idempotency_key": call["idempotency_key"]}
        return None

    def subtask_of(self, step: int, kind: str) -> JSON | None:
        """The context's entry for the sub-agent dispatched at ``step`` for ``kind``
        (``child_task_id``, ``dispatch_key``, ``status``, ``output``, ``error``), or None."""
        for entry in self.context()["subtasks"]:
            if entry.get("step") == step and entry.get("kind") == kind:
                return dict(entry)
        return None

    # --- writes ---------------------------------------------------------------------------

    def append(
        self, type: str, payload: Mapping[str, Any] | None = None, *, idempotency_key: str | None = None,
        **event_fields: Any,
    ) -> JSON:
        """Append one event under the lease (``event_fields``: ``expected_seq``, ``lamport``,
        ``causation_id``, ``correlation_id``, ``trace_id``, ``outbox``). Without a key the
        client generates one, so only this call's retries are deduplicated: pass a key derived
        from the task and step to make a repeat by a later attempt harmless too."""
        return self._write(lambda: self.client.send(calls.append(
            self.task_id, type, payload, idempotency_key=idempotency_key, lease_epoch=self.lease_epoch,
            **event_fields,
        )))

    def reason(self, step: int, payload: Mapping[str, Any]) -> JSON | None:
        """Log reasoning step ``step`` (``ReasoningStepCompleted``), keyed ``{task_id}:reasoning:{step}``.

        Returns None, sending nothing, when the step is already in the log: a model asked again
        after a crash rarely says the same words, and the log keeps the first answer.
        """
        if "step" in payload and payload["step"] != step:
            raise ValueError(f"payload says step {payload['step']!r}, the call says {step}")
        if self.step_done(step):
            return None
        event = self.append("ReasoningStepCompleted", {"step": step, **payload},
                            idempotency_key=self._reasoning_key(step))
        self._steps_done.add(step)
        return event

    def recorded_step(self, step: int) -> JSON | None:
        """The payload of reasoning step ``step`` as the log holds it, or None when it is not there."""
        if step in self._step_payloads:
            return dict(self._step_payloads[step])
        for entry in self.context()["completed_steps"]:
            if entry["step"] == step:
                return dict(entry["payload"])
        return None

    def resume(self, step: int, think: Callable[[], Mapping[str, Any]]) -> JSON:
        """Reasoning step ``step``, decided once across every attempt at the task.

        When an earlier attempt recorded the step, its payload comes back from the log and
        ``think`` is not called: a model asked again after a crash rarely gives the same answer,
        and what happened next was built on the first one. Otherwise ``think()`` decides, the
        decision is logged (``ReasoningStepCompleted``, keyed like :meth:`reason`) and returned.
        """
        known = self.recorded_step(step)
        if known is not None:
            return known
        payload: JSON = {**think(), "step": step}
        if self.reason(step, payload) is None:
            # Recorded meanwhile (the context was older than the log): the log's answer stands.
            self.refresh_context()
            return self.recorded_step(step) or payload
        self._step_payloads[step] = payload
        return dict(payload)

    def recorded_model_call(self, step: int) -> JSON | None:
        """The model call the task's history holds for ``step`` (the context's ``model_calls``
        entry: ``seq``, ``task_id``, ``step``, ``model``, ``prompt_sha256``, ``output``,
        ``usage``), or None. With several, the first: that is the decision the rest was built on."""
        if step in self._model_calls:
            return dict(self._model_calls[step])
        for entry in self.context()["model_calls"]:
            if entry["step"] == step:
                return dict(entry)
        return None

    def model_call(self, step: int, model: str, prompt: Any, call: ModelFunction, *,
                   provider: str | None = None) -> Any:
        """The model's output for step ``step``, decided once across every attempt at the task.

        When the task's history (a fork's includes its source's, up to the fork point) already
        has a model call at this step, its recorded output comes back and ``call`` is not run: a
        model asked again rarely says the same, and what happened next was built on the first
        answer. Otherwise ``call(prompt)`` asks the model and must return a
        :class:`~backplane_client.usage.ModelAnswer`, ``{"output": <any JSON>, "usage": {...},
        "cost": {...}}`` (``usage`` and ``cost`` optional; :func:`~backplane_client.usage.usage_from_openai`
        and :func:`~backplane_client.usage.usage_from_anthropic` read ``usage`` off a provider's
        answer); the call is recorded by :meth:`record_model_call` and the output that stands
        returned.

        ``prompt`` is any JSON (a string, a list of messages, ...): its hash is always recorded,
        the prompt itself unless its canonical JSON is over 64 KiB. A crash between the model's
        answer and the record loses that answer (the next attempt asks again), never a decision
        the task went on with.
        """
        known = self.recorded_model_call(step)
        if known is not None:
            return known["output"]
        answer, provenance = self._ask_model(step, model, prompt, call)
        if not isinstance(answer, Mapping) or "output" not in answer:
            raise TypeError(f"the model call at step {step} must return {{'output': ..., 'usage': {{...}}}}, "
                            f"not {answer!r:.200}")
        payload = llm_called_payload(step=step, model=model, prompt=prompt, output=answer["output"],
                                     usage=answer.get("usage"), provider=provider, cost=answer.get("cost"))
        return self._record_llm_called(step, payload | provenance)["payload"]["output"]

    def record_model_call(
        self, step: int, model: str, prompt: Any, output: Any, *, usage: Usage | Mapping[str, int] | None = None,
        provider: str | None = None, cost: Cost | Mapping[str, str] | None = None,
    ) -> JSON:
        """Record a model call the agent made itself as ``LLMCalled`` (keyed
        ``{task_id}:llm:{step}``, see :func:`llm_called_payload`) and return the event as the log
        holds it.

        ``usage`` is our usage dict (:mod:`backplane_client.usage`: take it from
        :func:`~backplane_client.usage.usage_from_openai` or
        :func:`~backplane_client.usage.usage_from_anthropic`, never a provider's usage as it
        comes); ``cost`` a provider-reported price (:func:`~backplane_client.usage.model_cost`).

        The returned event's ``payload["cost"]`` is the cost as the server settled it: the one
        reported, else the price table's, else ``"source": "unpriced"``.

        A step is recorded once per task. Recording it again with the same payload returns the
        first event; with another one (an earlier attempt recorded a different answer) nothing is
        written and the earlier event comes back: its ``payload["output"]`` is the answer the task
        went on with, and this call's tokens go unrecorded. The history is not consulted: ask
        :meth:`recorded_model_call` before calling the model, which is what :meth:`model_call` does.
        """
        payload = llm_called_payload(step=step, model=model, prompt=prompt, output=output, usage=usage,
                                     provider=provider, cost=cost)
        return self._record_llm_called(step, payload)

    def _record_llm_called(self, step: int, payload: JSON) -> JSON:
        """Append ``payload`` as the step's ``LLMCalled``; the event the log keeps under the key."""
        key = self._model_call_key(step)
        try:
            event = self.append("LLMCalled", payload, idempotency_key=key)
        except BackplaneAPIError as exc:
            seq = exc.details.get("seq") if exc.code == "idempotency_mismatch" else None
            if not isinstance(seq, int):
                raise
            # Recorded meanwhile with another answer (the context was older than the log, or the
            # agent asked again): the log's answer stands, as in resume. The refusal names its seq.
            event = self.client.send(calls.events(self.task_id, after_seq=seq - 1, limit=1))["results"][0]
            if event.get("idempotency_key") != key:
                raise
        recorded = event["payload"]
        self._model_calls[step] = {"seq": event["seq"], "task_id": self.task_id, "step": step,
                                   "model": recorded["model"], "prompt_sha256": recorded["prompt_sha256"],
                                   "output": recorded["output"], "usage": recorded.get("usage")}
        return event

    def _ask_model(self, step: int, model: str, prompt: Any, call: ModelFunction) -> tuple[Mapping[str, Any], JSON]:
        """The answer for a step the history has no model call for, and what its ``LLMCalled``
        adds about where it came from (a replay answering from a record says so)."""
        return call(prompt), {}

    def _model_call_key(self, step: int) -> str:
        return f"{self.task_id}:llm:{step}"

    @property
    def resume_prompt(self) -> str:
        """The recovery context's ``resume_prompt``: where the task stands, for the model."""
        return str(self.context()["resume_prompt"])

    def _reasoning_key(self, step: int) -> str:
        return f"{self.task_id}:reasoning:{step}"

    @contextmanager
    def tool_call(
        self, step: int, tool: str, input: Mapping[str, Any], *, compensation: Mapping[str, Any] | None = None,
        reason: str | None = None, wait: bool = True, approval_timeout: float = 3600.0,
    ) -> Iterator[ToolCall]:
        """Make a tool call at most once across attempts: record it, make it if needed, record the answer.

        Entering dispatches the call to the idempotency proxy. Inside the block, if
        ``call.needed``, call the tool with ``Idempotency-Key: call.effect_key`` and set the outcome.
        Leaving normally records it (``POST /tool-calls/{key}/result/``); ``call.status`` and
        ``call.result`` then hold the recorded answer (a ``failed`` one does not raise). An
        exception in the block records nothing: the call stays in flight, and a later attempt
        is told to make it again with the same key.

        A call a tool policy gates (docs/approvals.md) waits first, with ``wait``, for people's
        decision (``reason`` is shown to them), up to ``approval_timeout`` seconds, while the
        heartbeat keeps the lease: granted, it is made as above; denied or expired, entering
        raises :class:`~backplane_client.errors.ApprovalDenied` or ``ApprovalExpired``. Without
        ``wait``, or once the timeout is spent, it raises
        :class:`~backplane_client.errors.AwaitingApproval`; the same call later finds the same request.
        """
        answer = self._dispatch_approved(lambda: self._write(lambda: self.client.send(calls.dispatch_tool_call(
            self.task_id, step, tool, input, lease_epoch=self.lease_epoch, compensation=compensation,
            reason=reason,
        ))), wait=wait, timeout=approval_timeout)
        call = ToolCall(step=step, tool=tool, input=input, answer=answer)
        yield call
        if call.needed:
            status, result = call.outcome()
            record = self._write(lambda: self.client.send(calls.record_tool_result(
                call.key, status, result, lease_epoch=self.lease_epoch,
            )))
            call.recorded(record)
        self._answers[step, tool] = {"status": call.status, "result": call.result, "idempotency_key": call.key}

    def call_tool(
        self,
        step: int,
        tool: str,
        input: Mapping[str, Any],
        fn: ToolFunction,
        *,
        compensation: Mapping[str, Any] | None = None,
        reason: str | None = None,
        wait: bool = True,
        approval_timeout: float = 3600.0,
    ) -> ToolCall:
        """:meth:`tool_call` as a function: ``fn(effect_key, input)`` runs only when the call needs
        making; send the key as the tool's ``Idempotency-Key``.

        Its return value is recorded as the success; :class:`ToolCallFailed` raised in ``fn``
        is recorded as the failure (``call.status == "failed"``); any other exception propagates
        and records nothing. A gated call waits for approval as in :meth:`tool_call`.
        """
        with self.tool_call(step, tool, input, compensation=compensation, reason=reason, wait=wait,
                            approval_timeout=approval_timeout) as call:
            if call.needed:
                try:
                    call.succeeded(fn(call.effect_key, dict(input)))
                except ToolCallFailed as refusal:
                    call.failed(refusal.result)
        return call

    def invoke(self, step: int, tool: str, input: Mapping[str, Any], *, reason: str | None = None,
               wait: bool = True, approval_timeout: float = 3600.0) -> JSON:
        """Have the backplane's gateway call the registered ``tool`` for ``step``:
        ``{"idempotency_key", "status", "result", "replayed"}``; an answered call is not repeated.
        A gated call waits for people's decision as in :meth:`tool_call`."""
        answer = self._dispatch_approved(lambda: self._write(lambda: self.client.send(calls.invoke(
            self.task_id, tool, step, input, lease_epoch=self.lease_epoch, reason=reason,
        ))), wait=wait, timeout=approval_timeout)
        if answer["status"] in ANSWERED:
            self._answers[step, tool] = {key: answer[key] for key in ("status", "result", "idempotency_key")}
        return answer

    def wait_for_signal(self, name: str, *, timeout: float = 3600.0) -> JSON:
        """Wait durably for the signal ``name`` (docs/approvals.md, "Signals") and return its
        payload. The wait is recorded in the task's log, so the next attempt after a crash waits
        for the same signal (or finds it, sent meanwhile); the stall detector leaves the task
        alone while it waits. Raises :class:`TimeoutError` when its time runs out."""
        self._write(lambda: self.client.send(calls.await_signal(
            self.task_id, name, max(1, int(timeout)), lease_epoch=self.lease_epoch)))
        while True:
            self._check_held()
            signal = self.client.send(calls.get_signal(self.task_id, name, wait=APPROVAL_WAIT_SECONDS))
            if signal["status"] == "received":
                payload: JSON = signal["payload"]
                return payload
            if signal["status"] == "timed_out":
                raise TimeoutError(f"task {self.task_id}: no signal {name!r} came in time")

    def _dispatch_approved(self, dispatch: Callable[[], JSON], *, wait: bool, timeout: float) -> JSON:
        """``dispatch()``'s answer once it is no longer ``awaiting_approval``: the request is read
        with ``wait`` (the server answers as soon as it is decided) until it is, then the same
        dispatch is sent again, which makes the call or raises the refusal."""
        answer = dispatch()
        deadline = time.monotonic() + timeout
        while answer.get("status") == AWAITING_APPROVAL:
            left = deadline - time.monotonic()
            if not wait or left <= 0:
                raise AwaitingApproval(answer)
            self._check_held()
            request = self.client.send(calls.get_approval(answer["approval_id"],
                                                          wait=max(1, min(APPROVAL_WAIT_SECONDS, int(left)))))
            if request["status"] != "pending":
                answer = dispatch()
        return answer

    def subtask(self, step: int, kind: str, input: Mapping[str, Any]) -> JSON:
        """Hand ``input`` to a sub-agent of ``kind``: the child Task. A repeat for the same step
        and kind (a later attempt, a retry) returns the same child."""
        answer = self._write(lambda: self.client.send(calls.dispatch_subtask(
            self.task_id, step, kind, input, lease_epoch=self.lease_epoch,
        )))
        self._context = None  # the dispatch is in the log now; the next read must see it
        child: JSON = answer["task"]
        return child

    def wait_for_subtask(self, child_task_id: TaskId, *, timeout: float = 60.0, poll: float = 0.2) -> JSON:
        """Wait until the child's result is in this task's log and return its context entry
        (``child_task_id``, ``kind``, ``step``, ``status``, ``output``, ``error``).

        The heartbeat keeps the lease meanwhile. Raises :class:`TimeoutError` after ``timeout``
        seconds, and :class:`LeaseLost` as soon as the lease is lost (the new holder waits now).
        The server stalls a task that heartbeats without writing for
        ``BACKPLANE_NO_PROGRESS_STALL_SECONDS`` (30 min by default): keep waits below that.
        """
        child = str(child_task_id)
        deadline = time.monotonic() + timeout
        entry: JSON | None = None
        while True:
            self._check_held()
            # The child's row is cheap to read; the recovery context replays this task's log.
            # Once the child has left pending/running, its result is in this log (written in the
            # child's finishing transaction), so the context is read then, and only then.
            if self.client.send(calls.get_task(child))["status"] not in ("pending", "running"):
                entry = next((s for s in self.refresh_context()["subtasks"] if s["child_task_id"] == child), None)
                if entry is not None and entry["status"] in TERMINAL_SUBTASK:
                    return dict(entry)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                status = entry["status"] if entry is not None else "not dispatched"
                raise TimeoutError(f"sub-agent task {child} of task {self.task_id} still {status} after {timeout} s")
            self._lost.wait(min(poll, remaining))

    # --- the end --------------------------------------------------------------------------

    def complete(self, output: Mapping[str, Any], *, reasoning: Mapping[str, Any] | None = None) -> JSON:
        """Complete the task (``TaskCompleted``, keyed ``{task_id}:completed``) and return that event.

        ``reasoning`` (a payload with an integer ``step``) is logged as a final
        ``ReasoningStepCompleted`` in the same batch, all or nothing, unless that step is
        already in the log. Stops the heartbeat: the lease ends with the task.
        """
        events = []
        if reasoning is not None:
            step = reasoning.get("step")
            if not isinstance(step, int):
                raise ValueError("reasoning needs an integer 'step'")
            if not self.step_done(step):
                events.append(event_draft("ReasoningStepCompleted", reasoning,
                                          idempotency_key=self._reasoning_key(step)))
        events.append(event_draft("TaskCompleted", {"output": dict(output)},
                                  idempotency_key=f"{self.task_id}:completed"))
        written = self._end("completed", lambda: self.client.send(calls.append_batch(
            self.task_id, events, lease_epoch=self.lease_epoch,
        )))
        return written[-1]

    def fail(self, error: str, *, retryable: bool) -> JSON:
        """Give up this attempt (``TaskFailed``, keyed ``{task_id}:failed:{attempt}``) and return
        that event. ``retryable`` with attempts left puts the task back to ``pending`` (counted);
        otherwise it fails for good. Stops the heartbeat."""
        key = f"{self.task_id}:failed:{self.attempt}"
        return self._end("failed", lambda: self.client.send(calls.append(
            self.task_id, "TaskFailed", {"error": error, "retryable": retryable}, idempotency_key=key,
            lease_epoch=self.lease_epoch,
        )))

    def release(self) -> JSON:
        """Hand the task back to ``pending`` without counting an attempt (shutting down, say);
        returns the Task. Stops the heartbeat."""
        return self._end("released", lambda: self.client.send(calls.release(self.task_id, self.lease_epoch)))
