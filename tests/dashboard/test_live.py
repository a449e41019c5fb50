"""Live notices: written after commit only, coalesced, retried, and delivered through the real
channel layer (channels_postgres on the test database) to consumers that check who asks."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client

from backplane.eventlog import services
from backplane.eventlog.writer import EventDraft
from dashboard import live
from tests.support.waiting import wait_until


class Sent:
    """What a publisher sent, for the tests of coalescing and retries (the layer's own tests
    below use the real one)."""

    def __init__(self, fail_times: int = 0) -> None:
        self.messages: list[dict[str, Any]] = []
        self.fail_times = fail_times
        self.arrived = threading.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.fail_times:
            self.fail_times -= 1
            raise ConnectionError("layer down")
        self.messages.append(message)
        self.arrived.set()


def notice(task: str, seq: int) -> dict[str, Any]:
    return {"task_id": task, "seq": seq, "position": seq, "type": "X", "status": "running", "namespace": "acme",
            "parent_id": None}


def sent_before_a_marker(publisher: live.NoticePublisher, sent: Sent) -> list[dict[str, Any]]:
    """Every message sent for what was published so far. A marker notice published now goes out
    after anything still queued, or with it (one flush at a time), so once the marker is out the
    messages before it are all there are; the marker's own message must hold the marker alone."""
    marker = notice("marker", 1)
    publisher.publish(marker)
    wait_until(lambda: any(marker in message["tasks"] for message in sent.messages), timeout=5,
               what="the marker notice is sent", interval=0.01)
    *before, with_marker = sent.messages
    assert with_marker["tasks"] == [marker], "a notice published earlier went out with the marker"
    return before


@pytest.fixture
def publishers() -> Iterator[list[live.NoticePublisher]]:
    made: list[live.NoticePublisher] = []
    yield made
    for publisher in made:
        publisher.close()


def make_publisher(publishers: list[live.NoticePublisher], sent: Sent | None = None) -> live.NoticePublisher:
    publisher = live.NoticePublisher(send=sent)
    publishers.append(publisher)
    return publisher


def test_it_coalesces_a_burst_into_one_message_with_the_latest_seq_per_task(publishers: Any) -> None:
    sent = Sent()
    publisher = make_publisher(publishers, sent)
    for seq in range(1, 6):
        publisher.publish(notice("a", seq))
    publisher.publish(notice("b", 1))
    publisher.publish(notice("a", 3))  # late and older: ignored
    assert sent.arrived.wait(2)
    messages = sent_before_a_marker(publisher, sent)
    assert len(messages) == 1
    assert {(n["task_id"], n["seq"]) for n in messages[0]["tasks"]} == {("a", 5), ("b", 1)}
    assert messages[0]["resync"] is False


def test_a_notice_after_a_flush_goes_out_in_the_next_one(publishers: Any) -> None:
    sent = Sent()
    publisher = make_publisher(publishers, sent)
    for round_ in range(1, 4):
        sent.arrived.clear()
        publisher.publish(notice("a", round_))
        assert sent.arrived.wait(2), f"round {round_}: nothing sent"
    assert [[n["seq"] for n in m["tasks"]] for m in sent.messages] == [[1], [2], [3]]


def test_a_failed_send_is_retried_and_says_resync(publishers: Any) -> None:
    sent = Sent(fail_times=2)
    publisher = make_publisher(publishers, sent)
    publisher.publish(notice("a", 1))
    assert sent.arrived.wait(5)
    assert publisher.failures == 2
    assert sent.messages[0]["resync"] is True
    assert sent.messages[0]["tasks"][0]["seq"] == 1


def test_too_many_tasks_in_one_window_become_a_resync(publishers: Any) -> None:
    sent = Sent()
    publisher = make_publisher(publishers, sent)
    for n in range(live.MAX_TASKS_PER_NOTICE + 5):
        publisher.publish(notice(f"t{n}", 1))
    assert sent.arrived.wait(2)
    messages = sent_before_a_marker(publisher, sent)
    assert sum(len(m["tasks"]) for m in messages) <= live.MAX_TASKS_PER_NOTICE + 5
    assert messages[0]["resync"] is True


@pytest.fixture
def recorded(settings: Any, monkeypatch: pytest.MonkeyPatch, publishers: Any) -> Sent:
    settings.BACKPLANE_LIVE_NOTICES = True
    sent = Sent()
    monkeypatch.setattr(live, "publisher", make_publisher(publishers, sent))
    return sent


def test_a_write_is_announced_once_it_commits(committed_db: None, recorded: Sent, make_task: Any) -> None:
    task = make_task()
    assert recorded.arrived.wait(2)
    assert recorded.messages[-1]["tasks"][0]["task_id"] == str(task.pk)
    assert recorded.messages[-1]["tasks"][0]["seq"] == 1


def test_a_rolled_back_write_announces_nothing(committed_db: None, recorded: Sent, make_task: Any) -> None:
    class Abandon(Exception):
        pass

    rolled_back = uuid.uuid4()
    with pytest.raises(Abandon), transaction.atomic():
        services.task_create_in_transaction(namespace="acme", kind="k", input={}, agent=None, task_id=rolled_back,
                                            parent_task_id=None, max_attempts=3, metadata={})
        raise Abandon
    # A write committed afterwards is announced; a notice of the rolled-back one would have gone
    # out before it or with it.
    committed = make_task()
    assert recorded.arrived.wait(2)
    announced = [n["task_id"] for message in recorded.messages for n in message["tasks"]]
    assert announced == [str(committed.pk)]


# --- the real channel layer -----------------------------------------------------------------------


