"""The event log's tables: agents, the task projection and the append-only events.

They belong to the ``backplane`` app (``backplane/models.py`` imports them), so their tables,
migrations and permissions kept their names when the modules moved here.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from backplane.eventlog.chain import GENESIS_HASH

NAME_VALIDATOR = RegexValidator(
    r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$",
    "letters, digits, '.', '_' and '-', starting with a letter or digit (at most 100)",
)


LAST_SEEN_RESOLUTION_SECONDS = 30


ACTOR_MAX_LENGTH = 100  # Event.agent, Task.created_by


def user_actor(user: Any) -> str:
    """How a person is named where the log records who acted (an event's ``agent``, a decision's
    ``decided_by``): ``user:<username>``, cut to the column's length (usernames may be longer)."""
    return f"user:{user.get_username()}"[:ACTOR_MAX_LENGTH]


def hash_token(token: str) -> str:
    """Agent tokens are 256-bit random strings, so a plain SHA-256 is a sufficient at-rest hash."""
    return hashlib.sha256(token.encode()).hexdigest()


class Agent(models.Model):
    name = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR], db_index=True)
    kinds = ArrayField(
        models.CharField(max_length=100),
        default=list,
        blank=True,
        help_text="Task kinds this agent may claim; empty means every kind.",
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # A token may act for a staff user (e.g. a dead-letter reviewer bot).
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents"
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When its token last authenticated, to within ``LAST_SEEN_RESOLUTION`` (the dashboard's
    # "last seen"; written at most that often, so a busy agent does not write on every request).
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Circuit breaker (recovery/breakers.py): consecutive failures open it, claims are refused
    # while open, a cool-down half-opens it for one trial claim, a success closes it. While
    # half-open, breaker_opened_at holds when the trial started (so a lost trial can be given up).
    breaker_state = models.CharField(
        max_length=10, choices=[("closed", "closed"), ("open", "open"), ("half_open", "half open")], default="closed"
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    breaker_opened_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="agent_unique_name_per_namespace"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(token))

    def may_claim(self, kind: str) -> bool:
        return not self.kinds or kind in self.kinds


class BreakerTransition(models.Model):
    """Every change of an agent's circuit breaker, for the people who watch the fleet."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="breaker_transitions")
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    reason = models.CharField(max_length=255)
    task_id = models.UUIDField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["agent", "-at"], name="breaker_transition_agent_idx")]

    def __str__(self) -> str:
        return f"{self.agent}: {self.from_state} -> {self.to_state} ({self.reason})"


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"


# No event may be appended once a task is in one of these.
CLOSED_STATUSES = frozenset(
    {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.DEAD_LETTERED, TaskStatus.COMPENSATED,
     TaskStatus.CANCELLED}
)


class Task(models.Model):
    """The projection of a task's events, updated in the same transaction as every append."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    namespace = models.CharField(max_length=100)
    kind = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    input = models.JSONField(default=dict)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    # The fencing token: every new lease increments it, and a write carrying an older one is refused.
    lease_holder = models.CharField(max_length=100, null=True, blank=True)
    lease_epoch = models.PositiveBigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_seconds = models.PositiveIntegerField(default=30)
    # Set on sub-agent tasks: the parent's dispatch, so a repeated dispatch finds the same child.
    dispatch_key = models.CharField(max_length=64, null=True, blank=True, unique=True)
    last_seq = models.PositiveIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default=GENESIS_HASH)
    lamport = models.PositiveBigIntegerField(default=0)
    created_by = models.CharField(max_length=ACTOR_MAX_LENGTH, null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    last_event_at = models.DateTimeField(null=True, blank=True)
    # last_event_at once the task has finished, None while it runs (reducer.TaskState says why).
    finished_last_event_at = models.DateTimeField(null=True, blank=True)
    # A fork (backplane/eventlog/forks.py): the task it was forked from and the seq of the
    # source's log it continues after. Set when the fork is created, like ``parent``, and
    # recorded in its ``TaskForked`` event; the source's events up to there are the fork's
    # history, read from the source, never copied. PROTECT: a source outlives its forks.
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks"
    )
    forked_at_seq = models.PositiveIntegerField(null=True, blank=True)
    # A sandbox fork replays an agent against its source's record: no external tool is called,
    # no message is sent, no compensation runs, fleet agents never claim it, and the fleet's
    # figures leave it out.
    sandbox = models.BooleanField(default=False)

    class Meta:
        indexes = [
            # Claims: oldest pending task of some kinds in a namespace.
            models.Index(
                fields=["namespace", "kind", "created_at"],
                name="task_pending_claim_idx",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["namespace", "status", "created_at"], name="task_ns_status_idx"),
            # The dashboard's task list: newest first, keyset-paginated on (created_at, id),
            # over all namespaces or one status.
            models.Index(fields=["-created_at", "-id"], name="task_created_idx"),
            models.Index(fields=["status", "-created_at", "-id"], name="task_status_created_idx"),
            # The stall detector scans leases that have run out.
            models.Index(
                fields=["lease_expires_at"],
                name="task_lease_expiry_idx",
                condition=Q(lease_holder__isnull=False),
            ),
            # Retention (recovery/retention.py): a namespace's finished tasks (of one kind, for a
            # rule that names one), longest quiet first, read in order up to a LIMIT. On a column
            # only finished tasks have, never on last_event_at: every append moves that one, and
            # an indexed column that moves makes every append a non-HOT update of every index.
            models.Index(
                fields=["namespace", "finished_last_event_at"],
                name="task_retention_idx",
                condition=Q(finished_last_event_at__isnull=False),
            ),
            models.Index(
                fields=["namespace", "kind", "finished_last_event_at"],
                name="task_retention_kind_idx",
                condition=Q(finished_last_event_at__isnull=False),
            ),
            # Finished sandboxes, kept for their own time whatever their namespace's rules say.
            models.Index(
                fields=["finished_last_event_at"],
                name="task_sandbox_retention_idx",
                condition=Q(sandbox=True, finished_last_event_at__isnull=False),
            ),
        ]
        constraints = [
            # A fork names where it continues from, and only a fork does.
            models.CheckConstraint(
                condition=Q(forked_from__isnull=True, forked_at_seq__isnull=True)
                | Q(forked_from__isnull=False, forked_at_seq__gte=1),
                name="task_fork_has_seq",
            ),
            models.CheckConstraint(condition=Q(sandbox=False) | Q(forked_from__isnull=False),
                                   name="task_sandbox_is_a_fork"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.status})"

    @property
    def is_closed(self) -> bool:
        return self.status in CLOSED_STATUSES

    @property
    def is_leased(self) -> bool:
        return self.lease_holder is not None


class Event(models.Model):
    """One immutable entry of a task's log. Database triggers reject UPDATE, DELETE and TRUNCATE."""

    position = models.BigAutoField(primary_key=True)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    agent = models.CharField(max_length=ACTOR_MAX_LENGTH, null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    # Digest of what the client sent under idempotency_key, so a reuse with another body is caught.
    request_digest = models.CharField(max_length=64, null=True, blank=True)
    lamport = models.PositiveBigIntegerField()
    causation_id = models.CharField(max_length=255, null=True, blank=True)
    correlation_id = models.CharField(max_length=255, null=True, blank=True)
    trace_id = models.CharField(max_length=255, null=True, blank=True)
    # The span that wrote the event (W3C, 16 hex), when it was written in a trace: what the
    # backplane's later work on the task (a stall, a recovery) is parented to. Not part of the
    # API or the hash: an id of our own instrumentation, not of what the agent recorded.
    span_id = models.CharField(max_length=16, null=True, blank=True)
    recorded_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "seq"], name="event_unique_seq_per_task"),
            models.UniqueConstraint(
                fields=["task", "idempotency_key"],
                name="event_unique_idempotency_key_per_task",
                condition=Q(idempotency_key__isnull=False),
            ),
            models.CheckConstraint(condition=Q(seq__gte=1), name="event_seq_positive"),
        ]
        indexes = [
            models.Index(fields=["type"], name="event_type_idx"),
            # The dashboard's agent filter: which tasks an agent has claimed. Claims are a
            # small share of events, so the partial index costs other appends nothing.
            models.Index(fields=["agent", "task"], name="event_claims_by_agent_idx", condition=Q(type="TaskClaimed")),
        ]
        # Two more indexes are made by migration 0015 in SQL, as Django cannot declare them:
        # event_payload_search_idx (GIN over the payload's words, the dashboard's payload
        # search) and event_recorded_at_brin (BRIN: events arrive in time order, so a few
        # hundred bytes per block range serve "events in the last hour" without a B-tree).

    def __str__(self) -> str:
        return f"{self.task_id}#{self.seq} {self.type}"


