"""Integrity routes (docs/api.md): the latest signed tree head, inclusion and consistency proofs."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import ApiView, errors, principal_of, query_int
from backplane.eventlog.errors import NotFound
from backplane.eventlog.models import Event
from backplane.integrity import sealing


class SignedTreeHeadOut(serializers.Serializer):
    tree_size = serializers.IntegerField()
    root_hash = serializers.CharField()
    signed_at = serializers.CharField()
    signature = serializers.CharField()
    public_key = serializers.CharField()


class InclusionProofOut(serializers.Serializer):
    leaf_index = serializers.IntegerField()
    tree_size = serializers.IntegerField()
    audit_path = serializers.ListField(child=serializers.CharField())


class ConsistencyProofOut(serializers.Serializer):
    first = serializers.IntegerField()
    second = serializers.IntegerField()
    proof = serializers.ListField(child=serializers.CharField())


class SealLatestView(ApiView):
    @extend_schema(
        operation_id="seals_latest",
        summary="The latest signed tree head",
        description=(
            "The RFC 6962 Merkle tree over every event's hash, as last sealed: its size, root and an Ed25519 "
            "signature over the RFC 8785 JSON of `{tree_size, root_hash, signed_at}`. 404 before the first seal."
        ),
        responses={200: SignedTreeHeadOut, **errors(404)},
    )
    def get(self, request: Request) -> Response:
        head = sealing.latest_head()
        return Response({"tree_size": head.tree_size, "root_hash": head.root_hash, "signed_at": head.signed_at,
                         "signature": head.signature, "public_key": head.public_key})


class EventProofView(ApiView):
    @extend_schema(
        operation_id="events_inclusion_proof",
        summary="RFC 6962 inclusion proof of an event in a signed tree",
        description=(
            "The audit path from the event's leaf (SHA-256 of 0x00 and the hash's 32 bytes) to the root of a "
            "signed tree, verifiable as RFC 9162 says. The event must belong to the caller's namespace."
        ),
        parameters=[
            OpenApiParameter("position", int, OpenApiParameter.PATH, description="the event's `position`"),
            OpenApiParameter("tree_size", int, description="a signed tree size; default the latest"),
        ],
        responses={200: InclusionProofOut, **errors(404)},
    )
    def get(self, request: Request, position: int) -> Response:
        namespace = principal_of(request).namespace
        visible = Event.objects.filter(position=position)
        if namespace is not None:
            visible = visible.filter(task__namespace=namespace)
        if not visible.exists():
            raise NotFound("event not found", {"position": position})
        query = request.query_params
        tree_size = query_int(query, "tree_size", default=0, minimum=1) if "tree_size" in query else None
        leaf_index, size, path = sealing.inclusion_proof_for_event(position=position, tree_size=tree_size)
        return Response({"leaf_index": leaf_index, "tree_size": size, "audit_path": path})


class SealConsistencyView(ApiView):
    @extend_schema(
        operation_id="seals_consistency_proof",
        summary="RFC 6962 consistency proof between two signed tree sizes",
        description="Proves that the tree of size `first` is a prefix of the tree of size `second` (RFC 9162).",
        parameters=[
            OpenApiParameter("first", int, required=True, description="the smaller signed tree size"),
            OpenApiParameter("second", int, required=True, description="the larger signed tree size"),
        ],
        responses={200: ConsistencyProofOut, **errors(404)},
    )
    def get(self, request: Request) -> Response:
        first = query_int(request.query_params, "first", default=0, minimum=1)
        second = query_int(request.query_params, "second", default=0, minimum=1)
        return Response({"first": first, "second": second,
                         "proof": sealing.consistency_proof_between(first=first, second=second)})
