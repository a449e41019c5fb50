"""Admin for administrators: agents and their tokens; tasks and events to look at, not edit."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest

from backplane.delivery.models import DeadLetter, OutboxMessage, WebhookSubscription
from backplane.eventlog import services
from backplane.eventlog.errors import AlreadyDecided
from backplane.eventlog.models import Agent, BreakerTransition, Event, Task
from backplane.integrity import verification as integrity
from backplane.integrity.models import AuditSegment, IntegrityAlert, VerificationRun, VerifiedHead
from recovery import breakers


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_filter = ("namespace", "is_active", "breaker_state")
    search_fields = ("name", "namespace")
    readonly_fields = ("created_at", "breaker_state", "consecutive_failures", "breaker_opened_at")
    fields = ("name", "namespace", "kinds", "user", "is_active", "created_at", "breaker_state", "consecutive_failures",
              "breaker_opened_at")
    list_display = ("name", "namespace", "kinds", "user", "is_active", "breaker_state", "consecutive_failures",
                    "created_at")
    actions = ("rotate_tokens", "reset_breakers")

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        token = None
        if not change:
            # Only the hash is stored; the token itself is shown once, here.
            token, obj.token_hash = services.agent_token_issue()
        super().save_model(request, obj, form, change)
        if token:
            messages.warning(request, f"Token for {obj} (shown once, store it now): {token}")

    @admin.action(description="Close the circuit breaker of the selected agents")
    def reset_breakers(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            breakers.breaker_reset(agent_id=agent.pk, decided_by=f"user:{request.user.get_username()}")
        messages.info(request, f"Breakers closed for {queryset.count()} agent(s).")

    @admin.action(description="Rotate the token of the selected agents (shows the new tokens once)")
    def rotate_tokens(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        for agent in queryset:
            rotated = services.agent_rotate_token(agent_id=agent.pk)
            messages.warning(request, f"New token for {agent} (shown once): {rotated.token}")


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    """Tasks are a projection of their events: they change only through the services."""

    list_display = ("id", "namespace", "kind", "status", "attempts", "lease_holder", "last_seq", "updated_at")
    list_filter = ("status", "namespace", "kind")
    search_fields = ("=id", "kind", "namespace", "lease_holder")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """The log is append-only; the database refuses changes even if this admin allowed them."""

    list_display = ("position", "task_id", "seq", "type", "agent", "idempotency_key", "recorded_at")
    list_filter = ("type",)
    search_fields = ("=task__id", "type", "=idempotency_key")
    list_select_related = False
    ordering = ("-position",)
    show_full_result_count = False


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("name", "topic_pattern", "url", "timeout_seconds", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name", "topic_pattern", "url")


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """Delivery state is the relay's; people act on failures through dead letters."""

    list_display = ("id", "topic", "key", "destination", "status", "attempts", "next_attempt_at", "delivered_at")
    list_filter = ("status", "destination")
    search_fields = ("=message_id", "topic", "=key")
    ordering = ("-id",)
    show_full_result_count = False


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Decisions go through the dashboard or the API, which record them; this is for looking."""

    list_display = ("id", "source", "reference", "topic", "status", "attempts", "created_at", "decided_by")
    list_filter = ("status", "source")
    search_fields = ("reference", "topic", "=task__id")
    ordering = ("-id",)


@admin.register(BreakerTransition)
class BreakerTransitionAdmin(ReadOnlyAdmin):
    list_display = ("at", "agent", "from_state", "to_state", "reason", "task_id", "decided_by")
    list_filter = ("to_state",)
    search_fields = ("agent__name", "reason")
    ordering = ("-at",)


@admin.register(VerificationRun)
class VerificationRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "mode", "started_at", "finished_at", "tasks_checked", "events_checked", "failures")
    list_filter = ("mode",)
    ordering = ("-started_at",)
    show_full_result_count = False


@admin.register(VerifiedHead)
class VerifiedHeadAdmin(ReadOnlyAdmin):
    """Where the incremental verifier continues from, per task; written only by the verifier."""

    list_display = ("task_id", "verified_seq", "verified_hash", "verified_at")
    search_fields = ("=task__id",)
    ordering = ("-verified_at",)
    show_full_result_count = False


class IntegrityAlertActionForm(ActionForm):
    """The changelist's action bar, with the note an acknowledgement records."""

    note = forms.CharField(required=False, label="Note", widget=forms.TextInput(attrs={"size": 50}))


@admin.register(IntegrityAlert)
class IntegrityAlertAdmin(ReadOnlyAdmin):
    """Raised by the chain verifier (a broken chain, or a row that differs from its log); the
    only change people make is to acknowledge one."""

    list_display = (
        "id", "task", "kind", "first_invalid_seq", "problem", "created_at", "acknowledged_by", "acknowledged_at"
    )
    list_filter = ("kind", ("acknowledged_at", admin.EmptyFieldListFilter))
    list_select_related = ("task",)
    search_fields = ("=task__id", "problem")
    ordering = ("-created_at",)
    action_form = IntegrityAlertActionForm
    actions = ("acknowledge",)

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("backplane.acknowledge_integrityalert")

    @admin.action(description="Acknowledge the selected alerts (with the note)", permissions=["acknowledge"])
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[IntegrityAlert]) -> None:
        note = request.POST.get("note", "").strip()
        if not note:
            messages.error(request, "Write a note saying what was done about the alert(s); nothing was acknowledged.")
            return
        done, already = 0, 0
        for alert_id in queryset.values_list("pk", flat=True):
            try:
                integrity.integrity_alert_acknowledge(
                    alert_id=alert_id, by=f"user:{request.user.get_username()}", note=note
                )
                done += 1
            except AlreadyDecided:
                already += 1
        messages.info(request, f"Acknowledged {done} alert(s); {already} were already acknowledged.")


@admin.register(AuditSegment)
class AuditSegmentAdmin(ReadOnlyAdmin):
    """What the audit export wrote where; written only by the exporter (backplane/integrity/audit/export.py)."""

    list_display = ("number", "first_leaf", "tree_size", "root_hash", "manifest_sha256", "destination", "exported_at")
    ordering = ("-number",)
