"""Admin for administrators: agents (their tokens, their breakers), registered tools (the
gateway's), their approval policies and retention rules; dead letters decided by bulk job; tool-call records to look at,
not edit."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html
from django.utils.http import urlencode

from backplane.admin import ReadOnlyAdmin, ServiceSavedAdmin, short
from backplane.delivery.models import DeadLetter, DeadLetterStatus
from backplane.delivery.outbound import outbound_url_validate
from backplane.eventlog import services
from backplane.eventlog.errors import BackplaneError
from backplane.eventlog.models import Agent, user_actor
from recovery import alerts, approvals, breakers, bulk, gateway
from recovery.models import (
    RETAINED_STATUS_CHOICES,
    AlertRule,
    AlertTransition,
    BulkAction,
    BulkJob,
    BulkJobDecision,
    Pause,
    RetentionRule,
    SavedSearch,
    StaffScope,
    Tool,
    ToolCall,
    ToolPolicy,
    default_retained_statuses,
)


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ("name", "namespace", "is_active", "breaker_state", "rate_limit_per_minute")
    list_filter = ("namespace", "is_active", "breaker_state")
    search_fields = ("name", "namespace", "url")
    # The breaker changes only under the row lock (recovery/breakers.py), the rate window only by
    # the gateway's conditional update: an edit here would race them.
    readonly_fields = ("created_at", "breaker_state", "consecutive_failures", "opened_at", "trial_started_at",
                       "last_error", "rate_window_start", "rate_window_count")
    fields = ("name", "namespace", "url", "timeout_seconds", "rate_limit_per_minute", "ttl_seconds", "is_active",
              "created_at", *readonly_fields[1:])
    actions = ("reset_breakers",)
    # A literal address the gateway would refuse is refused here too, at save time (delivery/outbound.py).
    formfield_overrides = {models.URLField: {"assume_scheme": "https", "validators": [outbound_url_validate]}}

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


@admin.register(Pause)
class PauseAdmin(ReadOnlyAdmin):
    """Pauses are set and lifted through recovery/fleet.py (the dashboard's Pauses page, the API), which
    keep one in force per scope and record who and why; here they are only looked at."""

    list_display = ("namespace", "kind_or_all", "paused_by", "paused_at", "reason_start", "resumed_by", "resumed_at")
    list_filter = ("namespace",)
    search_fields = ("namespace", "kind", "paused_by", "reason")
    ordering = ("-paused_at",)

    @admin.display(description="kind", ordering="kind")
    def kind_or_all(self, pause: Pause) -> str:
        return pause.kind or "(every kind)"

    @admin.display(description="reason")
    def reason_start(self, pause: Pause) -> str:
        return pause.reason if len(pause.reason) <= 60 else f"{pause.reason[:59]}…"


@admin.register(StaffScope)
class StaffScopeAdmin(admin.ModelAdmin):
    """A staff user limited to one namespace: their session's queries scope to it from their next
    request on (api/authentication.py); no row, every namespace. What they may do is
    their groups' (docs/production.md, "Roles")."""

    list_display = ("user", "namespace")
    list_filter = ("namespace",)
    search_fields = ("user__username", "namespace")
    raw_id_fields = ("user",)
    ordering = ("namespace", "user__username")


@admin.register(SavedSearch)
class SavedSearchAdmin(admin.ModelAdmin):
    """Saved from the task list (recovery/alerts.py checks the filter then); here renamed, pinned or
    deleted. Deleting goes through the service, so a firing rule of the search resolves first."""

    list_display = ("name", "slug", "pinned", "created_by", "created_at")
    list_filter = ("pinned",)
    search_fields = ("name", "slug", "created_by")
    ordering = ("name",)
    readonly_fields = ("slug", "filter", "created_by", "created_at")
    fields = ("name", "pinned", *readonly_fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the task list's "Save this search" makes them, from a checked filter

    def delete_model(self, request: HttpRequest, obj: SavedSearch) -> None:
        alerts.saved_search_delete(search_id=obj.pk, by=user_actor(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SavedSearch]) -> None:
        for search in queryset:
            alerts.saved_search_delete(search_id=search.pk, by=user_actor(request.user))


@admin.register(AlertRule)
class AlertRuleAdmin(ServiceSavedAdmin):
    """Rules are added, changed and deleted through recovery/alerts.py (disabling or deleting a
    firing rule resolves it, with its message); the state is the evaluator's alone."""

    # The counts and evaluation times are on the detail page: the list fits 1280 px.
    list_display = ("search", "threshold", "window_seconds", "state", "state_since")
    list_filter = ("state", "enabled")
    search_fields = ("search__name", "search__slug")
    ordering = ("search__name", "pk")
    list_select_related = ("search",)
    readonly_fields = ("state", "state_since", "last_count", "last_evaluated_at", "created_by", "created_at")
    fields = ("search", "threshold", "window_seconds", "enabled", *readonly_fields)

    def get_readonly_fields(self, request: HttpRequest, obj: AlertRule | None = None) -> tuple[str, ...]:
        # A rule stays on its search: its history and its message key belong to that search.
        return ("search", *self.readonly_fields) if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: AlertRule, form: forms.ModelForm, change: bool) -> None:
        saved = alerts.alert_rule_set(search_id=obj.search_id, window_seconds=obj.window_seconds,
                                      threshold=obj.threshold, enabled=obj.enabled,
                                      created_by=user_actor(request.user), rule_id=obj.pk if change else None)
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: AlertRule) -> None:
        alerts.alert_rule_delete(rule_id=obj.pk, by=user_actor(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AlertRule]) -> None:
        for rule in queryset:
            alerts.alert_rule_delete(rule_id=rule.pk, by=user_actor(request.user))


