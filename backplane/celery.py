"""The Celery app. Beat schedules live in settings (CELERY_BEAT_SCHEDULE)."""

import logging
import os
from typing import Any

from celery import Celery, signals

from backplane.delivery import kombu_filesystem

# Before any connection is made: the embedded broker's URL names this transport.
kombu_filesystem.register()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")

app = Celery("backplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
# The parts that have periodic or queued work, each in its own ``tasks`` module.
app.autodiscover_tasks(["backplane.delivery", "backplane.integrity", "recovery"])

logger = logging.getLogger(__name__)


# Every periodic duty reports on itself (backplane/runtime/duties.py): /readyz, /metrics and the
# supervisor read the stamps. Imported late: this module loads before Django's apps are ready.
@signals.task_prerun.connect(weak=False)
def _duty_started(sender: Any = None, **_: Any) -> None:
    from backplane.runtime.duties import duty_stamp

    duty_stamp(task_name=sender.name, outcome="started")


@signals.task_success.connect(weak=False)
def _duty_succeeded(sender: Any = None, **_: Any) -> None:
    from backplane.runtime.duties import duty_stamp

    duty_stamp(task_name=sender.name, outcome="succeeded")


@signals.task_failure.connect(weak=False)
def _duty_failed(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    from backplane.runtime.duties import duty_stamp

    duty_stamp(task_name=sender.name, outcome="failed", error=f"{exception.__class__.__name__}: {exception}")


@signals.beat_init.connect(weak=False)
def _duties_watched_from_now(**_: Any) -> None:
    from django.db import DatabaseError, connection

    from backplane.runtime.duties import duties_watch_start

    try:
        duties_watch_start()
    except DatabaseError:
        # Beat schedules without the database too; the duties then age from their last
        # success, which is what a reader should see.
        logger.warning("could not mark the start of watching duties", exc_info=True)
    finally:
        connection.close()
