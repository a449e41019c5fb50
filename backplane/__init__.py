"""Agent Backplane: the event log, outbox and dead letters, and the REST API for agents."""

# The release (CHANGELOG.md), also the OpenAPI document's version and the client package's. Set
# before the Celery app is imported, which may load the settings that read it.
__version__ = "1.0.0"

from backplane.celery import app as celery_app  # noqa: E402

__all__ = ["__version__", "celery_app"]
