"""WebSocket routes of the live dashboard (filled in by the dashboard issue)."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
