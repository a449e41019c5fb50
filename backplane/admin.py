"""Admin for administrators: agents and their tokens; tasks and events to look at, not edit."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from backplane.delivery.models import DeadLetter, DeadLetterStatus, OutboxMessage, WebhookSubscription
from backplane.delivery.outbound import outbound_url_validate
from backplane.eventlog import services
from backplane.eventlog.errors import AlreadyDecided, BackplaneError
from backplane.eventlog.models import Agent, BreakerTransition, CostRollup, Event, ModelPrice, Task, user_actor
from backplane.integrity import verification as integrity
from backplane.integrity.models import AuditSegment, IntegrityAlert, VerificationRun, VerifiedHead
from recovery import breakers, bulk
from recovery.models import BulkAction

# Changelists fit a 1280 px window (tests/browser/test_admin_widths.py): a few columns to find a
# row by, ids and hashes cut to their first characters (the whole value on hover and on the
# detail page), everything else on the detail page. The navigation sidebar would take a quarter
# of the width from every list; the breadcrumbs and the index lead to the same places.
admin.site.enable_nav_sidebar = False
SHORT_ID = 8


def short(attname: str, description: str, *, ordering: str | None = None) -> Any:
    """A changelist column with the first characters of a long value (UUID, hash, key)."""

    @admin.display(description=description, ordering=ordering or attname)
    def column(obj: Any) -> str:
        value = getattr(obj, attname)
        if value is None or value == "":
            return "-"
        text = str(value)
        if len(text) <= SHORT_ID + 1:
            return text
        return format_html('<span title="{}">{}…</span>', text, text[:SHORT_ID])

    column.__name__ = f"short_{attname}"
    return column


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

    list_display = (short("id", "id"), "namespace", "kind", "status", "attempts", "updated_at")
    list_filter = ("status", "namespace", "kind")
    search_fields = ("=id", "kind", "namespace", "lease_holder")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """The log is append-only; the database refuses changes even if this admin allowed them."""

    list_display = ("position", short("task_id", "task"), "seq", "type", "recorded_at")
    list_filter = ("type",)
    search_fields = ("=task__id", "type", "=idempotency_key")
    list_select_related = False
    ordering = ("-position",)
    show_full_result_count = False


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """The price table (backplane/eventlog/costs.py). A rate some cost may have been computed
    with is never edited: change a price by adding a rate with a later start and its own
    version, and end the old one (its ``valid_to``), which is all an existing rate lets change."""

    list_display = ("provider", "model", "token_type", "per_million", "currency", "valid_from", "valid_to", "version")
    list_filter = ("provider", "token_type", "currency")
    search_fields = ("provider", "model", "version")
    ordering = ("provider", "model", "token_type", "-valid_from")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        if obj is None:
            return ()
        return ("provider", "model", "token_type", "per_million", "currency", "valid_from", "version")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(CostRollup)
class CostRollupAdmin(ReadOnlyAdmin):
    """Written only by the event writer, with each model call: the sum of the events."""

    list_display = ("scope", "key", "hour", "calls", "input_tokens", "output_tokens", "cost", "currency")
    list_filter = ("scope", "currency")
    search_fields = ("key",)
    ordering = ("scope", "key", "-hour")


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    """Each subscription is a delivery lane of its own (docs/delivery.md): its deadline and
    concurrency, its ordering, and its retry schedule (empty fields take the settings)."""

    list_display = ("name", "topic_pattern", "ordering", "is_active", "created_at")
    # A literal address the relay would refuse is refused here too, at save time (delivery/outbound.py).
    formfield_overrides = {models.URLField: {"assume_scheme": "https", "validators": [outbound_url_validate]}}
    list_filter = ("is_active", "ordering")
    search_fields = ("name", "topic_pattern", "url")
    fieldsets = (
        (None, {"fields": ("name", "topic_pattern", "namespaces", "url", "secret", "is_active")}),
        ("Delivery", {"fields": ("ordering", "timeout_seconds", "max_concurrency")}),
        ("Retries", {
            "description": "Exponential backoff with jitter: the delay after failed attempt n is drawn between half "
                           "and all of min(longest delay, first delay × 2^(n-1)). Empty fields take "
                           "BACKPLANE_OUTBOX_MAX_ATTEMPTS, BACKPLANE_OUTBOX_BACKOFF_BASE_SECONDS and "
                           "BACKPLANE_OUTBOX_BACKOFF_MAX_SECONDS (by default 35 attempts over 25 to 51 hours).",
            "fields": ("max_attempts", "retry_base_seconds", "retry_max_delay_seconds"),
        }),
    )


@admin.register(OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    """Delivery state is the relay's; people act on failures through dead letters."""

    list_display = ("id", "topic", short("key", "key"), "status", "attempts", "next_attempt_at")
    list_filter = ("status", "destination")
    search_fields = ("=message_id", "topic", "=key")
    ordering = ("-id",)
    show_full_result_count = False


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


