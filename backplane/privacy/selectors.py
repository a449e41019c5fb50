"""Reads of the privacy part for people (the dashboard's Privacy page)."""

from __future__ import annotations

from backplane.privacy.models import DataSubject, PersonalDataRead


def subjects_page(namespace: str | None, *, search: str = "", limit: int = 50) -> list[DataSubject]:
    """Data subjects, newest first (the dashboard's Privacy page); ``search``: a subject id prefix."""
    rows = DataSubject.objects.order_by("-created_at")
    if namespace is not None:
        rows = rows.filter(namespace=namespace)
    if search:
        rows = rows.filter(subject__startswith=search)
    return list(rows.defer("wrapped_key")[:limit])


def reads_of(namespace: str | None, *, limit: int = 50) -> list[PersonalDataRead]:
    rows = PersonalDataRead.objects.order_by("-read_at")
    if namespace is not None:
        rows = rows.filter(namespace=namespace)
    return list(rows[:limit])
