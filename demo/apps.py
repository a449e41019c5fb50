from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo fleet (docs/demo.md): agents, tools and a crash report on top of the product.

    It sits above everything and is a client of the product like any other: its agents use only
    ``backplane_client``; its command reads the database only to report. Nothing imports it.
    """

    name = "demo"
    verbose_name = "Demo fleet"
    default_auto_field = "django.db.models.BigAutoField"
