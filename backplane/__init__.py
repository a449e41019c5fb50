"""Agent Backplane: the event log, outbox and dead letters, and the REST API for agents."""

from backplane.celery import app as celery_app

__all__ = ["celery_app"]
