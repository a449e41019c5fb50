"""The runtime's table: one row per periodic duty, written by the duty itself (app ``backplane``).

A duty that stops running is the failure a recovery controller must never hide: the row says
when each duty last succeeded, and the watchdog (``backplane.runtime.duties``) turns that into
``/readyz``, ``/metrics`` and the supervisor's decision to restart a wedged worker.
"""

from __future__ import annotations

from django.db import models


class Duty(models.Model):
    """A beat schedule entry (``name`` is its key in ``CELERY_BEAT_SCHEDULE``) and how it is doing."""

    name = models.CharField(max_length=100, primary_key=True)
    interval_seconds = models.FloatField(help_text="How often beat runs it.")
    # Set when a beat process starts: a duty is judged from the later of this and its last
    # success, so a fresh start is not called overdue before the duty had its chance.
    watch_started_at = models.DateTimeField(null=True, blank=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_failed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    runs_total = models.BigIntegerField(default=0)
    failures_total = models.BigIntegerField(default=0)

    class Meta:
        verbose_name_plural = "duties"

    def __str__(self) -> str:
        return self.name
