"""/api/v1/tasks/{id}/signals/{name}/: a task waits durably for a named signal, and someone or
something outside sends it (docs/approvals.md, "Signals"). Agent routes: an agent's wait for the
signal (``?wait=`` seconds) runs on the HTTP front without a thread or a held connection."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import exceptions, status
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.approvals import WAIT_MAX_SECONDS, read_wait_seconds
from api.base import Answer, errors
from api.bodies import SignalOut, SignalSendIn, SignalWaitIn, SignalWaitOut, answer_ref, checked, request_ref
from api.permissions import AgentOrViewerOperator
from api.routes import AgentRoute, Operation
from api.serializers import optional_timestamp
from api.throttling import Window, count_into
from recovery import signals
from recovery.models import TaskSignal

_PATH = [
    OpenApiParameter("task_id", uuid.UUID, OpenApiParameter.PATH, description="the task's id"),
    OpenApiParameter("name", str, OpenApiParameter.PATH,
                     description="the signal's name: 1 to 100 letters, digits, - and _"),
]


def signal_as_api_dict(signal: TaskSignal) -> dict[str, Any]:
    return {"task_id": str(signal.task_id), "name": signal.name, "status": signal.status, "payload": signal.payload,
            "awaited_by": signal.awaited_by, "awaited_at": optional_timestamp(signal.awaited_at),
            "expires_at": optional_timestamp(signal.expires_at), "sent_by": signal.sent_by,
            "received_at": optional_timestamp(signal.received_at),
            "timed_out_at": optional_timestamp(signal.timed_out_at)}


def signal_wait(principal: Any, data: dict[str, Any], *, task_id: uuid.UUID, name: str, url: str) -> Answer:
    """The wait's answer carries the signal's callback URL, for the agent to hand to whoever
    should send it (a job it started, another system's webhook)."""
    signal, began = signals.signal_await(namespace=principal.namespace, task_id=task_id, name=name,
                                         timeout_seconds=data["timeout_seconds"], agent=principal.name,
                                         lease_epoch=data.get("lease_epoch"), kinds=principal.kinds)
    callback = urljoin(url, reverse("signal-callback", kwargs={"token": signals.signal_callback_token(signal)}))
    return Answer({**signal_as_api_dict(signal), "callback_url": callback},
                  status.HTTP_201_CREATED if began else status.HTTP_200_OK)


def signal_read(principal: Any, query: Mapping[str, str], *, task_id: uuid.UUID, name: str) -> Answer:
    """On Django's stack (a staff session) the answer is given at once; ``wait`` is checked and
    honoured by the HTTP front, which serves agents."""
    read_wait_seconds(query)
    return Answer(signal_as_api_dict(signals.signal_get(namespace=principal.namespace, task_id=task_id, name=name)))


def signal_send(principal: Any, data: dict[str, Any], *, task_id: uuid.UUID, name: str) -> Answer:
    signal, delivered = signals.signal_send(namespace=principal.namespace, task_id=task_id, name=name,
                                            payload=dict(data["payload"]), sent_by=str(principal.name),
                                            agent=principal.name if principal.agent else None,
                                            kinds=principal.kinds)
    return Answer(signal_as_api_dict(signal), status.HTTP_201_CREATED if delivered else status.HTTP_200_OK)


# A callback's sends, per signal and minute: a job that retries its call a few times stays well
# inside; a leaked URL sends its one signal, then at most this many refusals a minute (each of
# which takes the task's row lock to read the signal).
CALLBACK_SENDS_PER_MINUTE = 10


class SignalCallbackView(APIView):
    """The one route that takes no credentials: the token in its path is the credential, good for
    one signal of one task (recovery/signals.py), and counted per signal
    (``CALLBACK_SENDS_PER_MINUTE``), whoever holds it."""

    authentication_classes: list[type[BaseAuthentication]] = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="signal_callbacks_send",
        summary="Send a signal with its callback token",
        description=(
            "For whoever the waiting agent handed the wait's `callback_url` to (a job it started, a webhook of "
            "another system): no account and no header, the token in the path is good for this one signal of this "
            "one task. `201` and `SignalReceived` (sent by `callback:<the agent that waited>`); the same payload "
            "again is `200`; another payload, or a wait that ran out, is `409 already_decided`; a closed task "
            "`409 task_closed`. A token that is not one of the server's is `404`; past 10 sends a minute for one "
            "signal, `429`."
        ),
        parameters=[OpenApiParameter("token", str, OpenApiParameter.PATH,
                                     description="the token of the wait's `callback_url`")],
        request={"application/json": request_ref(SignalSendIn)},
        auth=[],
        examples=[OpenApiExample("a job's result", request_only=True,
                                 value={"payload": {"job": "render-42", "status": "done"}})],
        # No credentials are read, so none is ever missing: every error but 401.
        responses={201: answer_ref(SignalOut), 200: answer_ref(SignalOut),
                   **{code: answer for code, answer in errors(404, 409, 429, conflicts=("already_decided",
                                                                                      "task_closed"),
                                                              body=True).items() if code != 401}},
    )
    def post(self, request: Request, token: str) -> Response:
        task_id, name = signals.signal_callback_target(token)
        window = Window(limit=CALLBACK_SENDS_PER_MINUTE, ends_at=(time.time() // 60 + 1) * 60)
        wait = window.wait_after(count_into(f"signal-callback:{task_id}:{name}", window))
        if wait is not None:
            raise exceptions.Throttled(wait=wait)
        data = checked(SignalSendIn, request.data)
        signal, delivered = signals.signal_send_by_callback(task_id=task_id, name=name, payload=dict(data["payload"]))
        return Response(signal_as_api_dict(signal),
                        status=status.HTTP_201_CREATED if delivered else status.HTTP_200_OK)


signal_wait_route = AgentRoute(
    "SignalWaitView",
    post=Operation(signal_wait, dict(
        operation_id="tasks_signals_wait",
        summary="Wait durably for a named signal",
        description=(
            "The task's lease holder waits for the signal `name` for at most `timeout_seconds`: `201` and "
            "`SignalAwaited` in the task's log. Again (a retry, or the next attempt after a crash): `200`, the "
            "signal as it stands. A signal sent before the wait is found by it (`status: received`). While a "
            "task waits the stall detector leaves it alone; read the signal with `tasks_signals_read` and "
            "`wait`. When the time runs out the signal is `timed_out` (`SignalTimedOut`). `callback_url` sends this "
            "one signal with no credentials (`signal_callbacks_send`): hand it to whoever should send it."
        ),
        parameters=_PATH,
        request=SignalWaitIn,
        examples=[OpenApiExample("wait a day", request_only=True, value={"timeout_seconds": 86400,
                                                                          "lease_epoch": 4})],
        responses={201: answer_ref(SignalWaitOut), 200: answer_ref(SignalWaitOut),
                   **errors(403, 404, 409, body=True)},
    ), agents_only=True, with_url=True),
)

signal_route = AgentRoute(
    "SignalView",
    permission=AgentOrViewerOperator,
    get=Operation(signal_read, dict(
        operation_id="tasks_signals_read",
        summary="A task's signal, waiting for it if asked to",
        description=(
            "The signal `name` of a task of the caller's namespace: `waiting`, `received` (with its `payload` "
            f"and `sent_by`) or `timed_out`. With `wait` (seconds, at most {WAIT_MAX_SECONDS}) an agent's "
            "request is answered as soon as the status changes, the wait holding no thread and no database "
            "connection; staff get the answer at once. `404` when the signal was neither waited for nor sent."
        ),
        parameters=[*_PATH, OpenApiParameter("wait", int, OpenApiParameter.QUERY, required=False,
                                             description=f"seconds to wait, 0 to {WAIT_MAX_SECONDS}; default 0")],
        responses={200: answer_ref(SignalOut), **errors(404)},
    )),
    post=Operation(signal_send, dict(
        operation_id="tasks_signals_send",
        summary="Send a task a named signal",
        description=(
            "By an agent of the task's namespace (a webhook or a long-running job can hold such a token) or an "
            "operator: `201` and `SignalReceived` (the payload and who sent it) in the task's log, which ends "
            "its wait. The same payload again is `200`, the signal as received; another payload, or a signal "
            "whose wait ran out, is `409 already_decided`; a closed task is `409 task_closed`."
        ),
        parameters=_PATH,
        request=SignalSendIn,
        examples=[OpenApiExample("an invoice paid", request_only=True,
                                 value={"payload": {"invoice": "INV-7", "paid_at": "2026-12-06T10:00:00Z"}})],
        responses={201: answer_ref(SignalOut), 200: answer_ref(SignalOut),
                   **errors(403, 404, 409, conflicts=("already_decided", "task_closed"), body=True)},
    )),
)
