from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # Every event write announces itself to open pages once it commits.
        from backplane.eventlog.writer import register_follow_up
        from dashboard.live import notice_after_commit

        register_follow_up(notice_after_commit)
