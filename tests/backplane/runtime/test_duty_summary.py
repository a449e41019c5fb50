"""The console's one line a minute about the duties (backplane.runtime.launcher.duty_summary)."""

from __future__ import annotations

from backplane.runtime.launcher import DutyReading, duty_summary


def reading(runs: dict[str, int], failures: dict[str, int] | None = None, overdue: dict[str, float] | None = None
            ) -> DutyReading:
    return DutyReading(overdue=overdue or {}, intervals={name: 1.0 for name in runs}, last_success=None,
                       last_watch_start=None, runs=runs, failures=failures or {})


def test_it_counts_the_runs_since_the_last_line_and_names_what_is_overdue() -> None:
    before = reading({"relay-outbox": 100, "seal-events": 10})
    after = reading({"relay-outbox": 160, "seal-events": 16}, failures={"seal-events": 2},
                    overdue={"seal-events": 31.0})
    assert duty_summary(before, after, 1) == (
        "duties in the last 1 min: relay-outbox 60, seal-events 6 (2 failed); overdue: seal-events")


def test_a_quiet_minute_says_so() -> None:
    same = reading({"detect-stalls": 5})
    assert duty_summary(same, same, 1) == "duties in the last 1 min: detect-stalls 0; overdue: none"
