"""WebSocket consumers of the live dashboard: they forward live notices to open pages.

A socket is accepted only for a logged-in staff user who may view the dashboard (the session
cookie, through ``AuthMiddlewareStack``); anyone else is refused at the handshake. The one group
a socket joins, ``fleet``, carries every task's notices: a user scoped to a namespace
(recovery.models.StaffScope) is forwarded only that namespace's. A task page's socket forwards
only the notices of its task and its children.
"""

from __future__ import annotations

import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboard.access import may_view_dashboard, namespace_of
from dashboard.live import FLEET_GROUP


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/fleet/``: every notice (overview, task list)."""

    namespace: str | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        # The permission check reads the database, which an async consumer does off its loop.
        if not await database_sync_to_async(may_view_dashboard)(user):
            await self.close(code=4403)
            return
        self.namespace = await database_sync_to_async(namespace_of)(user)
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    # A task page has no use for dead-letter counts; the fleet's pages (the review queue) do.
    forwards_dead_letters = True

    def wanted(self, notice: dict[str, Any]) -> bool:
        return self.namespace is None or notice.get("namespace") == self.namespace

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
        mine = notice["task_id"] == self.task_id or notice.get("parent_id") == self.task_id
        return mine and super().wanted(notice)
