"""WebSocket consumers of the live dashboard: they forward live notices to open pages.

A socket is accepted only for a logged-in staff user (the session cookie, through
``AuthMiddlewareStack``); anyone else is refused at the handshake. Every staff user may see
every task, so the one group a socket joins, ``fleet``, is one its user may see. A task
page's socket forwards only the notices of its task and its children.
"""

from __future__ import annotations

import uuid
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard.access import may_view_dashboard
from dashboard.live import FLEET_GROUP


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/fleet/``: every notice (overview, task list)."""

    async def connect(self) -> None:
        if not may_view_dashboard(self.scope.get("user")):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    # A task page has no use for dead-letter counts; the fleet's pages (the review queue) do.
    forwards_dead_letters = True

    def wanted(self, notice: dict[str, Any]) -> bool:
        return True

    async def fleet_notice(self, message: dict[str, Any]) -> None:
        tasks = [notice for notice in message["tasks"] if self.wanted(notice)]
        dead_letters = message.get("dead_letters", 0) if self.forwards_dead_letters else 0
        if tasks or dead_letters or message.get("resync"):
            await self.send_json({"tasks": tasks, "dead_letters": dead_letters, "resync": bool(message.get("resync"))})


class TaskConsumer(FleetConsumer):
    """``/ws/tasks/<uuid>/``: the notices of one task and of its sub-tasks."""

    forwards_dead_letters = False

    async def connect(self) -> None:
        self.task_id = str(uuid.UUID(str(self.scope["url_route"]["kwargs"]["task_id"])))
        await super().connect()

    def wanted(self, notice: dict[str, Any]) -> bool:
        return notice["task_id"] == self.task_id or notice.get("parent_id") == self.task_id
