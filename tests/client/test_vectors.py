"""The Python client against the product's vectors (vectors/product.json): its canonical JSON gives
every event's hash as the contract computes it (drop ``hash`` and ``position``, RFC 8785,
SHA-256), and with it the chain rule finds the first event out of place. The server's side is
tests/test_vectors.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from backplane_client import canonical_json

PRODUCT = json.loads((Path(__file__).resolve().parents[2] / "vectors" / "product.json").read_text())
ZERO = "0" * 64


def event_hash(event: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in event.items() if k not in ("hash", "position")})).hexdigest()


def first_invalid_seq(events: list[dict[str, Any]]) -> int | None:
    previous, expected_seq = ZERO, 1
    for event in events:
        if event["seq"] != expected_seq or event["prev_hash"] != previous or event_hash(event) != event["hash"]:
            return int(event["seq"])
        previous, expected_seq = event["hash"], expected_seq + 1
    return None


@pytest.mark.parametrize("chain", PRODUCT["chains"], ids=lambda c: c["name"])
def test_the_clients_canonical_json_checks_each_chain(chain: dict[str, Any]) -> None:
    assert first_invalid_seq(chain["events"]) == chain["first_invalid_seq"]


@pytest.mark.parametrize("vector", PRODUCT["idempotency_keys"], ids=lambda v: f"{v['tool']}-{v['step']}")
def test_the_contracts_idempotency_key(vector: dict[str, Any]) -> None:
    # The contract's definition (docs/api.md), as any client computes it to find its call again.
    text = f"{vector['task_id']}:{vector['step']}:{vector['tool']}"
    assert hashlib.sha256(text.encode()).hexdigest() == vector["idempotency_key"]
