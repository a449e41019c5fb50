"""The Celery app. Beat schedules live in settings (CELERY_BEAT_SCHEDULE)."""

import os

from celery import Celery

from backplane.delivery import kombu_filesystem

# Before any connection is made: the embedded broker's URL names this transport.
kombu_filesystem.register()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")

app = Celery("backplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The parts that have periodic or queued work, each in its own ``tasks`` module.
app.autodiscover_tasks(["backplane.delivery", "backplane.integrity", "recovery"])