@pytest.fixture
def live_channel_layer(committed_db: None, settings: Any, monkeypatch: pytest.MonkeyPatch,
                       publishers: Any) -> Iterator[None]:
    """The real channels_postgres layer, on the test database, and a fresh publisher."""
    import channels_postgres.db

    if django_settings.REDIS_URL:
        pytest.skip("these run against the embedded layer (channels_postgres)")
    layer = dict(settings.CHANNEL_LAYERS["default"])
    layer["CONFIG"] = {**layer["CONFIG"], "NAME": connection.settings_dict["NAME"]}
    settings.CHANNEL_LAYERS = {"default": layer}
    settings.BACKPLANE_LIVE_NOTICES = True
    monkeypatch.setattr(live, "publisher", live.NoticePublisher())
    # Its pool and the lock that guards it are module globals bound to the first loop that
    # used them; each test runs its own loop.
    monkeypatch.setattr(channels_postgres.db, "connection_pool", None)
    monkeypatch.setattr(channels_postgres.db, "is_creating_connection_pool", asyncio.Lock())
    yield


def session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


class Socket(ApplicationCommunicator):
    """A WebSocket client speaking ASGI to the product's application (channels.testing's
    communicator would do, but its package imports daphne, which the product does not use)."""

    def __init__(self, path: str, cookie: bytes | None) -> None:
        from backplane.asgi import application

        headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
        if cookie:
            headers.append((b"cookie", cookie))
        super().__init__(application, {"type": "websocket", "path": path, "headers": headers, "query_string": b"",
                                       "subprotocols": [], "scheme": "ws", "client": ("127.0.0.1", 1),
                                       "server": ("127.0.0.1", 80)})

    async def open(self) -> bool:
        await self.send_input({"type": "websocket.connect"})
        answer = await self.receive_output(5)
        if answer["type"] == "websocket.accept":
            return True
        # Refused: the client hangs up too, so the application ends instead of waiting for it
        # (asyncio.run would otherwise wait on it when it closes the loop).
        await self.disconnect()
        return False

    async def receive_json_from(self, timeout: float = 5) -> dict[str, Any]:
        answer = await self.receive_output(timeout)
        assert answer["type"] == "websocket.send", answer
        return json.loads(answer["text"])

    async def disconnect(self) -> None:
        await self.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.wait(1)


async def connect(path: str, cookie: bytes | None) -> tuple[Socket, bool]:
    socket = Socket(path, cookie)
    return socket, await socket.open()


# channels_postgres's group_discard uses a connection of its own name (a mirror of the default).
uses_the_layer = pytest.mark.django_db(transaction=True, databases=["default", "channels_postgres"])


@uses_the_layer
def test_a_socket_is_refused_to_anonymous_and_non_staff_users(live_channel_layer: None, victor: User) -> None:
    cookie = session_cookie(victor)

    async def scenario() -> tuple[bool, bool]:
        _, anonymous = await connect("/ws/fleet/", None)
        _, not_staff = await connect("/ws/fleet/", cookie)
        return anonymous, not_staff

    assert asyncio.run(scenario()) == (False, False)


@uses_the_layer
def test_an_append_reaches_an_open_socket_through_the_layer(live_channel_layer: None, olivia: User,
                                                            make_task: Any) -> None:
    cookie = session_cookie(olivia)
    # Written before any socket opened: announce nothing yet, as in a web process, where the
    # first request binds the publisher to the server's loop before any write.
    django_settings.BACKPLANE_LIVE_NOTICES = False
    task, other = make_task(), make_task()
    django_settings.BACKPLANE_LIVE_NOTICES = True

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], float]:
        fleet, ok_fleet = await connect("/ws/fleet/", cookie)
        one, ok_one = await connect(f"/ws/tasks/{task.pk}/", cookie)
        assert ok_fleet and ok_one
        started = time.monotonic()
        await sync_to_async(services.event_append, thread_sensitive=False)(
            namespace="acme", task_id=other.pk, agent="planner", draft=EventDraft(type="NoteTaken", payload={})
        )
        await sync_to_async(services.event_append, thread_sensitive=False)(
            namespace="acme", task_id=task.pk, agent="planner", draft=EventDraft(type="NoteTaken", payload={})
        )
        to_fleet = await fleet.receive_json_from(timeout=5)
        to_task = await one.receive_json_from(timeout=5)
        elapsed = time.monotonic() - started
        # The task page's socket forwarded its own task's notice only.
        while not any(n["task_id"] == str(task.pk) for n in to_fleet["tasks"]):
            to_fleet = await fleet.receive_json_from(timeout=5)
        await fleet.disconnect()
        await one.disconnect()
        return to_fleet, to_task, elapsed

    to_fleet, to_task, elapsed = asyncio.run(scenario())
    assert {n["task_id"] for n in to_task["tasks"]} == {str(task.pk)}
    assert to_task["tasks"][0]["seq"] == 2 and to_task["tasks"][0]["type"] == "NoteTaken"
    assert str(task.pk) in {n["task_id"] for n in to_fleet["tasks"]}
    assert elapsed < 1.5


def test_new_dead_letters_are_announced_once_committed(committed_db: None, recorded: Sent) -> None:
    from django.utils import timezone

    from backplane.delivery.announcements import announce_dead_letters
    from backplane.delivery.models import DeadLetter

    with transaction.atomic():
        DeadLetter.objects.create(source="outbox", reference="m-1", payload={}, error="gone", attempts=5,
                                  created_at=timezone.now())
        announce_dead_letters(source="outbox")
    assert recorded.arrived.wait(2)
    assert recorded.messages[-1]["dead_letters"] == 1 and recorded.messages[-1]["tasks"] == []
