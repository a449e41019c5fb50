from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # Every event write announces itself to open pages once it commits.
        from backplane.delivery.announcements import register_dead_letter_listener
        from backplane.eventlog.writer import register_observer
        from backplane.telemetry.counters import model_calls_count_after_commit
        from dashboard.live import dead_letters_after_commit, notice_after_commit

        # Observers: told of every write, on either of the writer's drivers, they act on commit.
        register_observer(notice_after_commit)
        # Model calls' tokens and cost on /metrics, counted on commit.
        register_observer(model_calls_count_after_commit)
        # Dead letters from the outbox write no event: they are announced on their own.
        register_dead_letter_listener(dead_letters_after_commit)
