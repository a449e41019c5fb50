"""When a periodic duty is overdue, as constants and one SQL statement that need no Django.

``backplane.runtime.duties`` (the ORM side: stamps, ``/readyz``, ``/metrics``) and the supervisor
(``backplane.runtime.launcher``, which never sets Django up) judge duties by this one rule.
"""

from __future__ import annotations

# A duty is overdue once it has gone this many intervals without a success...
OVERDUE_INTERVALS = 3
# ...but never sooner than this: the broker's polling, beat's tick and a busy pool add a few
# seconds of jitter that must not turn a 1-second duty red.
OVERDUE_FLOOR_SECONDS = 10.0

# The same rule for readers without Django (the supervisor): names and how late they are.
OVERDUE_SQL = f"""
SELECT name, extract(epoch FROM now() - greatest(last_succeeded_at, watch_started_at))::float8 AS age_seconds
FROM backplane_duty
WHERE greatest(last_succeeded_at, watch_started_at) IS NOT NULL
  AND now() - greatest(last_succeeded_at, watch_started_at)
      > make_interval(secs => greatest({OVERDUE_INTERVALS} * interval_seconds, {OVERDUE_FLOOR_SECONDS}))
ORDER BY name
"""


def allowance_seconds(interval_seconds: float) -> float:
    """How long a duty that runs every ``interval_seconds`` may go without a success."""
    return max(OVERDUE_INTERVALS * interval_seconds, OVERDUE_FLOOR_SECONDS)
