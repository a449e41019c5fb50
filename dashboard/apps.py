from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # Every event write announces itself to open pages once it commits.
        from backplane.delivery.announcements import register_dead_letter_listener
        from backplane.eventlog.writer import register_follow_up
        from backplane.telemetry.counters import model_calls_count_after_commit
        from dashboard.live import dead_letters_after_commit, notice_after_commit

        # It only observes (a notice sent on commit), so it runs for quiet writes too, which the
        # append path may commit without a transaction of its own (eventlog/writer.py).
        register_follow_up(notice_after_commit, on_quiet_writes=True)
        # Model calls' tokens and cost on /metrics, counted on commit: an observer too.
        register_follow_up(model_calls_count_after_commit, on_quiet_writes=True)
        # Dead letters from the outbox write no event: they are announced on their own.
        register_dead_letter_listener(dead_letters_after_commit)
