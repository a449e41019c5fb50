"""/api/v1/tool-policies/: when a tool call needs a person's approval, set by operators (docs/approvals.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView, errors, principal_of, validated
from api.permissions import StaffViewerOperator
from api.serializers import StrictBooleanField, StrictCharField, StrictIntegerField, StrictSerializer
from backplane.eventlog.chain import format_timestamp
from recovery import approvals, selectors
from recovery.approval_rules import FIELD_TYPES, MAX_CONDITION_CHARS, MAX_FIELDS
from recovery.models import ExpiryAction, ToolPolicy


class ToolPolicyIn(StrictSerializer):
    tool = StrictCharField(max_length=200, min_length=1, help_text="the tool name agents dispatch calls of")
    namespace = StrictCharField(max_length=100, required=False, allow_blank=True,
                                help_text="absent or empty: every namespace without a policy of its own")
    enabled = StrictBooleanField(required=False, default=True,
                                 help_text="false: from this version on, the tool's calls need no approval")
    condition = StrictCharField(
        max_length=MAX_CONDITION_CHARS, required=False, allow_blank=True,
        help_text='absent or empty: every call; else e.g. `amount > 1000 and currency == "EUR"`',
    )
    field_types = serializers.DictField(
        child=serializers.ChoiceField(choices=FIELD_TYPES), required=False,
        help_text="the type of each input field the condition names; a dotted name is a path into nested objects",
    )
    approvals_required = StrictIntegerField(min_value=1, max_value=10, required=False, default=1)
    approver_group = StrictCharField(max_length=150, min_length=1, help_text="the name of an existing group")
    open_seconds = StrictIntegerField(min_value=10, max_value=30 * 24 * 3600, required=False, default=3600)
    on_expiry = serializers.ChoiceField(choices=ExpiryAction.values, required=False, default=ExpiryAction.DENY)
    escalate_to = StrictCharField(max_length=150, required=False,
                                  help_text="with `on_expiry` escalate: the group asked once the first wait runs out")
    four_eyes = StrictBooleanField(required=False, default=True)
    reason = StrictCharField(max_length=2000, min_length=1)

    def validate_field_types(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_FIELDS:
            raise serializers.ValidationError(f"at most {MAX_FIELDS} fields")
        return value


class ToolPolicyOut(serializers.Serializer):
    id = serializers.IntegerField()
    tool = serializers.CharField()
    namespace = serializers.CharField(allow_null=True, help_text="null: every namespace without its own")
    version = serializers.IntegerField()
    current = serializers.BooleanField()
    enabled = serializers.BooleanField()
    condition = serializers.CharField(allow_null=True, help_text="null: every call")
    field_types = serializers.DictField(child=serializers.ChoiceField(choices=FIELD_TYPES))
    approvals_required = serializers.IntegerField()
    approver_group = serializers.CharField()
    open_seconds = serializers.IntegerField()
    on_expiry = serializers.ChoiceField(choices=ExpiryAction.values)
    escalate_to = serializers.CharField(allow_null=True)
    four_eyes = serializers.BooleanField()
    set_by = serializers.CharField()
    reason = serializers.CharField()
    created_at = serializers.CharField()


class ToolPolicyListOut(serializers.Serializer):
    results = ToolPolicyOut(many=True)


def tool_policy_as_api_dict(policy: ToolPolicy) -> dict[str, Any]:
    return {
        "id": policy.pk, "tool": policy.tool, "namespace": policy.namespace or None, "version": policy.version,
        "current": policy.is_current, "enabled": policy.enabled, "condition": policy.condition or None,
        "field_types": policy.field_types, "approvals_required": policy.approvals_required,
        "approver_group": policy.approver_group.name, "open_seconds": policy.open_seconds,
        "on_expiry": policy.on_expiry, "escalate_to": policy.escalate_to.name if policy.escalate_to else None,
        "four_eyes": policy.four_eyes, "set_by": policy.set_by, "reason": policy.reason,
        "created_at": format_timestamp(policy.created_at),
    }


class ToolPoliciesView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="tool_policies_list",
        summary="The current version of every tool policy",
        description="Staff only. A namespace's policy shadows the global one (`namespace` null) of the same tool.",
        responses={200: ToolPolicyListOut, **errors(403)},
    )
    def get(self, request: Request) -> Response:
        return Response({"results": [tool_policy_as_api_dict(policy) for policy in selectors.tool_policy_list()]})

    @extend_schema(
        operation_id="tool_policies_set",
        summary="Set a tool's approval policy: its next version",
        description=(
            "Operators only. Writes the next version of the policy of `tool` in `namespace` and makes it the "
            "current one; earlier versions stay as they were, and each approval request records the version it "
            "was decided under. Everything is checked first, and a refusal changes nothing: a condition that "
            "does not parse, uses anything but comparisons joined by `and`, `or`, `not`, or names a field not "
            "declared in `field_types` (or declared with an unknown type) is `400` with the reason under "
            "`details.condition`; a group that does not exist under `details.approver_group` or "
            "`details.escalate_to`. docs/approvals.md describes the condition language."
        ),
        request=ToolPolicyIn,
        examples=[OpenApiExample("payments over 1,000 EUR", request_only=True, value={
            "tool": "payments.transfer", "condition": 'amount > 1000 and currency == "EUR"',
            "field_types": {"amount": "number", "currency": "string"}, "approver_group": "Approvers",
            "approvals_required": 2, "open_seconds": 3600, "on_expiry": "escalate", "escalate_to": "Operators",
            "reason": "the finance team's rule from December"})],
        responses={201: ToolPolicyOut, **errors(403, body=True)},
    )
    def post(self, request: Request) -> Response:
        data = validated(ToolPolicyIn, request.data)
        policy = approvals.tool_policy_set(
            tool=data["tool"], namespace=data.get("namespace", ""), condition=data.get("condition", ""),
            field_types=data.get("field_types", {}), approvals_required=data["approvals_required"],
            approver_group=data["approver_group"], open_seconds=data["open_seconds"], on_expiry=data["on_expiry"],
            escalate_to=data.get("escalate_to"), four_eyes=data["four_eyes"], enabled=data["enabled"],
            set_by=principal_of(request).name, reason=data["reason"],
        )
        return Response(tool_policy_as_api_dict(policy), status=201)


class ToolPolicyView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="tool_policies_read",
        summary="One version of a tool policy, current or not",
        description="Staff only. A version is never changed: what an approval request was decided under reads "
                    "the same later.",
        parameters=[OpenApiParameter("policy_id", int, OpenApiParameter.PATH, description="the version's id")],
        responses={200: ToolPolicyOut, **errors(403, 404)},
    )
    def get(self, request: Request, policy_id: int) -> Response:
        return Response(tool_policy_as_api_dict(selectors.tool_policy_get(policy_id)))


class ToolPolicyVersionsView(ApiView):
    permission_classes = [IsAuthenticated, StaffViewerOperator]

    @extend_schema(
        operation_id="tool_policies_versions_list",
        summary="Every version of a tool policy, newest first",
        description="Staff only: the versions of the same tool and namespace as the one named, each with who set it "
                    "and why.",
        parameters=[OpenApiParameter("policy_id", int, OpenApiParameter.PATH, description="any version's id")],
        responses={200: ToolPolicyListOut, **errors(403, 404)},
    )
    def get(self, request: Request, policy_id: int) -> Response:
        policy = selectors.tool_policy_get(policy_id)
        versions = selectors.tool_policy_versions(tool=policy.tool, namespace=policy.namespace)
        return Response({"results": [tool_policy_as_api_dict(version) for version in versions]})
