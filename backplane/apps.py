from django.apps import AppConfig


class BackplaneConfig(AppConfig):
    name = "backplane"
    verbose_name = "Backplane: event log"
    default_auto_field = "django.db.models.BigAutoField"
