from django.apps import AppConfig
from django.db.models.signals import post_migrate


class BackplaneConfig(AppConfig):
    name = "backplane"
    verbose_name = "Backplane: event log"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings
        from django.core import checks

        from backplane.integrity.checks import check_signing_key
        from backplane.runtime.db_roles import on_post_migrate
        from backplane.telemetry.tracing import tracing_configure

        checks.register(check_signing_key)
        _install_pool_check()
        # Before Django builds its request handler: the instrumentation adds a middleware.
        tracing_configure(endpoint=settings.OTEL_EXPORTER_OTLP_ENDPOINT, service_name=settings.OTEL_SERVICE_NAME,
                          disabled=settings.OTEL_PYTHON_DISABLED_INSTRUMENTATIONS)
        # After every migrate as the owner: the application's role can log in (settings.py).
        post_migrate.connect(on_post_migrate, sender=self, dispatch_uid="backplane.db_roles")
        # And the price table has the prices file's rates (insert-only: the admin's edits stay).
        post_migrate.connect(load_prices_after_migrate, sender=self, dispatch_uid="backplane.prices")


def load_prices_after_migrate(**kwargs: object) -> None:
    from django.conf import settings

    from backplane.eventlog.costs import prices_load

    if settings.BACKPLANE_PRICES_FILE.is_file():
        prices_load(settings.BACKPLANE_PRICES_FILE)


def _install_pool_check() -> None:
    """The pool's health check only for connections that sat idle (runtime/pool_checks.py)."""
    from typing import Any, cast

    from django.db import connection

    from backplane.runtime import pool_checks

    if connection.settings_dict["OPTIONS"].get("pool") and connection.settings_dict["CONN_HEALTH_CHECKS"]:
        # PostgreSQL's wrapper has a pool (Django 5.1+); reading it builds it, unconnected.
        pool_checks.install(cast(Any, connection).pool)
