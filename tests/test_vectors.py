"""The product's own vectors (vectors/product.json; vectors/README.md), which every implementation
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
from backplane.integrity.audit.verify import VerificationProblem, verify_event_lines
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
