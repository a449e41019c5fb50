"""Admin for administrators: registered tools (the gateway's) and retention rules; tool-call records
to look at, not edit."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from backplane.admin import ReadOnlyAdmin, short
from backplane.eventlog.models import user_actor
from recovery import gateway
from recovery.models import RETAINED_STATUS_CHOICES, RetentionRule, Tool, ToolCall, default_retained_statuses


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ("name", "namespace", "is_active", "breaker_state", "rate_limit_per_minute")
    list_filter = ("namespace", "is_active", "breaker_state")
    search_fields = ("name", "namespace", "url")
    # The breaker changes only under the row lock (recovery/breakers.py), the rate window only by
    # the gateway's conditional update: an edit here would race them.
    readonly_fields = ("created_at", "breaker_state", "consecutive_failures", "opened_at", "probe_started_at",
                       "last_error", "rate_window_start", "rate_window_count")
    fields = ("name", "namespace", "url", "timeout_seconds", "rate_limit_per_minute", "ttl_seconds", "is_active",
              "created_at", *readonly_fields[1:])
    actions = ("reset_breakers",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    @admin.action(description="Close the circuit breaker of the selected tools", permissions=["change"])
    def reset_breakers(self, request: HttpRequest, queryset: QuerySet[Tool]) -> None:
        if not self.has_change_permission(request):  # the admin offers the action only with it; check anyway
            raise PermissionDenied
        for tool in queryset:
            gateway.tool_breaker_reset(tool_id=tool.pk, decided_by=user_actor(request.user))
        messages.info(request, f"Breakers closed for {queryset.count()} tool(s).")


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    """Written before the call and answered once by the services; never edited by hand."""

    list_display = (short("idempotency_key", "key"), "tool", "step", short("task_id", "task"), "status",
                    "dispatched_at")
    list_filter = ("status", "tool")
    search_fields = ("=idempotency_key", "=task__id", "tool")
    ordering = ("-dispatched_at",)
    list_select_related = False
    show_full_result_count = False


class RetentionRuleForm(forms.ModelForm):
    statuses = forms.TypedMultipleChoiceField(
        choices=RETAINED_STATUS_CHOICES, widget=forms.CheckboxSelectMultiple, initial=default_retained_statuses,
        help_text="Which finished tasks the rule prunes. A task with a dead letter awaiting a decision is never "
                  "pruned, whatever its status.",
    )

    class Meta:
        model = RetentionRule
        fields = ("namespace", "kind", "keep_seconds", "statuses", "is_active")


@admin.register(RetentionRule)
class RetentionRuleAdmin(admin.ModelAdmin):
    """Administrators set how long a namespace keeps its finished tasks (recovery/retention.py);
    the retention duty keeps the totals. A task is pruned only once its events are exported."""

    form = RetentionRuleForm
    # The statuses are on the detail page: the list fits 1280 px (tests/browser/test_admin_widths.py).
    list_display = ("namespace", "kind_or_all", "keep_seconds", "is_active", "tasks_pruned", "events_pruned",
                    "last_pruned_at")
    list_filter = ("is_active", "namespace")
    search_fields = ("namespace", "kind")
    ordering = ("namespace", "kind")
    # The totals change only in the duty's transactions (an F() update): an edit here would race them.
    readonly_fields = ("created_at", "tasks_pruned", "events_pruned", "last_pruned_at")
    fields = ("namespace", "kind", "keep_seconds", "statuses", "is_active", *readonly_fields)

    @admin.display(description="kind", ordering="kind")
    def kind_or_all(self, rule: RetentionRule) -> str:
        return rule.kind or "(every kind)"
