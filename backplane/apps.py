from django.apps import AppConfig
from django.db.models.signals import post_migrate


class BackplaneConfig(AppConfig):
    name = "backplane"
    verbose_name = "Backplane: event log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from backplane.integrity.checks import check_signing_key
        from backplane.runtime.db_roles import on_post_migrate

        checks.register(check_signing_key)
        # After every migrate as the owner: the application's role can log in (settings.py).
        post_migrate.connect(on_post_migrate, sender=self, dispatch_uid="backplane.db_roles")
