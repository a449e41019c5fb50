"""When to send a request again, and how long to wait first.

A retry is only safe if sending the same request twice cannot do the work twice. The clients
make every write they retry safe before the first attempt (docs/sdk.md has the table):

- ``append``/``append_batch`` give each event an idempotency key (a uuid4, generated once per
  call, reused on every attempt), so a retry after a lost answer gets the original event back
  (``200`` and ``Idempotent-Replay: true``) instead of a second one;
- ``create_task`` picks the task id on the client, once, so a retry finds the same task;
- tool-call dispatch and results, sub-agent dispatch, heartbeat, release and invoke are keyed
  by the contract itself (the step, the tool, the epoch).

``claim`` is the exception: the server cannot tell a repeated claim from a new one, so a claim
whose answer was lost and is then retried may lease a second task. The first lease is not
lost work: nobody heartbeats it, it expires, and the stall detector hands the task on (one
attempt counted). Pass ``RetryPolicy.none()`` to a client used for claims if that matters.

This module decides; the clients (sync and async) only send and sleep, so both retry alike.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx

from backplane_client.calls import Call
from backplane_client.errors import retry_after_of

__all__ = ["DEFAULT_RETRY", "RetryPolicy"]

logger = logging.getLogger("backplane_client")

#: Answers that say "not now" rather than "no": rate limited, unavailable (database down, an
#: open circuit). The contract guarantees that a request answered with an error changed nothing.
RETRY_STATUSES = frozenset({429, 503})
#: A ``Retry-After`` up to this many seconds is always waited out in full, even past
#: ``max_delay``: retrying earlier would only be refused again. A longer one is capped.
HONOURED_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often to send a request (``attempts`` in all, the first included) and how to back off.

    Between attempts the wait is "full jitter" exponential backoff: a uniform random time in
    ``[0, min(max_delay, base_delay * 2 ** (attempt - 1))]``, so that agents that failed
    together (a restart, a network blip) do not all come back in the same instant. With
    ``jitter=False`` the wait is the upper bound itself. A 429 or 503 that carries
    ``Retry-After`` waits that long instead (see :data:`HONOURED_RETRY_AFTER`).
    """

    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 10.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts counts the first request too: it must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("delays must not be negative")

    @classmethod
    def none(cls) -> RetryPolicy:
        """Send every request once; errors reach the caller at once."""
        return cls(attempts=1)

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** min(attempt - 1, 62))
        return random.uniform(0.0, ceiling) if self.jitter else ceiling

    def delay_after_answer(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before sending again after this answer, or None: the answer is final."""
        if response.status_code not in RETRY_STATUSES or attempt >= self.attempts:
            return None
        retry_after = retry_after_of(response)
        if retry_after is None:
            return self.backoff(attempt)
        if retry_after <= HONOURED_RETRY_AFTER:
            # A little jitter on top, never below: the server said "not before".
            return retry_after + (random.uniform(0.0, self.base_delay) if self.jitter else 0.0)
        return min(retry_after, self.max_delay)

    def delay_after_error(self, attempt: int, error: httpx.TransportError) -> float | None:
        """Seconds to wait before sending again after no answer came, or None: give up.

        Refused connections, timeouts, resets and a server that closed the connection without
        answering are retried. A request httpx could not even form (an unsupported scheme, a
        malformed header) would fail the same way again, so it is not.
        """
        if attempt >= self.attempts or isinstance(error, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
            return None
        return self.backoff(attempt)


DEFAULT_RETRY = RetryPolicy()


def log_retry(call: Call[Any], attempt: int, delay: float, why: str) -> None:
    logger.info("%s %s: %s (attempt %d); retrying in %.2f s", call.method, call.url, why, attempt, delay)


def gave_up(error: httpx.TransportError, attempt: int) -> httpx.TransportError:
    """The last transport error, with a note saying how often the request was sent."""
    error.add_note(f"backplane_client: no answer after {attempt} attempt(s)")
    return error