@admin.register(BreakerTransition)
class BreakerTransitionAdmin(ReadOnlyAdmin):
    list_display = ("at", "agent", "change", "reason")
    list_select_related = ("agent",)
    list_filter = ("to_state",)
    search_fields = ("agent__name", "reason")
    ordering = ("-at",)

    @admin.display(description="change")
    def change(self, obj: BreakerTransition) -> str:
        return f"{obj.from_state} → {obj.to_state}"


@admin.register(VerificationRun)
class VerificationRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "mode", "started_at", "seconds", "tasks_checked", "events_checked", "failures")
    list_filter = ("mode",)
    ordering = ("-started_at",)
    show_full_result_count = False

    @admin.display(description="seconds")
    def seconds(self, run: VerificationRun) -> str:
        if run.finished_at is None:
            return "unfinished"
        return f"{(run.finished_at - run.started_at).total_seconds():.1f}"


@admin.register(VerifiedHead)
class VerifiedHeadAdmin(ReadOnlyAdmin):
    """Where the incremental verifier continues from, per task; written only by the verifier."""

    list_display = (short("task_id", "task"), "verified_seq", short("verified_hash", "verified hash"), "verified_at")
    search_fields = ("=task__id",)
    ordering = ("-verified_at",)
    show_full_result_count = False


class IntegrityAlertActionForm(ActionForm):
    """The changelist's action bar, with the note an acknowledgement records."""

    note = forms.CharField(required=False, label="Note", widget=forms.TextInput(attrs={"size": 30}))


@admin.register(IntegrityAlert)
class IntegrityAlertAdmin(ReadOnlyAdmin):
    """Raised by the chain verifier (a broken chain, or a row that differs from its log); the
    only change people make is to acknowledge one."""

    list_display = ("id", short("task_id", "task"), "kind", "first_invalid_seq", "created_at", "acknowledged")
    list_filter = ("kind", ("acknowledged_at", admin.EmptyFieldListFilter))
    search_fields = ("=task__id", "problem")
    ordering = ("-created_at",)
    action_form = IntegrityAlertActionForm
    actions = ("acknowledge",)

    @admin.display(description="acknowledged", boolean=True, ordering="acknowledged_at")
    def acknowledged(self, alert: IntegrityAlert) -> bool:
        return alert.acknowledged_at is not None

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
                    alert_id=alert_id, by=user_actor(request.user), note=note
                )
                done += 1
            except AlreadyDecided:
                already += 1
        messages.info(request, f"Acknowledged {done} alert(s); {already} were already acknowledged.")


@admin.register(AuditSegment)
class AuditSegmentAdmin(ReadOnlyAdmin):
    """What the audit export wrote where; written only by the exporter (backplane/integrity/audit/export.py)."""

    list_display = ("number", "first_leaf", "tree_size", short("root_hash", "root hash"), "exported_at")
    ordering = ("-number",)
