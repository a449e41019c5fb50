"""Webhook signatures: round trip, tampering, replay window, malformed headers, rotation."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from pathlib import Path

import pytest

from backplane_client.signing import SIGNATURE_HEADER, SignatureError, sign, verify

SECRET = "whsec_test_only"
BODY = b'{"message_id":"6f1c2b9e-0d2a-4a55-9d0e-1f7c3b2a9e10","topic":"task.created","payload":{"n":1}}'
T = 1_700_000_000


def test_it_round_trips() -> None:
    header = sign(SECRET, BODY, timestamp=T)
    assert verify(SECRET, header, BODY, now=T) == T
    assert verify(SECRET, header, BODY, now=T + 300) == T  # the edge of the window is accepted


def test_it_uses_the_documented_format() -> None:
    expected = hmac.new(SECRET.encode(), f"{T}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, BODY, timestamp=T) == f"t={T},v1={expected}"
    assert SIGNATURE_HEADER == "Backplane-Signature"


def test_it_signs_with_the_current_time_by_default() -> None:
    header = sign(SECRET, BODY)
    verify(SECRET, header, BODY)  # now = time.time(), well within 300 s


@pytest.mark.parametrize(
    "body",
    [BODY.replace(b'"n":1', b'"n":2'), BODY + b" ", BODY[:-1], b""],
    ids=["changed", "appended", "truncated", "empty"],
)
def test_it_rejects_a_tampered_body(body: bytes) -> None:
    header = sign(SECRET, BODY, timestamp=T)
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, header, body, now=T)


def test_it_rejects_the_wrong_secret() -> None:
    header = sign("another-secret", BODY, timestamp=T)
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, header, BODY, now=T)


def test_it_rejects_a_changed_timestamp() -> None:
    """The timestamp is signed, so a replayer cannot refresh it."""
    signature = sign(SECRET, BODY, timestamp=T).split(",")[1]
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, f"t={T + 1000},{signature}", BODY, now=T + 1000)


@pytest.mark.parametrize("age", [301, 3600, -301], ids=["just-too-old", "an-hour-old", "from-the-future"])
def test_it_rejects_a_timestamp_outside_the_tolerance(age: int) -> None:
    header = sign(SECRET, BODY, timestamp=T)
    with pytest.raises(SignatureError, match="outside the tolerance of 300s"):
        verify(SECRET, header, BODY, now=T + age)


def test_it_honours_a_custom_tolerance() -> None:
    header = sign(SECRET, BODY, timestamp=T)
    assert verify(SECRET, header, BODY, now=T + 3600, tolerance_seconds=3600) == T
    with pytest.raises(SignatureError, match="outside the tolerance of 10s"):
        verify(SECRET, header, BODY, now=T + 11, tolerance_seconds=10)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("", "missing"),
        ("   ", "missing"),
        ("garbage", "malformed"),
        ("t=,v1=abc", "malformed"),
        ("=1,v1=abc", "malformed"),
        (f"t={T},,v1=abc", "malformed"),
        ("v1=abc", "exactly one t="),
        (f"t={T},t={T},v1=abc", "exactly one t="),
        ("t=yesterday,v1=abc", "not unix seconds"),
        ("t=-5,v1=abc", "not unix seconds"),
        ("t=1.5,v1=abc", "not unix seconds"),
        ("t=\u0661\u0662,v1=abc", "not unix seconds"),  # Arabic-Indic digits
        (f"t={T}", "no v1= signature"),
        (f"t={T},v0=abc", "no v1= signature"),
    ],
)
def test_it_rejects_malformed_headers(header: str, message: str) -> None:
    with pytest.raises(SignatureError, match=message):
        verify(SECRET, header, BODY, now=T)


def test_it_is_a_value_error() -> None:
    assert issubclass(SignatureError, ValueError)


def test_it_survives_non_ascii_signatures() -> None:
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, f"t={T},v1=\u00e9\u00e9\ud800", BODY, now=T)


def test_it_accepts_any_of_several_v1_signatures_for_rotation() -> None:
    old = sign("old-secret", BODY, timestamp=T).split(",")[1]
    new = sign("new-secret", BODY, timestamp=T).split(",")[1]
    header = f"t={T},{old},{new}"
    assert verify("old-secret", header, BODY, now=T) == T
    assert verify("new-secret", header, BODY, now=T) == T
    with pytest.raises(SignatureError, match="does not match"):
        verify("third-secret", header, BODY, now=T)


def test_it_tolerates_spaces_and_unknown_schemes() -> None:
    header = sign(SECRET, BODY, timestamp=T).replace(",", " , ") + ", v0=deadbeef, v2=whatever"
    assert verify(SECRET, header, BODY, now=T) == T


def test_it_rejects_an_uppercase_signature() -> None:
    t_part, v1 = sign(SECRET, BODY, timestamp=T).split(",")
    with pytest.raises(SignatureError, match="does not match"):
        verify(SECRET, f"{t_part},{v1.upper().replace('V1=', 'v1=')}", BODY, now=T)


def test_it_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        sign("", BODY, timestamp=T)
    with pytest.raises(TypeError, match="raw request bytes"):
        sign(SECRET, BODY.decode(), timestamp=T)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative"):
        sign(SECRET, BODY, timestamp=-1)
    with pytest.raises(ValueError, match="tolerance_seconds"):
        verify(SECRET, sign(SECRET, BODY, timestamp=T), BODY, now=T, tolerance_seconds=-1)


def test_it_imports_without_django_or_psycopg() -> None:
    """The package is for downstream consumers: no Django, no backplane, psycopg only on use."""
    code = (
        "import sys, backplane_client, backplane_client.signing, backplane_client.consumer\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'backplane', 'psycopg'})\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
