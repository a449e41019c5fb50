"""Records of the recovery side: tool calls made through the idempotency proxy, registered
tools, and the retention rules that prune finished tasks."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from backplane.eventlog.models import CLOSED_STATUSES, NAME_VALIDATOR, Task, TaskStatus


class ToolCallStatus(models.TextChoices):
    DISPATCHED = "dispatched"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ToolCall(models.Model):
    """One tool call, keyed by sha256("{task_id}:{step}:{tool}").

    Written before the agent acts (write before you act) and answered once; a repeat of
    the key is answered from here instead of calling the tool again. Kept until
    ``expires_at`` (the TTL), then purged.
    """

    idempotency_key = models.CharField(max_length=64, primary_key=True)
    # The key the tool itself sees (its ``Idempotency-Key``): the call's own key, except in a
    # fork whose history holds this step's dispatch (backplane/eventlog/forks.py). There it is
    # the key the source dispatched with, so the tool acts once across a source and its forks.
    effect_key = models.CharField(max_length=64)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="tool_calls")
    step = models.PositiveIntegerField()
    tool = models.CharField(max_length=200)
    input = models.JSONField(default=dict)
    compensation = models.JSONField(null=True, blank=True)
    # Set on a compensation (recovery/sagas.py): the key of the call it undoes.
    compensation_of = models.CharField(max_length=64, null=True, blank=True, db_index=True)
    status = models.CharField(max_length=20, choices=ToolCallStatus.choices, default=ToolCallStatus.DISPATCHED)
    result = models.JSONField(null=True, blank=True)
    dispatched_by = models.CharField(max_length=100, null=True, blank=True)
    dispatched_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["expires_at"], name="toolcall_expiry_idx"),
            models.Index(fields=["task", "step"], name="toolcall_task_step_idx"),
            models.Index(
                fields=["dispatched_at"], name="toolcall_in_flight_idx", condition=Q(status="dispatched")
            ),
            # Forks' calls of their sources' effects, found by the effect (recovery/tool_calls.py);
            # partial, so a call that is its own effect costs the index nothing.
            models.Index(
                fields=["effect_key"], name="toolcall_effect_idx",
                condition=~Q(effect_key=models.F("idempotency_key")),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} step {self.step} of {self.task_id} ({self.status})"


class BreakerState(models.TextChoices):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Tool(models.Model):
    """An external tool the backplane calls itself (``POST /api/v1/tools/{name}/invoke/``).

    Registered by administrators, for one namespace or for all (``namespace`` blank). A
    namespace's tool shadows a global one of the same name: its agents get theirs, the others
    the global one, and no agent sees another namespace's tool (recovery/gateway.py,
    ``tool_for_namespace``). The row also holds what must hold across web processes: the
    circuit breaker, changed under the row lock (recovery/breakers.py, store ``TOOLS``), and
    the per-minute rate-limit window, changed by a conditional UPDATE (recovery/gateway.py).
    Each row has its own: two namespaces' tools of one name share neither.
    """

    name = models.SlugField(max_length=200)
    namespace = models.CharField(
        max_length=100, blank=True, default="", validators=[NAME_VALIDATOR],
        help_text="Blank: every namespace's agents may call it, unless their namespace has a tool of this name.",
    )
    url = models.URLField(max_length=1000)
    timeout_seconds = models.PositiveIntegerField(default=10, help_text="Per call; a timeout counts as a failure.")
    rate_limit_per_minute = models.PositiveIntegerField(default=0, help_text="Calls per minute; 0 means unlimited.")
    ttl_seconds = models.PositiveIntegerField(
        default=24 * 3600, help_text="How long an answer is kept and replayed instead of calling the tool again."
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # The circuit breaker (recovery/breakers.py): consecutive failures open it, a cool-down later one
    # trial call goes.
    breaker_state = models.CharField(max_length=20, choices=BreakerState.choices, default=BreakerState.CLOSED)
    consecutive_failures = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(null=True, blank=True)
    trial_started_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    # The rate limit: a fixed one-minute window and the calls counted in it.
    rate_window_start = models.DateTimeField(null=True, blank=True)
    rate_window_count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # Each row its own breaker and rate limit; a blank namespace is the global tool.
            models.UniqueConstraint(fields=["namespace", "name"], name="tool_unique_name_per_namespace"),
            models.CheckConstraint(condition=Q(timeout_seconds__gte=1), name="tool_timeout_at_least_1s"),
            # A record must outlive the call it caches, or the answer would have nowhere to go.
            models.CheckConstraint(condition=Q(ttl_seconds__gte=models.F("timeout_seconds")),
                                   name="tool_ttl_covers_timeout"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.namespace})" if self.namespace else self.name


# What a retention rule may prune: the statuses no event can leave (CLOSED_STATUSES), in
# the order the reducer's TaskStatus declares them.
RETAINED_STATUSES = [status for status in TaskStatus if status in CLOSED_STATUSES]
RETAINED_STATUS_CHOICES = [(status.value, status.label) for status in RETAINED_STATUSES]


def default_retained_statuses() -> list[str]:
    return [status.value for status in RETAINED_STATUSES]


class RetentionRule(models.Model):
    """How long a namespace keeps its finished tasks (recovery/retention.py).

    A task of ``namespace`` (and of ``kind``, unless blank) whose status is one of
    ``statuses`` and whose last event is older than ``keep_seconds`` is deleted, with its
    events and every row that refers to it, once it is safe: every event sealed and exported to
    the audit destination, no dead letter awaiting a decision, no message awaiting delivery, no
    open integrity alert, no sub-task left (children go first). The log only ever loses whole
    tasks, and only what the export keeps verifiable offline. Several rules may cover one
    task: the first that finds it due prunes it. The totals are the retention duty's.
    """

    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=100, blank=True, default="", help_text="Blank: every kind of the namespace.")
    keep_seconds = models.PositiveIntegerField(
        help_text="How long a finished task is kept after its last event (e.g. 86400 for a day).",
    )
    statuses = ArrayField(
        models.CharField(max_length=20, choices=RETAINED_STATUS_CHOICES),
        default=default_retained_statuses,
        help_text="Which finished tasks the rule prunes.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Running totals, updated in the same transaction as each pruned task.
    tasks_pruned = models.PositiveBigIntegerField(default=0)
    events_pruned = models.PositiveBigIntegerField(default=0)
    last_pruned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Only finished tasks, whatever writes the row (the admin's form checks it too).
            models.CheckConstraint(
                condition=Q(statuses__contained_by=default_retained_statuses()) & Q(statuses__len__gt=0),
                name="retention_rule_finished_statuses",
            ),
        ]

    def __str__(self) -> str:
        scope = f"{self.namespace}/{self.kind}" if self.kind else f"{self.namespace}/*"
        return f"{scope}: keep {self.keep_seconds}s ({', '.join(self.statuses)})"


class BudgetScope(models.TextChoices):
    NAMESPACE = "namespace"  # key: the namespace
    AGENT = "agent"  # key: "<namespace>/<agent name>"
    TASK = "task"  # key: a root task's id; its sub-agents' calls count too


class BudgetPeriod(models.TextChoices):
    DAY = "day"  # UTC calendar day
    TASK = "task"  # the whole life of the task tree


class BudgetUnit(models.TextChoices):
    CURRENCY = "currency"  # the cost of priced calls in ``currency``
    TOKENS = "tokens"  # input plus output tokens of every call, priced or not


class BudgetAtLimit(models.TextChoices):
    STOP = "stop"  # work of the scope is refused until a person raises or resumes the budget
    ASK = "ask"  # the same, and the budget asks ``ask_group`` whether to go on (a ``BudgetAsk``)


class Budget(models.Model):
    """What a namespace, an agent or a task tree may spend on model calls (recovery/budgets.py).

    Crossing 80 % and 95 % of the limit writes a warning (an event and an outbox message, once a
    period each); reaching it refuses further leases, tool calls and model-call records of the
    scope (``409 budget_exceeded``) until a person raises the limit or resumes the scope. A
    budget that asks (``at_limit``) also puts the question to ``ask_group`` then: an approval
    resumes the scope for the period, a denial leaves it stopped. The ``*_on`` dates say in which
    period each happened: a day budget starts afresh every day. Changed only through the budget
    services, each change a ``BudgetDecision``.
    """

    scope = models.CharField(max_length=16, choices=BudgetScope.choices)
    key = models.CharField(max_length=320)
    period = models.CharField(max_length=8, choices=BudgetPeriod.choices)
    unit = models.CharField(max_length=8, choices=BudgetUnit.choices)
    currency = models.CharField(max_length=3, blank=True, default="")
    limit = models.DecimalField(max_digits=24, decimal_places=6)
    warned_80_on = models.DateField(null=True, blank=True)
    warned_95_on = models.DateField(null=True, blank=True)
    exceeded_on = models.DateField(null=True, blank=True)
    resumed_on = models.DateField(null=True, blank=True)
    at_limit = models.CharField(max_length=8, choices=BudgetAtLimit.choices, default=BudgetAtLimit.STOP,
                                db_default=BudgetAtLimit.STOP)
    ask_group = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "key", "period", "unit"], name="budget_one_per_scope_period"),
            models.CheckConstraint(condition=Q(at_limit="stop", ask_group__isnull=True)
                                   | Q(at_limit="ask", ask_group__isnull=False), name="budget_asks_a_group"),
            models.CheckConstraint(condition=Q(limit__gt=0), name="budget_limit_positive"),
            models.CheckConstraint(condition=~Q(scope="task") | Q(period="task"), name="budget_task_scope_whole"),
            models.CheckConstraint(condition=Q(scope="task") | Q(period="day"), name="budget_shared_scope_daily"),
            models.CheckConstraint(condition=Q(unit="tokens", currency="") | (Q(unit="currency") & ~Q(currency="")),
                                   name="budget_currency_with_unit"),
        ]

    def __str__(self) -> str:
        limit = format(self.limit.normalize(), "f")
        what = f"{limit} {self.currency}" if self.unit == BudgetUnit.CURRENCY else f"{limit} tokens"
        return f"{self.scope} {self.key}: {what} a {self.period}"


class BudgetDecision(models.Model):
    """A person's decision on a budget: set, raised or lowered, resumed. The budget's audit trail."""

    budget = models.ForeignKey(Budget, on_delete=models.PROTECT, related_name="decisions")
    action = models.CharField(max_length=16)  # set | resume
    old_limit = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    new_limit = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    spend = models.DecimalField(max_digits=30, decimal_places=12)
    decided_by = models.CharField(max_length=100)
    reason = models.TextField()
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["budget", "-at"], name="budget_decision_budget_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.budget} by {self.decided_by}"


class Pause(models.Model):
    """Work of a namespace, or of one kind in it, that claims pass over while a fix goes out
    (recovery/fleet.py). Leases already held run on. A pause in force has no ``resumed_at``;
    lifting it fills the resume fields, so the row is its own audit trail."""

    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=100, blank=True, default="", help_text="Blank: every kind of the namespace.")
    reason = models.TextField()
    paused_by = models.CharField(max_length=150)
    paused_at = models.DateTimeField()
    resumed_by = models.CharField(max_length=150, blank=True, default="")
    resumed_at = models.DateTimeField(null=True, blank=True)
    resume_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "kind"], condition=Q(resumed_at__isnull=True),
                                    name="pause_one_in_force_per_scope"),
        ]
        indexes = [models.Index(fields=["-paused_at"], name="pause_recent_idx")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind or '*'} paused by {self.paused_by}"


class BulkAction(models.TextChoices):
    CANCEL = "cancel"  # tasks: TaskCancelled
    RETRY = "retry"  # failed or dead-lettered tasks back to work
    FORK_FROM_FAILURE = "fork_from_failure"  # tasks: a fork from the step before the failure
    DEAD_LETTER_REQUEUE = "dead_letter_requeue"  # dead letters
    DEAD_LETTER_DISCARD = "dead_letter_discard"  # dead letters


class BulkJobStatus(models.TextChoices):
    DRAFT = "draft"  # a dry run: the selection is frozen, nothing done yet
    RUNNING = "running"
    PAUSED = "paused"
    ABORTED = "aborted"
    FINISHED = "finished"


class BulkJob(models.Model):
    """An action over a frozen list of tasks or dead letters, executed by the worker in chunks
    (recovery/bulk.py). A dry run freezes the selection into ``BulkJobItem`` rows and their
    hash; starting the job names that hash, so exactly the list that was shown is executed.
    Each decision on the job (start, pause, resume, abort) is a ``BulkJobDecision``."""

    action = models.CharField(max_length=24, choices=BulkAction.choices)
    status = models.CharField(max_length=10, choices=BulkJobStatus.choices, default=BulkJobStatus.DRAFT)
    # What selected the items: a task-list filter (backplane.eventlog.selectors.TaskFilters as
    # JSON), a dead-letter filter, or {"ids": [...]}.
    selection = models.JSONField(default=dict)
    selection_hash = models.CharField(max_length=64)
    options = models.JSONField(default=dict, blank=True)
    reason = models.TextField()
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    chunk_size = models.PositiveIntegerField(default=200)
    rate_per_second = models.PositiveIntegerField(default=200)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The worker running the job holds it until then (a conditional UPDATE claims it); a worker
    # killed mid-job leaves it to expire, and the next worker resumes at the first pending item.
    runner_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["-created_at"], name="bulkjob_recent_idx"),
            models.Index(fields=["runner_until"], name="bulkjob_running_idx", condition=Q(status="running")),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} of {self.total} ({self.status})"


class BulkItemStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"


class BulkJobItem(models.Model):
    """One item of a job's frozen list, and its result, written in the transaction that acts
    on it: an item is done once, whatever kills the worker."""

    job = models.ForeignKey(BulkJob, on_delete=models.CASCADE, related_name="items")
    index = models.PositiveIntegerField()
    # A task's id, or a dead letter's id, as text.
    target = models.CharField(max_length=64)
    # What the dry run said would happen to it ("cancel", "skip: already completed").
    planned = models.CharField(max_length=200)
    status = models.CharField(max_length=8, choices=BulkItemStatus.choices, default=BulkItemStatus.PENDING)
    detail = models.TextField(blank=True, default="")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="bulkjob_item_once")]
        indexes = [models.Index(fields=["job", "index"], name="bulkjob_item_pending_idx",
                                condition=Q(status="pending"))]

    def __str__(self) -> str:
        return f"job {self.job_id} item {self.index}: {self.target} {self.status}"


class BulkJobDecision(models.Model):
    """Who created, started, paused, resumed or aborted a job, when and why: its audit trail."""

    job = models.ForeignKey(BulkJob, on_delete=models.PROTECT, related_name="decisions")
    action = models.CharField(max_length=16)  # create | start | pause | resume | abort | finish
    decided_by = models.CharField(max_length=150)
    reason = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["job", "at"], name="bulkjob_decision_job_idx")]

    def __str__(self) -> str:
        return f"{self.action} job {self.job_id} by {self.decided_by}"


class SavedSearch(models.Model):
    """A task-list filter kept under a name (recovery/alerts.py): shared by its URL
    (``/searches/<slug>/`` opens the task list with it), pinned as a tile on the overview, and
    watched by alert rules. ``filter`` is ``TaskFilters.as_json()``, checked on the way in."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    filter = models.JSONField(default=dict, blank=True)
    pinned = models.BooleanField(default=False, help_text="Shown as a tile with its live count on the overview.")
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "saved searches"
        indexes = [models.Index(fields=["name"], name="savedsearch_pinned_idx", condition=Q(pinned=True))]

    def __str__(self) -> str:
        return self.name


