"""How each destination is delivered to: its lane, deadline, concurrency, retry schedule and
ordering (docs/delivery.md).

A destination is the broker or one webhook subscription. Each is a lane of its own: the relay
claims, delivers and retries per lane, so one slow or dead destination never holds up another.
The broker's policy comes from the ``BACKPLANE_OUTBOX_*`` settings; a subscription's from its
fields, where an empty retry field takes the setting of the same name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from django.conf import settings

from backplane.delivery.models import Ordering, WebhookSubscription

# The lane of the broker; a webhook subscription's lane is its id.
BROKER_LANE = None
Lane = int | None


@dataclass(frozen=True)
class RetrySchedule:
    """Exponential backoff with jitter: after failed attempt ``n`` the next one is due after a
    delay drawn from [c/2, c], c = min(max_delay, base * 2**(n-1)) ("equal jitter": rows that
    failed together spread out, yet none comes back sooner than half its step). The attempt
    that reaches ``max_attempts`` and fails makes the message a dead letter."""

    max_attempts: int
    base_seconds: float
    max_delay_seconds: float

    def ceiling(self, attempts: int) -> float:
        return float(min(self.max_delay_seconds, self.base_seconds * 2 ** max(0, attempts - 1)))

    def delay_after(self, attempts: int) -> float:
        ceiling = self.ceiling(attempts)
        return random.uniform(ceiling / 2, ceiling)

    def window_seconds(self) -> tuple[float, float]:
        """From the first attempt to the last: the shortest and longest the jitter allows."""
        total = sum(self.ceiling(n) for n in range(1, self.max_attempts))
        return total / 2, total


def default_retry_schedule() -> RetrySchedule:
    return RetrySchedule(
        max_attempts=settings.BACKPLANE_OUTBOX_MAX_ATTEMPTS,
        base_seconds=settings.BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS,
        max_delay_seconds=settings.BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS,
    )


@dataclass(frozen=True)
class LanePolicy:
    lane: Lane
    name: str  # "broker" or the subscription's name, for logs
    ordering: str  # an Ordering value
    retry: RetrySchedule
    timeout_seconds: float  # the deadline of one publish or POST
    concurrency: int  # deliveries in flight at once, per relay process

    @property
    def strict(self) -> bool:
        return self.ordering == Ordering.STRICT

    @property
    def lease_seconds(self) -> float:
        """How long a claim lasts: the setting, and never shorter than one delivery plus slack."""
        return max(float(settings.BACKPLANE_OUTBOX_CLAIM_SECONDS), self.timeout_seconds + LEASE_SLACK_SECONDS)

    def claim_size(self, batch_size: int) -> int:
        """Rows per claim. The broker takes whole batches (a publish takes a millisecond);
        a webhook takes what a lease covers at its deadline, so a hanging endpoint holds few
        messages and the destination's other threads find work too."""
        if self.lane is BROKER_LANE:
            return batch_size
        return max(1, min(batch_size, int(settings.BACKPLANE_OUTBOX_CLAIM_SECONDS // self.timeout_seconds)))


# A claim must outlast the delivery under way by this much (the record step after it).
LEASE_SLACK_SECONDS = 2.0


def broker_policy() -> LanePolicy:
    return LanePolicy(
        lane=BROKER_LANE,
        name="broker",
        ordering=settings.BACKPLANE_OUTBOX_BROKER_ORDERING,
        retry=default_retry_schedule(),
        timeout_seconds=float(settings.BACKPLANE_OUTBOX_BROKER_TIMEOUT_SECONDS),
        concurrency=settings.BACKPLANE_OUTBOX_BROKER_CONCURRENCY,
    )


def webhook_policy(subscription: WebhookSubscription) -> LanePolicy:
    defaults = default_retry_schedule()
    return LanePolicy(
        lane=subscription.pk,
        name=subscription.name,
        ordering=subscription.ordering,
        retry=RetrySchedule(
            max_attempts=subscription.max_attempts or defaults.max_attempts,
            base_seconds=(defaults.base_seconds if subscription.retry_base_seconds is None
                          else subscription.retry_base_seconds),
            max_delay_seconds=subscription.retry_max_delay_seconds or defaults.max_delay_seconds,
        ),
        timeout_seconds=float(max(1, subscription.timeout_seconds)),
        concurrency=max(1, subscription.max_concurrency),
    )
