"""WebSocket routes of the live dashboard."""

from django.urls import URLPattern, path

from dashboard import consumers

websocket_urlpatterns: list[URLPattern] = [
    path("ws/fleet/", consumers.FleetConsumer.as_asgi()),
    path("ws/tasks/<uuid:task_id>/", consumers.TaskConsumer.as_asgi()),
]