# Longer windows would make every evaluation scan most of the task table's recent index.
ALERT_WINDOW_MAX_SECONDS = 30 * 24 * 3600
ALERT_THRESHOLD_MAX = 1_000_000_000


class AlertState(models.TextChoices):
    OK = "ok"
    FIRING = "firing"


class AlertRule(models.Model):
    """"When the count of a saved search over a window reaches a threshold" (recovery/alerts.py).

    The count is the number of tasks the search matches whose ``updated_at`` falls in the last
    ``window_seconds``. The rule fires when it is at least ``threshold`` and resolves when it is
    below again; each crossing is one ``AlertTransition`` and one outbox message (topic
    ``backplane.alerts``), never one per evaluation. ``state`` changes only by a conditional
    UPDATE whose row count is checked, so concurrent evaluators cross once."""

    search = models.ForeignKey(SavedSearch, on_delete=models.CASCADE, related_name="alert_rules")
    window_seconds = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(ALERT_WINDOW_MAX_SECONDS)],
        help_text="Count the tasks updated in this many last seconds (at most 30 days).",
    )
    threshold = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(ALERT_THRESHOLD_MAX)],
        help_text="Fire when the count is at least this.",
    )
    enabled = models.BooleanField(default=True)
    state = models.CharField(max_length=8, choices=AlertState.choices, default=AlertState.OK)
    state_since = models.DateTimeField()
    last_count = models.PositiveIntegerField(null=True, blank=True)
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(window_seconds__gte=1), name="alertrule_window_positive"),
            models.CheckConstraint(condition=Q(threshold__gte=1), name="alertrule_threshold_positive"),
        ]
        indexes = [models.Index(fields=["state_since"], name="alertrule_firing_idx", condition=Q(state="firing"))]

    def __str__(self) -> str:
        return f"{self.search}: {self.threshold} or more updated in {self.window_seconds}s ({self.state})"


