"""Replay an agent against a task's record, in a sandbox, and see where it drifts (docs/replay.md).

:func:`replay` forks a *sandbox* of the source task (``POST /tasks/{id}/fork/`` with ``sandbox:
true``), claims it by its id, runs your agent function on it with a :class:`ReplaySession`, and
asks the backplane where the sandbox's history drifts from the source's
(``GET /tasks/{source}/diff/{sandbox}/``).

What answers what in a sandbox:

- tool calls and sub-agent hand-offs: the *server*, from the source's record (with the
  ``tool_answers`` edits). Nothing unrecorded is ever sent to a tool: the server refuses it
  (``409 sandbox_refused``, raised as :class:`~backplane_client.errors.SandboxRefused`), and no
  client-side switch can change that. ``call_tool``'s function is never run, because every
  call the server lets through is already answered;
- model calls (:meth:`~backplane_client.TaskSession.model_call`): with ``models="recorded"``,
  the source's recorded ``LLMCalled`` for the same step, and the model is never called; with
  ``models="live"``, the model, as in production. Either way the sandbox records its own
  ``LLMCalled`` with the prompt *it* built, so a changed prompt is a divergence in the diff.

The module is named for where the replay runs, not ``replay``: that name is the function's on
the package (``from backplane_client import replay``), and a submodule of the same name would
take its place there once imported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx

from backplane_client.calls import JSON, Lease, TaskId
from backplane_client.errors import BackplaneAPIError
from backplane_client.session import ModelFunction, TaskSession

if TYPE_CHECKING:
    from backplane_client.agent import AgentClient

__all__ = ["ModelCallNotRecorded", "ReplayResult", "ReplaySession", "replay"]

logger = logging.getLogger("backplane_client")

Models = Literal["recorded", "live"]


class ModelCallNotRecorded(LookupError):
    """A replay in ``models="recorded"`` mode asked for a model call at a step the source never
    recorded one for; recorded mode never calls a model (use ``models="live"``)."""

    def __init__(self, *, step: int, source_task_id: str) -> None:
        self.step = step
        self.source_task_id = source_task_id
        super().__init__(f"task {source_task_id} recorded no model call at step {step}, and a replay with "
                         "recorded models never calls the model")


@dataclass(frozen=True)
class ReplayResult:
    """What a replay found: the sandbox it ran in, the first event (and field) where its history
    differs from the source's, the diff's counts (``same``, ``changed``, ``only_in_a``,
    ``only_in_b``; a is the source), and the exception the agent function ended with, if any."""

    sandbox_task_id: str
    first_divergence: JSON | None
    counts: dict[str, int]
    error: Exception | None = None

    @property
    def drifted(self) -> bool:
        """Whether the replay did anything the source did not (or left out anything it did)."""
        return self.first_divergence is not None


class ReplaySession(TaskSession):
    """The session a replay hands the agent function: a :class:`TaskSession` on the sandbox whose
    model calls, in recorded mode, are answered from the source's ``LLMCalled`` events.

    ``recorded_models`` maps a step to the source's model call there (its recovery context's
    ``model_calls`` entry); None means live mode.
    """

    def __init__(
        self,
        client: AgentClient,
        lease: Lease,
        *,
        source_task_id: str,
        recorded_models: Mapping[int, JSON] | None,
        heartbeat_interval: float | None = None,
    ) -> None:
        super().__init__(client, lease, heartbeat_interval=heartbeat_interval)
        self.source_task_id = source_task_id
        self.recorded_models = None if recorded_models is None else dict(recorded_models)

    def _ask_model(self, step: int, model: str, prompt: Any, call: ModelFunction) -> tuple[Mapping[str, Any], JSON]:
        if self.recorded_models is None:
            return call(prompt), {}
        recorded = self.recorded_models.get(step)
        if recorded is None:
            raise ModelCallNotRecorded(step=step, source_task_id=self.source_task_id)
        # The recorded usage too, and a cost the provider reported (the server settles any other
        # one itself, from its price table): a diff compares the answer as recorded.
        # ``recorded_from`` says it was served, not spent again (the diff leaves it out: it names
        # another task).
        answer: JSON = {"output": recorded["output"]}
        if recorded.get("usage") is not None:
            answer["usage"] = recorded["usage"]
        cost = recorded.get("cost")
        if isinstance(cost, Mapping) and cost.get("source") == "provider":
            answer["cost"] = {"amount": cost["amount"], "currency": cost["currency"]}
        return answer, {"recorded_from": {"task_id": recorded["task_id"], "seq": recorded["seq"]}}


def recorded_model_calls(context: Mapping[str, Any]) -> dict[int, JSON]:
    """The model calls of a recovery context by step (the first one of a step: the decision)."""
    by_step: dict[int, JSON] = {}
    for entry in context["model_calls"]:
        step = entry.get("step")
        if isinstance(step, int) and step not in by_step:
            by_step[step] = dict(entry)
    return by_step


def replay(
    client: AgentClient,
    source_task_id: TaskId,
    agent_fn: Callable[[TaskSession], Any],
    *,
    models: Models = "recorded",
    tool_answers: Sequence[Mapping[str, Any]] | None = None,
    input: Mapping[str, Any] | None = None,
    at_seq: int = 1,
    reason: str = "sandbox replay",
    lease_seconds: int = 60,
) -> ReplayResult:
    """Run ``agent_fn`` on a sandbox fork of ``source_task_id`` and report where it drifts.

    1. The source's recorded model calls are read (recorded mode), then the sandbox is forked
       after the source's event ``at_seq`` (1: the whole run is replayed; later: the history up
       to there is the sandbox's, and only the rest is run again), with ``input`` replacing the
       source's and ``tool_answers`` (``[{"step", "tool", "status", "result"}]``) editing its record.
    2. It is claimed by id (the agent ``client`` authenticates as must be allowed its kind) and
       ``agent_fn(session)`` runs on it: the same function the agent runs in production.
    3. The diff of the source (a) and the sandbox (b) is read. An exception from ``agent_fn``
       (a :class:`~backplane_client.errors.SandboxRefused` for a step the record cannot answer,
       a :class:`ModelCallNotRecorded`, a bug) is not raised: it is the result's ``error``.
    4. A sandbox the function left open is failed (not retryable), after the diff was read: a
       sandbox is never handed to another agent, so it would otherwise wait for ever.
    """
    if models not in ("recorded", "live"):
        raise ValueError(f"models must be 'recorded' or 'live', not {models!r}")
    source = str(source_task_id)
    recorded = recorded_model_calls(client.recovery_context(source)) if models == "recorded" else None
    sandbox = client.fork(source, at_seq=at_seq, reason=reason, input=input, sandbox=True, tool_answers=tool_answers)
    sandbox_id = str(sandbox["task_id"])
    lease = client.claim(task_id=sandbox_id, lease_seconds=lease_seconds)
    if lease is None:
        raise RuntimeError(f"sandbox {sandbox_id} could not be claimed: the agent may not claim tasks of kind "
                           f"{sandbox['kind']!r}")
    error: Exception | None = None
    with ReplaySession(client, lease, source_task_id=source, recorded_models=recorded) as session:
        try:
            agent_fn(session)
        except Exception as exc:  # noqa: BLE001 (whatever ended the replay is its result, not a crash of ours)
            error = exc
        drift = client.diff(source, sandbox_id)
        if session.ended is None and not session.lost:
            _close(session, error)
    return ReplayResult(sandbox_task_id=sandbox_id, first_divergence=drift["first_divergence"],
                        counts=dict(drift["counts"]), error=error)


def _close(session: TaskSession, error: Exception | None) -> None:
    why = f"replay ended: {error!r}" if error is not None else "replay ended without completing or failing the task"
    try:
        session.fail(why[:1000], retryable=False)
    except (BackplaneAPIError, httpx.HTTPError) as exc:
        # Left as it is, the sandbox's lease runs out and the stall detector takes it back.
        logger.warning("could not close sandbox %s: %s", session.task_id, exc)
