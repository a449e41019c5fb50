"""What every API module shares: the base view, the error responses for the schema, request
helpers and the 201-or-replayed answer. The one public module the API's views build on."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from backplane.api.authentication import Principal
from backplane.api.serializers import ErrorOut
from backplane.eventlog.errors import InvalidInput

REPLAY_HEADER = "Idempotent-Replay"


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """The contract's error body for each listed status, plus the ones every route can give."""
    common = {400, 401, 413, 429, 503}
    return {code: OpenApiResponse(ErrorOut) for code in sorted(common | set(statuses))}


def written_or_replayed(body: Any, *, replayed: bool) -> Response:
    """201 for a new write; 200 with ``Idempotent-Replay: true`` when the request was already applied."""
    if replayed:
        return Response(body, status=status.HTTP_200_OK, headers={REPLAY_HEADER: "true"})
    return Response(body, status=status.HTTP_201_CREATED)


def principal_of(request: Request) -> Principal:
    principal = request.user
    assert isinstance(principal, Principal)
    return principal


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class ApiView(APIView):
    permission_classes = [IsAuthenticated]


def query_int(request: Request, name: str, *, default: int, minimum: int, maximum: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer", {name: "must be an integer"}) from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise InvalidInput(f"{name} must be {bound}", {name: f"must be {bound}"})
    return value