class AlertTransitionState(models.TextChoices):
    FIRED = "fired"
    RESOLVED = "resolved"


class AlertTransition(models.Model):
    """A rule fired or resolved: its history, and what was sent on ``backplane.alerts``. Kept
    when the rule is deleted (``rule`` then empty; the search's name and the numbers stay)."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="transitions")
    search_name = models.CharField(max_length=200)
    state = models.CharField(max_length=8, choices=AlertTransitionState.choices)
    count = models.PositiveIntegerField()
    threshold = models.PositiveIntegerField()
    window_seconds = models.PositiveIntegerField()
    # Why a rule resolved other than by its count: "rule deleted", "rule disabled", ...
    reason = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["-at"], name="alerttransition_recent_idx")]

    def __str__(self) -> str:
        return f"{self.search_name} {self.state} at {self.count}/{self.threshold}"


# --- people: roles and staff scoping ---------------------------------------------------------------

# Roles are Django groups (made by migration 0013) holding these permissions, declared on
# StaffScope; the reviewer's is backplane.delivery.models.REVIEW_PERMISSION. Being staff only
# lets a person log in: what they may see and do is what their permissions say.
VIEW_PERMISSION = "recovery.view_backplane"
OPERATE_PERMISSION = "recovery.operate_backplane"


class StaffScope(models.Model):
    """The one namespace a staff user works in, where a deployment wants staff limited: their
    session's queries scope to it as an agent's do (another namespace's task is 404), and routes
    that act across namespaces refuse them. No row: every namespace."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="staff_scope")
    namespace = models.CharField(max_length=100, validators=[NAME_VALIDATOR])

    class Meta:
        permissions = [
            ("view_backplane", "Can read the dashboard and the staff API"),
            ("operate_backplane", "Can cancel, pause, fork, set budgets, write to tasks and start verification"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.namespace}"


class ExpiryAction(models.TextChoices):
    DENY = "deny"
    ESCALATE = "escalate"


class ToolPolicy(models.Model):
    """One version of a tool's approval policy: when a call of ``tool`` needs a person's approval
    before it is dispatched, from whom, and for how long it may wait (docs/approvals.md).

    Versions are never changed: setting a policy writes the next version and makes it the
    current one (recovery/approvals.py, ``tool_policy_set``), so every approval request can name
    the version it was decided under. A namespace's policy shadows the global one (``namespace``
    blank) of the same tool, as a namespace's tool shadows a global tool. ``enabled`` false is a
    version too: the tool's calls need no approval from then on, and the history says who
    decided it and why.
    """

    tool = models.CharField(max_length=200, help_text="The tool name agents dispatch calls of, exactly.")
    namespace = models.CharField(
        max_length=100, blank=True, default="", validators=[NAME_VALIDATOR],
        help_text="Blank: every namespace without a policy of its own for this tool.",
    )
    version = models.PositiveIntegerField()
    is_current = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True, help_text="False: this tool's calls need no approval.")
    condition = models.TextField(
        blank=True, default="", help_text='Blank: every call. Else, e.g. amount > 1000 and currency == "EUR".'
    )
    field_types = models.JSONField(
        default=dict, blank=True, help_text='The type of each field the condition names, e.g. {"amount": "number"}.'
    )
    approvals_required = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1),
                                                                                 MaxValueValidator(10)])
    approver_group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="+")
    open_seconds = models.PositiveIntegerField(
        default=3600, validators=[MinValueValidator(10), MaxValueValidator(30 * 24 * 3600)],
        help_text="How long a request waits for its decision.",
    )
    on_expiry = models.CharField(max_length=10, choices=ExpiryAction.choices, default=ExpiryAction.DENY)
    escalate_to = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                    help_text="With on_expiry escalate: the group asked once the first wait runs out.")
    four_eyes = models.BooleanField(
        default=True, help_text="A person may not approve a request of an agent whose token is bound to them."
    )
    set_by = models.CharField(max_length=150)
    reason = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "tool policies"
        constraints = [
            models.UniqueConstraint(fields=["tool", "namespace", "version"], name="toolpolicy_version_unique"),
            models.UniqueConstraint(fields=["tool", "namespace"], condition=Q(is_current=True),
                                    name="toolpolicy_one_current"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} ({self.namespace or 'every namespace'}) v{self.version}"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


class ApprovalRequest(models.Model):
    """A gated tool call waiting for people's approval, bound to its exact arguments.

    One per tool call key (task, step, tool): an agent that dispatches the same call again (a
    retry, or a new process after a crash) finds this request, never a second one. The call is
    dispatched only once the request is granted and only with arguments whose canonical hash is
    ``argument_sha256``; other arguments for the same step are refused (recovery/approvals.py).
    Its events (``ApprovalRequested``, ``ApprovalGranted``, ``ApprovalDenied``,
    ``ApprovalExpired``) are in the task's chain."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    idempotency_key = models.CharField(max_length=64, unique=True)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="approval_requests")
    step = models.PositiveIntegerField()
    tool = models.CharField(max_length=200)
    input = models.JSONField(default=dict)
    argument_sha256 = models.CharField(max_length=64)
    reason = models.TextField(blank=True, default="")
    requested_by = models.CharField(max_length=100)
    requested_at = models.DateTimeField()
    policy = models.ForeignKey(ToolPolicy, on_delete=models.PROTECT, related_name="requests")
    # The group asked now: the policy's approvers, or after an escalation its escalation group.
    group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="+")
    escalated = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["expires_at"], name="approval_pending_idx", condition=Q(status="pending")),
            models.Index(fields=["task", "status"], name="approval_task_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} step {self.step} ({self.status})"


class ApprovalVerdict(models.TextChoices):
    APPROVE = "approve"
    DENY = "deny"


class ApprovalDecision(models.Model):
    """One person's decision on a request; a person decides a request once."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decided_by = models.CharField(max_length=150)
    verdict = models.CharField(max_length=10, choices=ApprovalVerdict.choices)
    reason = models.TextField()
    at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["request", "user"], name="approvaldecision_once")]

    def __str__(self) -> str:
        return f"{self.decided_by} {self.verdict}s"