@admin.register(AlertTransition)
class AlertTransitionAdmin(ReadOnlyAdmin):
    """The alerts' history: written with each crossing's message, never edited."""

    list_display = ("at", "search_name", "state", "count", "threshold", "window_seconds", "reason")
    list_filter = ("state",)
    search_fields = ("search_name", "reason")
    ordering = ("-at",)


class BulkJobDecisionInline(admin.TabularInline):
    """A job's audit trail: who created, started, paused, resumed or aborted it, and why."""

    model = BulkJobDecision
    fields = ("at", "action", "decided_by", "reason")
    readonly_fields = fields
    extra = 0
    ordering = ("at", "pk")

    def has_add_permission(self, request: HttpRequest, obj: BulkJob | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: BulkJob | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: BulkJob | None = None) -> bool:
        return False


@admin.register(BulkJob)
class BulkJobAdmin(ReadOnlyAdmin):
    """Bulk jobs change only through recovery/bulk.py (the API and the dashboard's job pages)."""

    list_display = ("id", "action", "status", "total", "done", "skipped", "failed", "created_by", "created_at")
    list_filter = ("status", "action")
    search_fields = ("=id", "created_by", "reason")
    ordering = ("-created_at",)
    fields = ("action", "status", "reason", "selection", "selection_hash", "options", "created_by", "created_at",
              "retry_of", "total", "done", "skipped", "failed", "chunk_size", "rate_per_second", "started_at",
              "finished_at", "runner_until")
    readonly_fields = fields
    inlines = (BulkJobDecisionInline,)


# The agents' and the dead letters' admin are recovery's: their actions are its services (an
# agent's breaker, bulk jobs), which the lower package's admin cannot reach.


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_filter = ("namespace", "is_active", "breaker_state")
    search_fields = ("name", "namespace")
    readonly_fields = ("created_at", "breaker_state", "consecutive_failures", "breaker_opened_at")
    fields = ("name", "namespace", "kinds", "user", "is_active", "created_at", "breaker_state", "consecutive_failures",
              "breaker_opened_at")
    list_display = ("name", "namespace", "is_active", "breaker_state", "created_at")
    actions = ("rotate_tokens", "reset_breakers")

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        if not change:
            # Only the hash is stored; the token goes to the page that answers this request.
            token, obj.token_hash = services.agent_token_issue()
            request._issued_tokens = [(obj, token)]  # type: ignore[attr-defined]
        super().save_model(request, obj, form, change)

    def response_add(self, request: HttpRequest, obj: Agent, post_url_continue: str | None = None) -> HttpResponse:
        issued = getattr(request, "_issued_tokens", None)
        if issued:
            return tokens_page(request, self, issued, title="Agent created: its token")
        return super().response_add(request, obj, post_url_continue)

    @admin.action(description="Close the circuit breaker of the selected agents", permissions=["change"])
    def reset_breakers(self, request: HttpRequest, queryset: QuerySet[Agent]) -> None:
        if not self.has_change_permission(request):  # the admin offers the action only with it; check anyway
            raise PermissionDenied
        for agent in queryset:
            breakers.breaker_reset(agent_id=agent.pk, decided_by=user_actor(request.user),
                                   reason="from the admin")
        messages.info(request, f"Breakers closed for {queryset.count()} agent(s).")

    @admin.action(description="Rotate the token of the selected agents (shows the new tokens once)",
                  permissions=["change"])
    def rotate_tokens(self, request: HttpRequest, queryset: QuerySet[Agent]) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied
        issued = [(agent, services.agent_rotate_token(agent_id=agent.pk).token) for agent in queryset]
        return tokens_page(request, self, issued, title="New tokens")


