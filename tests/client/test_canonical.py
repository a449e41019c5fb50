"""The client's RFC 8785 canonical JSON (the rfc8785 package, as the server's) against the RFC's vectors and the
server's own hash: an ``LLMCalled`` the SDK records must carry the ``prompt_sha256`` the server
computes for the same prompt, or the append is refused."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backplane.eventlog.canonical import canonical_json as server_canonical_json
from backplane.eventlog.event_types import prompt_sha256 as server_prompt_sha256
from backplane_client import CanonicalizationError, canonical_json, prompt_sha256

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "rfc8785"


@pytest.mark.parametrize("name", ["arrays", "french", "structures", "unicode", "values", "weird"])
def test_it_produces_the_reference_bytes(name: str) -> None:
    value = json.loads((VECTORS / f"{name}.input.json").read_text(encoding="utf-8"))
    assert canonical_json(value) == (VECTORS / f"{name}.output.json").read_bytes()


def test_it_matches_the_rfc_example_and_sorts_keys_by_utf16_code_units() -> None:
    value = json.loads((VECTORS / "rfc8785-sec3.2.2.input.json").read_text(encoding="utf-8"))
    assert canonical_json(value) == (VECTORS / "rfc8785-sec3.2.2.output.json").read_bytes()
    sorting = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.input.json").read_text(encoding="utf-8"))
    expected = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.expected-values-order.json").read_text())
    assert list(json.loads(canonical_json(sorting)).values()) == expected


def _number_rows() -> list[dict[str, Any]]:
    data = json.loads((VECTORS / "numbers.json").read_text())
    rows: list[dict[str, Any]] = data["rows"] + data["extra_samples"]
    return rows


@pytest.mark.parametrize("row", _number_rows(), ids=lambda row: str(row.get("ieee_hex", "?")))
def test_it_writes_numbers_as_ecmascript_does(row: dict[str, Any]) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(row["ieee_hex"]))
    if row.get("error"):
        with pytest.raises(CanonicalizationError):
            canonical_json(number)
    else:
        assert canonical_json(number).decode() == row["expected"]


def test_big_integers_are_the_double_they_denote_as_on_the_server() -> None:
    for value in (10**21, 2**53, -(2**60) - 1, {"n": 2**53 - 1}, [1e21, 10**21]):
        assert canonical_json(value) == server_canonical_json(value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "\ud800", {"\udfff": 1}, {1: "x"}, {"a": {1, 2}},
                                 10**400])
def test_it_refuses_what_has_no_canonical_form(bad: Any) -> None:
    with pytest.raises(CanonicalizationError):
        canonical_json(bad)


def test_the_prompt_hash_is_hex_sha256_of_the_canonical_bytes() -> None:
    prompt = [{"role": "user", "content": "Score Acme"}, {"temperature": 0.5}]
    expected = hashlib.sha256(b'[{"content":"Score Acme","role":"user"},{"temperature":0.5}]').hexdigest()
    assert prompt_sha256(prompt) == expected == server_prompt_sha256(prompt)
    # A string prompt hashes as its JSON string, quotes included.
    assert prompt_sha256("hi") == hashlib.sha256(b'"hi"').hexdigest() == server_prompt_sha256("hi")


_text = st.text(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from(["\x00", "\x1f", "\x7f", '"', "\\", "\b", "\f", "\n", "\r", "\t", "\u2028", "\ue000",
                         "\uffff", "\U00010000", "\U0001f600", "/"]),
    ),
    max_size=8,
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(_json)
def test_it_hashes_any_prompt_as_the_server_does(prompt: Any) -> None:
    assert canonical_json(prompt) == server_canonical_json(prompt)
    assert prompt_sha256(prompt) == server_prompt_sha256(prompt)