class SignalStatus(models.TextChoices):
    WAITING = "waiting"
    RECEIVED = "received"
    TIMED_OUT = "timed_out"


class TaskSignal(models.Model):
    """A named signal of a task, waited for durably (recovery/signals.py): an agent waits for it,
    someone or something outside sends it (a person, a callback from a long job), and the task's
    chain records both (``SignalAwaited``, ``SignalReceived``) or the wait running out
    (``SignalTimedOut``). One per task and name; a signal sent before anyone waits is kept, and
    the wait that comes later finds it."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=10, choices=SignalStatus.choices)
    payload = models.JSONField(null=True, blank=True)
    awaited_by = models.CharField(max_length=100, blank=True, default="")
    awaited_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    sent_by = models.CharField(max_length=150, blank=True, default="")
    received_at = models.DateTimeField(null=True, blank=True)
    timed_out_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="tasksignal_once_per_name")]
        indexes = [models.Index(fields=["expires_at"], name="tasksignal_waiting_idx", condition=Q(status="waiting"))]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class BudgetAsk(models.Model):
    """A budget that reached its limit asking its group whether the scope may go on this period
    (recovery/budgets.py): granted, the scope is resumed for the period; denied, it stays stopped."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="asks")
    period_day = models.DateField()
    group = models.ForeignKey("auth.Group", on_delete=models.PROTECT, related_name="+")
    status = models.CharField(max_length=10, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    spend = models.DecimalField(max_digits=30, decimal_places=12)
    # The task whose model call reached the limit (no foreign key: retention may prune it).
    crossed_by_task_id = models.UUIDField(null=True, blank=True)
    asked_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["budget", "period_day"], name="budgetask_once_a_period")]

    def __str__(self) -> str:
        return f"{self.budget} asks {self.group} ({self.status})"
