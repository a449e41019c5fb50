"""Admin for administrators: registered tools (the gateway's); tool-call records to look at, not edit."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from backplane.admin import ReadOnlyAdmin, short
from recovery import gateway
from recovery.models import Tool, ToolCall


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
            gateway.tool_breaker_reset(tool_id=tool.pk, decided_by=f"user:{request.user.get_username()}")
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
