"""/api/v1/dead-letters/: reviewers requeue or discard what automation gave up on."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView, errors, principal_of, query_int, validated
from api.permissions import Reviewer
from api.serializers import (
    JSONObjectField,
    StrictBooleanField,
    StrictCharField,
    StrictSerializer,
    optional_timestamp,
)
from backplane.delivery import selectors as delivery_selectors
from backplane.delivery.models import DeadLetter, DeadLetterStatus
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import InvalidInput
from backplane.runtime.replica import replica_reads
from recovery import dead_letters


class DeadLetterOut(serializers.Serializer):
    id = serializers.IntegerField()
    # DRF's metaclass takes declared fields off the class, so this never shadows Field.source.
    source = serializers.CharField()  # type: ignore[assignment]
    task_id = serializers.UUIDField(allow_null=True)
    topic = serializers.CharField()
    payload = JSONObjectField()
    error = serializers.CharField()
    attempts = serializers.IntegerField()
    status = serializers.ChoiceField(choices=DeadLetterStatus.values)
    created_at = serializers.CharField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.CharField(allow_null=True)
    reason = serializers.CharField()
    waiting_behind = serializers.IntegerField(
        min_value=0,
        help_text="Outbox dead letters under strict ordering, until decided: how many later messages of the same "
                  "key and destination wait for this decision (they are delivered after it when it is requeued, "
                  "without it when it is discarded). 0 otherwise.",
    )


class DeadLetterListOut(serializers.Serializer):
    results = DeadLetterOut(many=True)
    next = serializers.URLField(allow_null=True)


class RequeueIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)
    payload = JSONObjectField(required=False)


class DiscardIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)
    compensate = StrictBooleanField(
        required=False, default=False,
        help_text="task dead letters: fail the task for good and run its declared compensations",
    )


def dead_letter_as_api_dict(item: DeadLetter) -> dict[str, Any]:
    waiting_behind = getattr(item, "waiting_behind", None)
    if waiting_behind is None:
        waiting_behind = delivery_selectors.dead_letter_waiting_behind(item.pk)
    return {
        "id": item.pk,
        "source": item.source,
        "task_id": str(item.task_id) if item.task_id else None,
        "topic": item.topic,
        "payload": item.payload,
        "error": item.error,
        "attempts": item.attempts,
        "status": item.status,
        "created_at": format_timestamp(item.created_at),
        "decided_by": item.decided_by,
        "decided_at": optional_timestamp(item.decided_at),
        "reason": item.reason,
        "waiting_behind": waiting_behind,
    }


class DeadLettersView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="dead_letters_list",
        summary="Dead letters waiting for, or past, a reviewer's decision",
        description=(
            "Reviewers only (staff with the `review_deadletter` permission, by session or a token bound to that "
            "user); agents get 403. Outbox messages and tasks that automation gave up on, oldest first; follow "
            "`next` to page."
        ),
        parameters=[
            OpenApiParameter("status", str, enum=DeadLetterStatus.values, description="only items in this status"),
            OpenApiParameter("limit", int, description="1-1000, default 100"),
            OpenApiParameter("cursor", int, description="the `next` link's cursor"),
        ],
        responses={200: DeadLetterListOut, **errors(403)},
    )
    # A reviewer's list may come from the read replica (backplane/runtime/replica.py); deciding
    # an item locks it on the primary, so a stale row can never be decided twice.
    @replica_reads
    def get(self, request: Request) -> Response:
        status_filter = request.query_params.get("status")
        if status_filter is not None and status_filter not in DeadLetterStatus.values:
            raise InvalidInput("unknown status", {"status": f"one of {', '.join(DeadLetterStatus.values)}"})
        page = delivery_selectors.dead_letter_list(
            status=status_filter,
            limit=query_int(request.query_params, "limit", default=100, minimum=1, maximum=1000),
            after_id=query_int(request.query_params, "cursor", default=0, minimum=0),
        )
        next_url = None
        if page.next_cursor is not None:
            query = request.query_params.copy()
            query["cursor"] = str(page.next_cursor)
            next_url = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"results": [dead_letter_as_api_dict(d) for d in page.items], "next": next_url})


class DeadLetterRequeueView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="dead_letters_requeue",
        summary="Send a dead letter back to work",
        description=(
            "Reviewers only. The message or task goes back to work (optionally with an edited `payload`), and a "
            "task involved gets `DeadLetterRequeued` in its log. Deciding twice is `409 already_decided`."
        ),
        parameters=[OpenApiParameter("dead_letter_id", int, OpenApiParameter.PATH, description="the dead letter's id")],
        request=RequeueIn,
        examples=[OpenApiExample("requeue", request_only=True, value={"reason": "the CRM is back",
                                                                      "payload": {"lead": "alice@example.com"}})],
        responses={200: DeadLetterOut, **errors(403, 404, 409, conflicts=("already_decided",), body=True)},
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(RequeueIn, request.data)
        item = dead_letters.dead_letter_requeue(
            dead_letter_id=dead_letter_id, decided_by=decided_by, reason=data["reason"], payload=data.get("payload")
        )
        return Response(dead_letter_as_api_dict(item))


class DeadLetterDiscardView(ApiView):
    permission_classes = [IsAuthenticated, Reviewer]

    @extend_schema(
        operation_id="dead_letters_discard",
        summary="Give up on a dead letter for good",
        description=(
            "Reviewers only. Records the decision and writes `DeadLetterDiscarded` where a task is involved; "
            "`compensate: true` fails a task for good and runs its declared compensations. Deciding twice is "
            "`409 already_decided`."
        ),
        parameters=[OpenApiParameter("dead_letter_id", int, OpenApiParameter.PATH, description="the dead letter's id")],
        request=DiscardIn,
        examples=[OpenApiExample("discard", request_only=True,
                                 value={"reason": "duplicate lead", "compensate": False})],
        responses={200: DeadLetterOut, **errors(403, 404, 409, conflicts=("already_decided",), body=True)},
    )
    def post(self, request: Request, dead_letter_id: int) -> Response:
        decided_by = principal_of(request).name
        data = validated(DiscardIn, request.data)
        item = dead_letters.dead_letter_discard(
            dead_letter_id=dead_letter_id, decided_by=decided_by, reason=data["reason"], compensate=data["compensate"]
        )
        return Response(dead_letter_as_api_dict(item))
