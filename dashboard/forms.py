"""The task list's filter form: what a person typed, checked, as ``TaskFilters``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms

from backplane.eventlog.models import TaskStatus
from backplane.eventlog.selectors import TaskFilters

SANDBOX_CHOICES = [("", "leave out sandboxes"), ("with", "with sandboxes"), ("only", "sandboxes only")]
TIME_FIELDS = ("created_after", "created_before", "updated_after", "updated_before", "stalled_since",
               "recovered_since", "replayed_since")


class ViewerDateTimeField(forms.DateTimeField):
    """An RFC 3339 time (links carry those), or a ``datetime-local`` value typed in the viewer's
    timezone; the form's ``tz`` field (minutes behind UTC, as JavaScript's
    ``getTimezoneOffset()`` gives them) turns the latter into UTC."""

    input_formats = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"]

    def to_python(self, value: object) -> datetime | None:
        if isinstance(value, str) and value.strip():
            text = value.strip().replace("Z", "+00:00")
            try:
                parsed = datetime.fromisoformat(text)
            except ValueError:
                raise forms.ValidationError("enter a date and time, e.g. 2026-11-30T14:05") from None
            return parsed  # naive until the form applies the viewer's offset
        return None


class TaskFilterForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, strip=True,
                        widget=forms.TextInput(attrs={"placeholder": "search payloads: a tool, a value, an id…",
                                                      "type": "search"}))
    status = forms.ChoiceField(required=False, choices=[("", "any status"), *TaskStatus.choices])
    kind = forms.CharField(required=False, max_length=100)
    namespace = forms.CharField(required=False, max_length=100)
    agent = forms.CharField(required=False, max_length=100)
    created_after = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    created_before = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    updated_after = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    updated_before = ViewerDateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    stalled_since = ViewerDateTimeField(required=False, widget=forms.HiddenInput)
    recovered_since = ViewerDateTimeField(required=False, widget=forms.HiddenInput)
    replayed_since = ViewerDateTimeField(required=False, widget=forms.HiddenInput)
    recovering = forms.BooleanField(required=False, widget=forms.HiddenInput)
    # Sandboxes replay agents against the record and are no part of the fleet: left out unless asked.
    sandboxes = forms.ChoiceField(required=False, choices=SANDBOX_CHOICES)
    tz = forms.IntegerField(required=False, min_value=-14 * 60, max_value=14 * 60, widget=forms.HiddenInput)

    def clean(self) -> dict[str, object]:
        super().clean()
        data = self.cleaned_data
        offset = timedelta(minutes=data.get("tz") or 0)
        for name in TIME_FIELDS:
            value = data.get(name)
            if isinstance(value, datetime) and value.tzinfo is None:
                data[name] = (value + offset).replace(tzinfo=UTC)
        return data

    def filters(self) -> TaskFilters:
        data = self.cleaned_data
        return TaskFilters(
            q=data.get("q") or "",
            status=data.get("status") or "",
            kind=data.get("kind") or "",
            namespace=data.get("namespace") or "",
            agent=data.get("agent") or "",
            recovering=bool(data.get("recovering")),
            sandboxes=data.get("sandboxes") or "",
            **{name: data.get(name) for name in TIME_FIELDS},
        )


class RefusalForm(forms.Form):
    """A page's action form whose refusal the page says in one line after "Not done: "."""

    def refusal(self) -> str:
        """Every error, in the fields' order, as one line."""
        return "; ".join(str(error).rstrip(".") for errors in self.errors.values() for error in errors)


class BulkSelectionForm(forms.Form):
    """A list page's bulk bar: the rows checked (``ids``, a field each page declares for its own
    ids), or every row matching the list's filter (``query``, the filter as a query string). It
    makes a draft job; its page shows the dry run and a reviewer starts it there."""

    nothing_selected = "Select some rows, or all matching the filter."  # in each page's words

    all_matching = forms.BooleanField(required=False)
    query = forms.CharField(required=False, max_length=2000)

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if not data.get("all_matching") and not data.get("ids") and not self.errors:
            raise forms.ValidationError(self.nothing_selected)
        return data
