"""Admin for administrators: tasks, events, outbox messages, breaker transitions and integrity
records to look at, not edit; model prices and webhook subscriptions. The agents' and the dead
letters' admin are recovery's (recovery/admin.py): their actions are its services."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from backplane.delivery.models import OutboxMessage, WebhookSubscription
from backplane.delivery.outbound import outbound_url_validate
from backplane.eventlog.errors import AlreadyDecided
from backplane.eventlog.models import BreakerTransition, CostRollup, Event, ModelPrice, Task, user_actor
from backplane.integrity import verification as integrity
from backplane.integrity.models import AuditSegment, IntegrityAlert, VerificationRun, VerifiedHead

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


class ServiceSavedAdmin(admin.ModelAdmin):
    """An admin whose ``save_model`` calls a service, which commits its own transaction
    (``transaction.atomic(durable=True)``: one transaction per service, never nested). Django
    runs the add and change views inside an atomic block of its own, where the service's would
    be nested and refused; here they run without it, as each view's only write is the service's."""

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # ModelAdmin's own view without its atomic block (a private method of Django's admin).
        view: Any = super()
        return view._changeform_view(request, object_id, form_url, extra_context)


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
