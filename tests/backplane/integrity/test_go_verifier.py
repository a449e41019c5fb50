"""The independent Go verifier (verifier/, issue 45) against the Python one: the same exports,
untouched and tampered with, verified by both, must get the same verdict: the same exit code,
the same summary, and on a problem the same segment (and line) named."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from backplane.eventlog.chain import api_event_hash
from backplane.eventlog.models import Event
from backplane.integrity import sealing, selectors
from backplane.integrity.audit import export
from backplane.integrity.audit import manifest as fmt
from tests.backplane.integrity.audit_support import (
    REPO,
    S3_CREDENTIALS,
    Exported,
    append,
    reseal,
    resign,
    rewrite_history,
    run_verifier,
    seed,
    segment_lines,
    verifier_env,
    write_lines,
)
from tests.backplane.integrity.test_audit_approvals import (
    approved_payment,
    exported_with_the_approved_arguments_changed,
)

pytestmark = pytest.mark.slow

VERIFIER = REPO / "verifier"
# "segment 2 (segment-00000002.jsonl) line 4" or "segment 1 (segment-00000001.manifest.json)".
WHERE = re.compile(r"segment \d+ \(segment-\d+\.(?:jsonl|manifest\.json)\)(?: line \d+)?")


def go_command() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is not on PATH: run `make go` (the Go toolchain and the verifier's modules) first")
    return go


@pytest.fixture(scope="module")
def go_verifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go command, built once from verifier/ with the modules go.sum pins."""
    binary = tmp_path_factory.mktemp("go-verifier") / "backplane-verify"
    result = subprocess.run([go_command(), "build", "-o", str(binary), "./cmd/backplane-verify"], cwd=VERIFIER,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return binary


@dataclass
class Verdict:
    code: int
    stdout: str
    stderr: str

    @property
    def where(self) -> str | None:
        """The segment (and line) a failure names."""
        match = WHERE.search(self.stderr)
        return match.group(0) if match else None


def python_verify(location: str | Path, *keys: str, args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None) -> Verdict:
    result = run_verifier(location, *keys, args=args, env=env)
    return Verdict(result.returncode, result.stdout, result.stderr)


def go_verify(binary: Path, location: str | Path, *keys: str, args: tuple[str, ...] = (),
              env: dict[str, str] | None = None) -> Verdict:
    command = [str(binary), "verify", str(location), *args]
    for key in keys:
        command += ["--public-key", key]
    result = subprocess.run(command, env=env or verifier_env(), capture_output=True, text=True, timeout=120)
    return Verdict(result.returncode, result.stdout, result.stderr)


def both_verify(binary: Path, location: str | Path, *keys: str, args: tuple[str, ...] = (),
                env: dict[str, str] | None = None) -> tuple[Verdict, Verdict]:
    return (python_verify(location, *keys, args=args, env=env),
            go_verify(binary, location, *keys, args=args, env=env))


def assert_both_ok(python: Verdict, go: Verdict) -> None:
    assert python.code == 0, python.stderr
    assert go.code == 0, go.stderr
    assert go.stdout == python.stdout


def assert_both_fail_at(python: Verdict, go: Verdict, where: str) -> None:
    assert (python.code, python.where) == (1, where), python.stderr
    assert (go.code, go.where) == (1, where), go.stderr
    # The words too: the Go verifier was written to say what the Python one says.
    assert go.stderr == python.stderr


# --- an export of two segments, and what an attacker does to it ------------------------------


def another_key() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    return key, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def change_a_byte(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    lines[2] = lines[2].replace(b'"step":', b'"stop":', 1)
    write_lines(exported, 2, lines)


def change_a_byte_and_reseal(exported: Exported) -> None:
    change_a_byte(exported)
    reseal(exported, 2)


def remove_an_event(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    del lines[2]
    write_lines(exported, 2, lines)
    reseal(exported, 2)


def edit_an_event_and_its_hash(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    event = json.loads(lines[2])
    event["payload"] = {"step": 999}
    event["hash"] = api_event_hash(event)
    lines[2] = json.dumps(event).encode() + b"\n"
    write_lines(exported, 2, lines)
    reseal(exported, 2)


def resign_the_manifest_with_another_key(exported: Exported) -> None:
    forger, _ = another_key()
    resign(exported.path, 2, lambda manifest: None, key=forger)  # the trusted key is still claimed


def resign_the_manifest_as_another_key(exported: Exported) -> None:
    forger, forger_public = another_key()
    resign(exported.path, 2, lambda manifest: manifest.update(public_key=forger_public), key=forger)


def resign_the_tree_head_with_another_key(exported: Exported) -> None:
    """A head signed by another key, claiming the trusted one, in a manifest the insider re-signs."""
    forger, _ = another_key()

    def change(manifest: dict[str, Any]) -> None:
        head = manifest["signed_tree_head"]
        message = fmt.tree_head_message(tree_size=head["tree_size"], root_hash=head["root_hash"],
                                         signed_at=head["signed_at"])
        head["signature"] = forger.sign(message).hex()

    resign(exported.path, 2, change)


def resign_the_tree_head_as_another_key(exported: Exported) -> None:
    forger, forger_public = another_key()

    def change(manifest: dict[str, Any]) -> None:
        head = manifest["signed_tree_head"]
        message = fmt.tree_head_message(tree_size=head["tree_size"], root_hash=head["root_hash"],
                                         signed_at=head["signed_at"])
        head.update(signature=forger.sign(message).hex(), public_key=forger_public)

    resign(exported.path, 2, change)


def break_the_manifest_chain(exported: Exported) -> None:
    resign(exported.path, 2, lambda manifest: manifest.update(previous_manifest_sha256="1" * 64))


def remove_the_first_manifest(exported: Exported) -> None:
    (exported.path / fmt.manifest_name(1)).unlink()


MANIFEST_2 = "segment 2 (segment-00000002.manifest.json)"
SEGMENT_2 = "segment 2 (segment-00000002.jsonl)"
TAMPERING: dict[str, tuple[Callable[[Exported], None], str]] = {
    # Segment 2 in leaf order: third#1, third#2, first#4, second#4, first#5, second#5.
    "a changed byte": (change_a_byte, SEGMENT_2),
    "a changed byte, the manifest re-signed": (change_a_byte_and_reseal, f"{SEGMENT_2} line 3"),
    "a removed event": (remove_an_event, f"{SEGMENT_2} line 4"),
    "an event edited with its hash": (edit_an_event_and_its_hash, f"{SEGMENT_2} line 5"),
    "the manifest re-signed with another key": (resign_the_manifest_with_another_key, MANIFEST_2),
    "the manifest re-signed as another key": (resign_the_manifest_as_another_key, MANIFEST_2),
    "the tree head re-signed with another key": (resign_the_tree_head_with_another_key, MANIFEST_2),
    "the tree head re-signed as another key": (resign_the_tree_head_as_another_key, MANIFEST_2),
    "a broken manifest chain": (break_the_manifest_chain, MANIFEST_2),
}


def test_both_verify_an_untouched_export_with_the_same_summary(go_verifier: Path, exported: Exported) -> None:
    python, go = both_verify(go_verifier, exported.path, exported.public_key)

    assert_both_ok(python, go)
    assert go.stdout.startswith(f"OK {exported.path.resolve().as_uri()}: 2 segment(s), {Event.objects.count()} "
                                "event(s), 3 task(s)\n")


def test_both_read_the_key_as_hex_a_file_or_pem(go_verifier: Path, exported: Exported, tmp_path: Path) -> None:
    hex_file = tmp_path / "key.hex"
    hex_file.write_text(exported.public_key.upper() + "\n")
    pem_file = tmp_path / "key.pem"
    pem_file.write_bytes(sealing.signing_key().public_key().public_bytes(Encoding.PEM,
                                                                         PublicFormat.SubjectPublicKeyInfo))
    for key in (str(hex_file), str(pem_file)):
        assert_both_ok(*both_verify(go_verifier, exported.path, key))
    python, go = both_verify(go_verifier, exported.path, "not-a-key")
    assert (python.code, go.code) == (2, 2)
    assert go.stderr == python.stderr


def test_both_refuse_a_location_that_cannot_be_read(go_verifier: Path, tmp_path: Path, public_key: str) -> None:
    python, go = both_verify(go_verifier, tmp_path / "nowhere", public_key)
    assert (python.code, go.code) == (2, 2)
    python, go = both_verify(go_verifier, "ftp://example.com/audit", public_key)
    assert (python.code, go.code) == (2, 2)
    assert go.stderr == python.stderr


@pytest.mark.parametrize(("tamper", "where"), TAMPERING.values(), ids=TAMPERING.keys())
def test_both_fail_a_tampered_export_at_the_same_place(
    go_verifier: Path,
    exported: Exported,
    tamper: Callable[[Exported], None],
    where: str,
) -> None:
    tamper(exported)

    python, go = both_verify(go_verifier, exported.path, exported.public_key)

    assert_both_fail_at(python, go, where)


def test_both_refuse_an_export_signed_by_a_key_they_were_not_given(go_verifier: Path, exported: Exported) -> None:
    _, stranger = another_key()

    python, go = both_verify(go_verifier, exported.path, stranger)

    assert_both_fail_at(python, go, "segment 1 (segment-00000001.manifest.json)")
    assert "not a trusted public key" in go.stderr


def test_both_notice_a_missing_segment(go_verifier: Path, exported: Exported) -> None:
    remove_the_first_manifest(exported)

    python, go = both_verify(go_verifier, exported.path, exported.public_key)

    assert (python.code, go.code) == (1, 1)
    assert "segment 1 is missing" in go.stderr and go.stderr == python.stderr


def test_both_catch_a_history_recomputed_in_the_database_by_its_signed_root(
    go_verifier: Path, db: None, audit_dir: Path, public_key: str,
) -> None:
    seed(steps=2)
    victim = seed(steps=4)
    sealing.seal_new_events()
    rewrite_history(victim, seq=2, payload={"step": "forged"})
    export.audit_export_until_idle()

    python, go = both_verify(go_verifier, audit_dir, public_key)

    assert_both_fail_at(python, go, "segment 1 (segment-00000001.jsonl)")
    assert "do not give the signed tree head's root" in go.stderr


# --- gated tool calls (step 6) -------------------------------------------------------------


def test_both_list_the_same_gated_calls(go_verifier: Path, db: None, audit_dir: Path, public_key: str) -> None:
    approved_payment()
    sealing.seal_new_events()
    export.audit_export_until_idle()

    python, go = both_verify(go_verifier, audit_dir, public_key, args=("--approvals",))

    assert_both_ok(python, go)
    assert "1 gated tool call(s)" in go.stdout and "gated call: task" in go.stdout


def test_both_fail_a_gated_call_whose_arguments_were_changed(
    go_verifier: Path, db: None, audit_dir: Path, public_key: str,
) -> None:
    exported_with_the_approved_arguments_changed()
    line = next(number for number, text in enumerate(
        (audit_dir / fmt.segment_name(1)).read_bytes().splitlines(), start=1)
        if json.loads(text)["type"] == "ToolCallDispatched")

    python, go = both_verify(go_verifier, audit_dir, public_key)

    assert_both_fail_at(python, go, f"segment 1 (segment-00000001.jsonl) line {line}")
    assert "not the approved" in go.stderr


# --- S3 ------------------------------------------------------------------------------------


def test_both_verify_an_export_in_s3(
    go_verifier: Path, db: None, s3_endpoint: str, settings: Any, monkeypatch: pytest.MonkeyPatch, public_key: str,
) -> None:
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = "audit-go-verifier"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket, ObjectLockEnabledForBucket=True)
    settings.BACKPLANE_AUDIT_S3_BUCKET = bucket
    settings.BACKPLANE_AUDIT_S3_PREFIX = "backplane/audit"
    settings.BACKPLANE_AUDIT_S3_ENDPOINT_URL = s3_endpoint
    settings.BACKPLANE_AUDIT_S3_REGION = "us-east-1"
    settings.BACKPLANE_AUDIT_S3_RETENTION_DAYS = 30
    task = seed(steps=3)
    sealing.seal_new_events()
    export.audit_export_until_idle()
    append(task, 2)
    sealing.seal_new_events()
    export.audit_export_until_idle()

    python, go = both_verify(go_verifier, f"s3://{bucket}/backplane/audit", public_key,
                             args=("--endpoint-url", s3_endpoint), env=verifier_env(**S3_CREDENTIALS))

    assert_both_ok(python, go)
    assert go.stdout.startswith(f"OK s3://{bucket}/backplane/audit/: 2 segment(s), 6 event(s), 1 task(s)\n")


# --- an event's inclusion-proof bundle -----------------------------------------------------


def check_proof(binary: Path | None, bundle: Path, key: str) -> Verdict:
    """``check-proof`` by the Go command, or by the Python one when ``binary`` is None."""
    program = [str(binary)] if binary else [sys.executable, "-m", "backplane.integrity.audit"]
    result = subprocess.run([*program, "check-proof", str(bundle), "--public-key", key], cwd=REPO,
                            env=verifier_env(), capture_output=True, text=True, timeout=120)
    return Verdict(result.returncode, result.stdout, result.stderr)


def change_the_payload(bundle: dict[str, Any]) -> None:
    bundle["event"]["payload"] = {"step": 999}


def change_a_path_element(bundle: dict[str, Any]) -> None:
    bundle["audit_path"][0] = "0" * 64


def point_at_another_leaf(bundle: dict[str, Any]) -> None:
    bundle["leaf_index"] += 1


def sign_the_head_with_another_key(bundle: dict[str, Any]) -> None:
    forger, _ = another_key()
    head = bundle["tree_head"]
    head["signature"] = forger.sign(fmt.tree_head_message(
        tree_size=head["tree_size"], root_hash=head["root_hash"], signed_at=head["signed_at"])).hex()


BUNDLE_TAMPERING: dict[str, Callable[[dict[str, Any]], None]] = {
    "a changed payload": change_the_payload,
    "a changed audit path": change_a_path_element,
    "another leaf index": point_at_another_leaf,
    "a head signed by another key": sign_the_head_with_another_key,
}


@pytest.fixture
def proof_bundle(db: None) -> dict[str, Any]:
    """Seq 2 of a task among others, proven against the latest signed tree head."""
    seed(steps=3)
    task = seed(steps=3)
    seed(steps=2)
    sealing.seal_new_events()
    return json.loads(json.dumps(selectors.event_proof_bundle(task_id=str(task.pk), seq=2)))


def test_both_check_an_inclusion_proof_bundle(
    go_verifier: Path, proof_bundle: dict[str, Any], public_key: str, tmp_path: Path,
) -> None:
    file = tmp_path / "proof.json"
    file.write_text(json.dumps(proof_bundle))

    python, go = check_proof(None, file, public_key), check_proof(go_verifier, file, public_key)

    assert (python.code, go.code) == (0, 0), (python.stderr, go.stderr)
    assert go.stdout == python.stdout and go.stdout.startswith("OK: event ")


@pytest.mark.parametrize("tamper", BUNDLE_TAMPERING.values(), ids=BUNDLE_TAMPERING.keys())
def test_both_refuse_a_tampered_inclusion_proof_bundle(
    go_verifier: Path, proof_bundle: dict[str, Any], public_key: str, tmp_path: Path,
    tamper: Callable[[dict[str, Any]], None],
) -> None:
    tamper(proof_bundle)
    file = tmp_path / "proof.json"
    file.write_text(json.dumps(proof_bundle))

    python, go = check_proof(None, file, public_key), check_proof(go_verifier, file, public_key)

    assert (python.code, go.code) == (1, 1), (python.stderr, go.stderr)
    assert go.stderr == python.stderr


def test_both_refuse_a_bundle_under_another_key(
    go_verifier: Path, proof_bundle: dict[str, Any], tmp_path: Path,
) -> None:
    file = tmp_path / "proof.json"
    file.write_text(json.dumps(proof_bundle))
    _, stranger = another_key()

    python, go = check_proof(None, file, stranger), check_proof(go_verifier, file, stranger)

    assert (python.code, go.code) == (1, 1)
    assert go.stderr == python.stderr and "not signed by a trusted key" in go.stderr


# --- the Go suite itself --------------------------------------------------------------------


def test_the_go_suite_passes_on_the_shared_vectors() -> None:
    result = subprocess.run([go_command(), "test", "-count=1", "./..."], cwd=VERIFIER, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for package in ("audit", "jcs", "merkle"):
        assert re.search(rf"^ok\s+github\.com/agent-backplane/verifier/{package}\s", result.stdout, re.M), result.stdout