class IdempotentReplay(models.Model):
    """Requests answered from what was already recorded instead of being applied again,
    counted per task, kind of request and minute (the dashboard's "idempotent replays").

    Counted in the database rather than in a process's memory so that every web process
    and the dashboard see the same figure.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+", db_index=False)
    kind = models.CharField(max_length=20)  # event | task_create | tool_call | tool_result
    minute = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "kind", "minute"], name="idempotent_replay_one_row_per_minute"),
        ]
        indexes = [models.Index(fields=["minute"], name="idempotent_replay_minute_idx")]

    def __str__(self) -> str:
        return f"{self.count} {self.kind} replays of {self.task_id} at {self.minute:%Y-%m-%d %H:%M}"


class TokenType(models.TextChoices):
    """What a model's price is per million of: the kinds of token in an ``LLMCalled``'s usage."""

    INPUT = "input"  # input tokens neither read from nor written to the provider's cache
    OUTPUT = "output"  # output tokens other than reasoning
    CACHE_READ = "cache_read"
    CACHE_WRITE = "cache_write"
    REASONING = "reasoning"


class ModelPrice(models.Model):
    """One rate of the versioned price table (backplane/eventlog/costs.py): what a million tokens
    of one type cost with one provider's model, from ``valid_from`` until ``valid_to``.

    A price change is a new row, never an edit of one a cost was computed with: every priced
    event names its ``version``, so history is never rewritten. Loaded from the prices file at
    start (``manage.py load_prices``, insert-only) and edited in the admin.
    """

    provider = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    token_type = models.CharField(max_length=20, choices=TokenType.choices)
    per_million = models.DecimalField(max_digits=18, decimal_places=6,
                                      help_text="Price of a million tokens of this type.")
    currency = models.CharField(max_length=3, default="USD")
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True, help_text="Blank: until a later version.")
    version = models.CharField(max_length=100, help_text="Named on every cost computed with this rate.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "model", "token_type", "valid_from"],
                                    name="model_price_one_rate_per_start"),
            models.CheckConstraint(condition=Q(per_million__gte=0), name="model_price_not_negative"),
            models.CheckConstraint(condition=Q(valid_to__isnull=True) | Q(valid_to__gt=models.F("valid_from")),
                                   name="model_price_valid_range"),
        ]
        indexes = [models.Index(fields=["provider", "model", "-valid_from"], name="model_price_lookup_idx")]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} {self.token_type}: {self.per_million} {self.currency}/M ({self.version})"


# The start of time, for rollups that are not kept by the hour (a task's, a tree's).
ALL_TIME = "1970-01-01T00:00:00+00:00"


class CostRollup(models.Model):
    """Tokens and cost of model calls, summed per scope (a task, a task with its sub-agents, an
    agent, a model, a namespace) and hour, by the event writer in the transaction of each
    ``LLMCalled`` (backplane/eventlog/costs.py), so they always equal the sum of the events.

    Rows of shared scopes are split in ``SHARDS`` by task, so appends to different tasks do not
    queue on one row; a reader sums the shards. A task's and a tree's rows are one per currency
    (``hour`` is ``ALL_TIME``): read in O(1).
    """

    scope = models.CharField(max_length=16)
    key = models.CharField(max_length=320)
    hour = models.DateTimeField()
    shard = models.PositiveSmallIntegerField(default=0)
    currency = models.CharField(max_length=3, blank=True, default="")
    calls = models.PositiveBigIntegerField(default=0)
    unpriced_calls = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cache_read_input_tokens = models.PositiveBigIntegerField(default=0)
    cache_creation_input_tokens = models.PositiveBigIntegerField(default=0)
    reasoning_output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=30, decimal_places=12, default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key", "hour", "shard", "currency"],
                                    name="cost_rollup_one_row"),
        ]
        indexes = [models.Index(fields=["scope", "hour"], name="cost_rollup_scope_hour_idx")]

    def __str__(self) -> str:
        return f"{self.scope} {self.key} {self.hour:%Y-%m-%d %H}h: {self.calls} calls, {self.cost} {self.currency}"
