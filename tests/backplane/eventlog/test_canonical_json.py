"""RFC 8785 against the RFC's own examples and the cyberphone reference vectors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from backplane.eventlog.canonical import CanonicalizationError, canonical_json, canonical_sha256

# A copy of ../shared/vectors, vendored so CI on a clean clone has them.
VECTORS = Path(__file__).resolve().parents[3] / "vectors" / "rfc8785"

PAIRS = ["arrays", "french", "structures", "unicode", "values", "weird"]


@pytest.mark.parametrize("name", PAIRS)
def test_it_produces_the_reference_bytes(name: str) -> None:
    value = json.loads((VECTORS / f"{name}.input.json").read_text(encoding="utf-8"))
    expected = (VECTORS / f"{name}.output.json").read_bytes()
    assert canonical_json(value) == expected


def test_it_matches_the_rfc_section_3_2_2_example() -> None:
    value = json.loads((VECTORS / "rfc8785-sec3.2.2.input.json").read_text(encoding="utf-8"))
    assert canonical_json(value) == (VECTORS / "rfc8785-sec3.2.2.output.json").read_bytes()


def test_it_sorts_keys_by_utf16_code_units() -> None:
    value = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.input.json").read_text(encoding="utf-8"))
    expected_order = json.loads((VECTORS / "rfc8785-sec3.2.3-sorting.expected-values-order.json").read_text())
    canonical = json.loads(canonical_json(value))
    assert list(canonical.values()) == expected_order


def _number_rows() -> list[dict]:
    data = json.loads((VECTORS / "numbers.json").read_text())
    return data["rows"] + data["extra_samples"]


@pytest.mark.parametrize("row", _number_rows(), ids=lambda r: r.get("ieee_hex", "?"))
def test_it_formats_numbers_as_ecmascript_does(row: dict) -> None:
    (number,) = struct.unpack(">d", bytes.fromhex(row["ieee_hex"]))
    if row.get("error"):
        with pytest.raises(CanonicalizationError):
            canonical_json(number)
    else:
        assert canonical_json(number).decode() == row["expected"]


def test_it_treats_big_integers_as_the_double_they_denote() -> None:
    # 1e21 goes into JSONB as a float and comes back as an integer; both must hash alike.
    assert canonical_json(10**21) == canonical_json(1e21) == b"1e+21"
    assert canonical_json({"n": 2**53 - 1}) == b'{"n":9007199254740991}'


def test_it_rejects_what_json_cannot_carry() -> None:
    for bad in (float("nan"), float("inf"), "\ud800", 10**400):
        with pytest.raises(CanonicalizationError):
            canonical_json(bad)


def test_the_digest_is_lowercase_hex_sha256_of_the_canonical_bytes() -> None:
    import hashlib

    value = {"b": [1, 2.5, "x"], "a": None}
    assert canonical_sha256(value) == hashlib.sha256(b'{"a":null,"b":[1,2.5,"x"]}').hexdigest()


# --- the standard-library fast path for float-free JSON must be byte-identical -------------

# Every code point except surrogates, with extra weight on the ones escaping and ordering
# disagree about most easily: control characters, the BMP's private-use end, astral planes.
_tricky_text = st.text(
    st.one_of(
        st.characters(exclude_categories=["Cs"]),
        st.sampled_from(["\x00", "\x1f", "\x7f", '"', "\\", "\b", "\f", "\n", "\r", "\t", "\u2028", "\ue000",
                         "\uffff", "\U00010000", "\U0001f600", "/"]),
    ),
    max_size=8,
)
_plain_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_plain_json)
def test_the_fast_path_agrees_with_the_reference_implementation(value: Any) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


def test_the_fast_path_refuses_lone_surrogates_in_keys_and_values() -> None:
    for bad in ({"\udfff": 1}, {"a": ["x\ud800"]}):
        with pytest.raises(CanonicalizationError):
            canonical_json(bad)


def test_the_fast_path_writes_every_code_point_as_the_reference_does() -> None:
    """Each character as a key (the Basic Multilingual Plane, where the fast path takes keys) and
    as a value (all planes): escapes and key order, byte for byte."""
    keys = {chr(c): c for c in reversed(range(0x10000)) if not 0xD800 <= c <= 0xDFFF}  # to be sorted
    values = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for value in (keys, {"values": values}):
        assert canonical_json(value) == rfc8785.dumps(value)
