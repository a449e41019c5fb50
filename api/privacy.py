"""/api/v1/personal-data/: sealed personal values opened for those allowed, looked up by a value
marked ``lookup``, and data subjects erased (docs/privacy.md). Sealing itself happens to every
agent route's body on its way in (api/routes.py, api/agent_front.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import exceptions, serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import Principal
from api.base import ApiView, errors, principal_of, validated
from api.permissions import PersonalDataReader, SubjectEraser
from api.serializers import StrictCharField, StrictSerializer, StrictUUIDField
from backplane.eventlog.chain import format_timestamp
from backplane.eventlog.errors import InvalidInput
from backplane.eventlog.models import user_actor
from backplane.privacy import services
from backplane.privacy.models import SUBJECT_MAX_LENGTH
from recovery.selectors import staff_namespace


@extend_schema_field({})
class AnyJSONField(serializers.Field):
    """Any JSON value, as parsed."""

    def to_internal_value(self, data: Any) -> Any:
        return data

    def to_representation(self, value: Any) -> Any:
        return value


_NAMESPACE_HELP = ("the namespace whose personal data it is: an agent's own (may be left out), a staff user's scope "
                   "(may be left out), or any for staff of every namespace (required)")


class OpenIn(StrictSerializer):
    value = AnyJSONField(help_text="any JSON holding envelopes as the API gave them: an event's payload, a task's "
                                   "input, a whole answer")
    namespace = StrictCharField(required=False, max_length=100, help_text=_NAMESPACE_HELP)
    task_id = StrictUUIDField(required=False, help_text="the task the values were read from, for the record of the "
                                                        "read")


class SubjectStateOut(serializers.Serializer):
    subject = serializers.CharField()
    erased_at = serializers.CharField(allow_null=True)


class OpenOut(serializers.Serializer):
    value = AnyJSONField(help_text="`value` with each envelope replaced by the value sealed in it, or by "
                                   '`{"$personal": {"subject", "erased_at"}}` when its subject was erased')
    subjects = SubjectStateOut(many=True)


class LookupIn(StrictSerializer):
    value = AnyJSONField(help_text="the exact value a client marked with `lookup: true`")
    namespace = StrictCharField(required=False, max_length=100, help_text=_NAMESPACE_HELP)


class LookupOut(serializers.Serializer):
    subjects = serializers.ListField(child=serializers.CharField())


class EraseIn(StrictSerializer):
    subject = StrictCharField(max_length=SUBJECT_MAX_LENGTH, min_length=1)
    reason = StrictCharField(max_length=services.REASON_MAX_LENGTH, min_length=1)
    namespace = StrictCharField(required=False, max_length=100, help_text=_NAMESPACE_HELP)


class ErasedOut(serializers.Serializer):
    namespace = serializers.CharField()
    subject = serializers.CharField()
    erased_at = serializers.CharField()
    erased_by = serializers.CharField()
    reason = serializers.CharField()


def caller_namespace(principal: Principal, asked: str | None) -> str:
    """The namespace a caller acts in: an agent's own; a person's scope, or, unscoped, the one
    asked for (a token bound to an unscoped person: the one asked for, else its agent's). Another
    than the caller's is 403 (an agent never learns whether it exists)."""
    user = principal.user
    if principal.agent is not None and user is None:
        own: str | None = principal.namespace
    else:
        assert user is not None  # the permission admits only agents and people
        own = principal.namespace if principal.agent is None else staff_namespace(user_id=user.pk)
    if own is None:
        if asked is None and principal.agent is not None:
            return principal.namespace or ""  # a token bound to a person: its agent's namespace unless it says
        if asked is None:
            raise InvalidInput("say whose personal data it is", {"namespace": "required for staff of every namespace"})
        return asked
    if asked is not None and asked != own:
        raise exceptions.PermissionDenied(f"this caller acts in namespace {own} only")
    return own


def reader_of(principal: Principal) -> str | None:
    """Who is recorded as reading personal data: the person (or the person a token acts for);
    None for an agent, which reads its own namespace's data to work on it."""
    user = principal.user
    if user is None:
        return None
    return user_actor(user) if principal.agent is None else f"{user_actor(user)} (agent:{principal.name})"


class PersonalDataOpenView(ApiView):
    permission_classes = [IsAuthenticated, PersonalDataReader]

    @extend_schema(
        operation_id="personal_data_open",
        summary="Open sealed personal values",
        description=(
            "Agents open their namespace's envelopes; people need the `open_personal_data` permission (Privacy "
            "officers), and every read by a person (or a token bound to one) is recorded: who, which subjects, "
            "when. An envelope of an erased subject answers as erased; one of another namespace, or altered, is 400."
        ),
        request=OpenIn,
        responses={200: OpenOut, **errors(403, body=True)},
        examples=[OpenApiExample("a payload", request_only=True, value={"value": {"email": {"$personal": {
            "subject": "lead:8812", "sealed": "mC3v…"}}}})],
    )
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        data = validated(OpenIn, request.data)
        namespace = caller_namespace(principal, data.get("namespace"))
        opened = services.personal_open(namespace, data["value"], reader=reader_of(principal),
                                        where_read="api", task_id=data.get("task_id"))
        return Response({"value": opened.value, "subjects": opened.subjects})


class PersonalDataLookupView(ApiView):
    permission_classes = [IsAuthenticated, PersonalDataReader]

    @extend_schema(
        operation_id="personal_data_lookup",
        summary="Which data subjects a value marked for lookup belongs to",
        description=(
            "Exact match through a blind index (a keyed hash, never the value) of the values marked with "
            "`lookup: true`; erased subjects are never found. Who may: as for opening; a person's lookup is "
            "recorded as a read."
        ),
        request=LookupIn,
        responses={200: LookupOut, **errors(403, body=True)},
        examples=[OpenApiExample("an e-mail", request_only=True, value={"value": "ada@example.com"})],
    )
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        data = validated(LookupIn, request.data)
        namespace = caller_namespace(principal, data.get("namespace"))
        subjects = services.subjects_by_value(namespace, data["value"], reader=reader_of(principal))
        return Response({"subjects": subjects})


class SubjectEraseView(ApiView):
    permission_classes = [IsAuthenticated, SubjectEraser]

    @extend_schema(
        operation_id="personal_data_erase",
        summary="Erase a data subject",
        description=(
            "People with the `erase_subject` permission (Privacy officers), by session or a token bound to one "
            "(a privacy tool). The subject's key is destroyed: every value sealed for it, in the log, exports, "
            "backups and delivered messages, can no longer be opened, while every chain, seal and proof still "
            "verifies. A `SubjectErased` message goes out on `backplane.privacy`. An unknown subject is 404; an "
            "erased one `409 subject_erased`; neither changes anything."
        ),
        request=EraseIn,
        responses={200: ErasedOut, **errors(403, 404, 409, conflicts=("subject_erased",), body=True)},
        examples=[OpenApiExample("a request under article 17", request_only=True, value={
            "namespace": "acme", "subject": "lead:8812", "reason": "erasure request #4411 (GDPR art. 17)"})],
    )
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        data = validated(EraseIn, request.data)
        namespace = caller_namespace(principal, data.get("namespace"))
        user = principal.user
        assert user is not None  # SubjectEraser admits people and the tokens bound to them
        erased = services.subject_erase(namespace=namespace, subject=data["subject"], reason=data["reason"],
                                        erased_by=reader_of(principal) or user_actor(user))
        assert erased.erased_at is not None
        return Response({"namespace": erased.namespace, "subject": erased.subject,
                         "erased_at": format_timestamp(erased.erased_at), "erased_by": erased.erased_by,
                         "reason": erased.erase_reason})