def tokens_page(request: HttpRequest, model_admin: admin.ModelAdmin, issued: list[tuple[Agent, str]], *,
                title: str) -> HttpResponse:
    """New tokens, shown once: in the body of this response only. Never in a message or a
    cookie (both outlive the page), and the response must not be cached."""
    response = TemplateResponse(
        request,
        "admin/backplane/agent/tokens.html",
        {**model_admin.admin_site.each_context(request), "title": title, "issued": issued,
         "opts": model_admin.model._meta},
    )
    add_never_cache_headers(response)
    return response


@admin.register(DeadLetter)
class DeadLetterAdmin(ReadOnlyAdmin):
    """Reviewers decide here too, as a bulk job (recovery/bulk.py, the one way to act in bulk):
    "requeue selected" and "discard selected" ask for a reason on a page of their own, then make
    a draft job over the selected dead letters and open its page (/jobs/<id>/), where the dry
    run is shown and a reviewer starts exactly that list. The rows themselves stay read-only."""

    list_display = ("id", "source", "topic", "status", "attempts", "created_at")
    list_filter = ("status", "source")
    search_fields = ("reference", "topic", "=task__id")
    ordering = ("-id",)
    actions = ("requeue_selected", "discard_selected")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Reviewers (the Reviewers group holds only review_deadletter) may open the list they decide from.
        return super().has_view_permission(request, obj) or self.has_review_permission(request)

    def has_review_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("backplane.review_deadletter")

    @admin.action(description="Requeue the selected dead letters (a job: asks for a reason)", permissions=["review"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._draft_job(request, queryset, BulkAction.DEAD_LETTER_REQUEUE)

    @admin.action(description="Discard the selected dead letters (a job: asks for a reason)", permissions=["review"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[DeadLetter]) -> HttpResponse | None:
        return self._draft_job(request, queryset, BulkAction.DEAD_LETTER_DISCARD)

    def _draft_job(self, request: HttpRequest, queryset: QuerySet[DeadLetter], action: str) -> HttpResponse | None:
        """First the page asking why (and showing what is selected), then the draft job's page."""
        if not self.has_review_permission(request):  # the admin offers the action only to reviewers; check anyway
            raise PermissionDenied
        most = settings.BACKPLANE_BULK_MAX_ITEMS
        # One more than the most: the dry run refuses an over-large list with its own message.
        ids = list(queryset.order_by("created_at", "id").values_list("pk", flat=True)[: most + 1])
        verb = "requeue" if action == BulkAction.DEAD_LETTER_REQUEUE else "discard"
        reason = request.POST.get("reason", "").strip()
        if request.POST.get("confirm") != "yes" or not reason:
            shown = list(queryset.order_by("created_at", "id")[:50])
            pending = queryset.filter(status=DeadLetterStatus.PENDING).count()
            return TemplateResponse(request, "dashboard/dead_letters/admin_confirm.html", {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": f"{verb.capitalize()} {len(ids)} dead letter{'s' if len(ids) != 1 else ''}?",
                "action": verb,
                "action_name": f"{verb}_selected",
                "ids": ids,
                "shown": shown,
                "pending": pending,
                "decided": len(ids) - pending,
                "select_across": request.POST.get("select_across") == "1",
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "missing_reason": request.POST.get("confirm") == "yes" and not reason,
            })
        try:
            job = bulk.bulk_job_plan(action=action, selection={"ids": ids}, reason=reason,
                                     created_by=user_actor(request.user))
        except BackplaneError as exc:
            messages.error(request, f"Nothing was planned: {exc.message}.")
            return None
        return redirect("dashboard:job", job_id=job.pk)


class ToolPolicyForm(forms.ModelForm):
    class Meta:
        model = ToolPolicy
        fields = ("tool", "namespace", "enabled", "condition", "field_types", "approvals_required", "approver_group",
                  "open_seconds", "on_expiry", "escalate_to", "four_eyes", "reason")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        approver_group, escalate_to = data.get("approver_group"), data.get("escalate_to")
        if approver_group is None or self.errors:
            return data
        # The service's own checks, each refusal shown beside its field.
        try:
            approvals.tool_policy_check(
                condition=data.get("condition") or "", field_types=data.get("field_types") or {},
                approver_group=approver_group.name, escalate_to=escalate_to.name if escalate_to else None,
                on_expiry=data.get("on_expiry") or "",
            )
        except BackplaneError as exc:
            for field, reason in exc.details.items():
                self.add_error(field if field in self.fields else None, f"{exc.message} ({reason})")
        return data


@admin.register(ToolPolicy)
class ToolPolicyAdmin(ServiceSavedAdmin):
    """Each save writes the policy's next version through recovery/approvals.py; versions are
    never edited or deleted (every approval request names the one it was decided under). A
    version's page links to an add form filled from it, to write the next one."""

    form = ToolPolicyForm
    # Who set each version and when are on its page: the list fits 1280 px.
    list_display = ("tool", "namespace", "version", "is_current", "enabled", short("condition", "condition"),
                    "approver_group")
    list_filter = ("is_current", "enabled", "on_expiry")
    search_fields = ("tool", "namespace", "condition", "set_by")
    ordering = ("tool", "namespace", "-version")
    list_select_related = ("approver_group",)

    @admin.display(description="next version")
    def next_version(self, obj: ToolPolicy) -> str:
        initial = {"tool": obj.tool, "namespace": obj.namespace, "enabled": "on" if obj.enabled else "",
                   "condition": obj.condition, "field_types": json.dumps(obj.field_types),
                   "approvals_required": obj.approvals_required, "approver_group": obj.approver_group_id,
                   "open_seconds": obj.open_seconds, "on_expiry": obj.on_expiry,
                   "escalate_to": obj.escalate_to_id or "", "four_eyes": "on" if obj.four_eyes else ""}
        url = f"{reverse('admin:recovery_toolpolicy_add')}?{urlencode(initial)}"
        return format_html('<a href="{}">Write the next version from this one</a>', url)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial = super().get_changeform_initial_data(request)
        if "field_types" in request.GET:
            try:
                initial["field_types"] = json.loads(request.GET["field_types"])
            except ValueError:
                initial.pop("field_types")
        return initial

    def get_readonly_fields(self, request: HttpRequest, obj: ToolPolicy | None = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("next_version", "version", "is_current", "set_by", "created_at", *ToolPolicyForm.Meta.fields)

    def get_fields(self, request: HttpRequest, obj: ToolPolicy | None = None) -> tuple[str, ...]:
        return ToolPolicyForm.Meta.fields if obj is None else self.get_readonly_fields(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: ToolPolicy | None = None) -> bool:
        return False  # a change is a new version

    def has_delete_permission(self, request: HttpRequest, obj: ToolPolicy | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: ToolPolicy, form: forms.ModelForm, change: bool) -> None:
        saved = approvals.tool_policy_set(
            tool=obj.tool, namespace=obj.namespace, condition=obj.condition, field_types=obj.field_types,
            approvals_required=obj.approvals_required, approver_group=obj.approver_group.name,
            open_seconds=obj.open_seconds, on_expiry=obj.on_expiry,
            escalate_to=obj.escalate_to.name if obj.escalate_to else None, four_eyes=obj.four_eyes,
            enabled=obj.enabled, set_by=user_actor(request.user), reason=obj.reason,
        )
        obj.pk, obj.version = saved.pk, saved.version
