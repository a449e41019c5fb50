"""The product's own vectors (vectors/product.json and merkle.json; vectors/README.md), which every implementation
reads: the server's idempotency keys, event hashes, the offline verifier's chain checks and the
tree heads' signatures must reproduce them exactly. The Python client's side is
tests/client/test_vectors.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from backplane.eventlog.chain import api_event_hash
from backplane.integrity.audit.proof import ProofProblem, check_proof_bundle
from backplane.integrity.audit.verify import VerificationProblem, verify_event_lines
from backplane.integrity.merkle import (
    consistency_proof,
    event_leaf_hash,
    hashes_to_hex,
    inclusion_proof,
    root_from_leaf_hashes,
    verify_consistency,
    verify_inclusion,
)
from backplane.integrity.sealing import tree_head_message, verify_tree_head
from recovery.tool_calls import tool_call_key

PRODUCT = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "product.json").read_text())


@pytest.mark.parametrize("vector", PRODUCT["idempotency_keys"], ids=lambda v: f"{v['tool']}-{v['step']}")
def test_the_servers_idempotency_keys(vector: dict[str, Any]) -> None:
    assert tool_call_key(task_id=uuid.UUID(vector["task_id"]), step=vector["step"], tool=vector["tool"]) == \
        vector["idempotency_key"]


@pytest.mark.parametrize("event", PRODUCT["chains"][0]["events"], ids=lambda e: e["type"])
def test_the_servers_event_hashes(event: dict[str, Any]) -> None:
    assert api_event_hash(event) == event["hash"]


@pytest.mark.parametrize("chain", PRODUCT["chains"], ids=lambda c: c["name"])
def test_the_offline_verifiers_chain_checks(chain: dict[str, Any]) -> None:
    lines = [json.dumps(event).encode() for event in chain["events"]]
    if chain["valid"]:
        assert verify_event_lines(lines, source="vectors").events == len(lines)
        return
    with pytest.raises(VerificationProblem, match=f"seq {chain['first_invalid_seq']}\\b"):
        verify_event_lines(lines, source="vectors")


@pytest.mark.parametrize("head", PRODUCT["tree_heads"], ids=lambda h: h["name"])
def test_the_tree_heads_signatures(head: dict[str, Any]) -> None:
    fields = {name: head[name] for name in ("tree_size", "root_hash", "signed_at")}
    if "message" in head:
        assert tree_head_message(**fields).decode() == head["message"]
    assert verify_tree_head(**fields, signature=head["signature"], public_key=head["public_key"]) is head["valid"]


MERKLE = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "merkle.json").read_text())
MERKLE_LEAVES = [event_leaf_hash(event_hash) for event_hash in MERKLE["event_hashes"]]


def test_the_trees_leaves_and_roots() -> None:
    assert hashes_to_hex(MERKLE_LEAVES) == MERKLE["leaf_hashes"]
    for size, root in MERKLE["roots"].items():
        assert root_from_leaf_hashes(MERKLE_LEAVES[:int(size)]).hex() == root


def test_every_inclusion_proof_is_the_trees_and_verifies() -> None:
    for vector in MERKLE["inclusion"]:
        index, size = vector["leaf_index"], vector["tree_size"]
        assert hashes_to_hex(inclusion_proof(MERKLE_LEAVES, index, size)) == vector["path"], vector
        root = bytes.fromhex(MERKLE["roots"][str(size)])
        path = [bytes.fromhex(item) for item in vector["path"]]
        assert verify_inclusion(MERKLE_LEAVES[index], index, size, path, root)
        another_leaf = MERKLE_LEAVES[(index + 1) % len(MERKLE_LEAVES)]
        assert not verify_inclusion(another_leaf, index, size, path, root)


def test_every_consistency_proof_is_the_trees_and_verifies() -> None:
    for vector in MERKLE["consistency"]:
        first, second = vector["first"], vector["second"]
        assert hashes_to_hex(consistency_proof(MERKLE_LEAVES, first, second)) == vector["proof"], vector
        first_root, second_root = (bytes.fromhex(MERKLE["roots"][str(size)]) for size in (first, second))
        proof = [bytes.fromhex(item) for item in vector["proof"]]
        assert verify_consistency(first, second, first_root, second_root, proof)
        if first < second:
            assert not verify_consistency(first, second, second_root, second_root, proof)


@pytest.mark.parametrize("vector", MERKLE["proof_bundles"], ids=lambda v: v["name"])
def test_the_inclusion_proof_bundles(vector: dict[str, Any]) -> None:
    if vector["valid"]:
        assert check_proof_bundle(vector["bundle"], public_keys=[MERKLE["public_key"]]).startswith("OK")
        return
    with pytest.raises(ProofProblem, match=BUNDLE_PROBLEMS[vector["fails"]]):
        check_proof_bundle(vector["bundle"], public_keys=[MERKLE["public_key"]])


BUNDLE_PROBLEMS = {"event_hash": "content hashes to", "audit_path": "audit path does not lead",
                   "signature": "not signed by a trusted key"}


@pytest.mark.parametrize("head", ["a string", {"tree_size": 11, "root_hash": MERKLE["roots"]["11"]},
                                  {**MERKLE["proof_bundles"][0]["bundle"]["tree_head"], "signature": 7}],
                         ids=["not-an-object", "no-signature", "signature-not-text"])
def test_a_malformed_tree_head_is_a_problem_named_not_a_crash(head: object) -> None:
    bundle = {**MERKLE["proof_bundles"][0]["bundle"], "tree_head": head}
    with pytest.raises(ProofProblem):
        check_proof_bundle(bundle, public_keys=[MERKLE["public_key"]])
