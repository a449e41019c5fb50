"""The Celery app. Beat schedules live in settings (CELERY_BEAT_SCHEDULE)."""

import logging
import os
import threading
from typing import Any

from celery import Celery, Task, signals

from backplane.delivery import kombu_filesystem

# Before any connection is made: the embedded broker's URL names this transport.
kombu_filesystem.register()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backplane.settings")


class DutyTask(Task):
    """A task that, when it is a periodic duty, runs once at a time per worker process.

    Beat keeps sending a duty on schedule whether or not its last run finished. A run that
    hangs (a lock it waits on, a peer that never answers) would otherwise be joined by another
    every interval until the pool has no thread left and every other duty stops with it. The
    later runs return at once instead; they record no success, so the hung duty goes overdue
    on its own and is named by /readyz while the others keep running.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from django.conf import settings

        if self.name not in {str(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}:
            return super().__call__(*args, **kwargs)
        with _running_guard:
            running = _running_duties.setdefault(self.name, threading.Lock())
        if not running.acquire(blocking=False):
            logger.warning("duty task %s: the previous run is still running here; this one is skipped", self.name)
            return DUTY_SKIPPED
        try:
            return super().__call__(*args, **kwargs)
        finally:
            running.release()


DUTY_SKIPPED = "skipped: the previous run is still running"
_running_duties: dict[str, threading.Lock] = {}
_running_guard = threading.Lock()

app = Celery("backplane", task_cls=DutyTask)
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
def _duty_succeeded(sender: Any = None, result: Any = None, **_: Any) -> None:
    from backplane.runtime.duties import duty_stamp

    if isinstance(result, str) and result == DUTY_SKIPPED:
        return
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
