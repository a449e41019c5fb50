from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo fleet (docs/demo.md): agents, tools and a crash report on top of the product.

    It sits above everything and nothing imports it. Its agents are clients like any other: they
    use only ``backplane_client``. Its command sets the fleet up through the product's services
    (agents, the gateway tool, the webhook, the retention rule), decides its own forgotten dead
    letters, and reads the database to report.
    """

    name = "demo"
    verbose_name = "Demo fleet"
    default_auto_field = "django.db.models.BigAutoField"
