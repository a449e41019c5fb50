"""The offline verifier: no database, no settings; every kind of tampering with an export, or
with the database before it was exported, fails with a message naming the segment."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from backplane.eventlog.chain import api_event_hash
from backplane.eventlog.models import Event
from backplane.integrity import sealing
from backplane.integrity.audit import export
from backplane.integrity.audit import manifest as fmt
from backplane.integrity.audit.verify import main
from backplane.integrity.verification import chain_check
from tests.backplane.integrity.audit_support import (
    REPO,
    Exported,
    reseal,
    resign,
    rewrite_history,
    run_verifier,
    seed,
    segment_lines,
    verifier_env,
    writable,
    write_lines,
)


def verify_in_process(exported: Exported, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["verify", str(exported.path), "--public-key", exported.public_key])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_untouched_export_verifies_in_a_process_without_database_or_settings(exported: Exported) -> None:
    result = run_verifier(exported.path, exported.public_key)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"OK {exported.path.resolve().as_uri()}: 2 segment(s), {Event.objects.count()} "
                                    "event(s), 3 task(s)")
    assert f"root {sealing.latest_head().root_hash}" in result.stdout


def test_the_verifier_loads_no_database_code() -> None:
    probe = (
        "import sys, backplane.integrity.audit.verify\n"
        "from django.conf import settings\n"
        "assert not settings.configured, 'settings were loaded'\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('django.db', 'psycopg')) or m.endswith('.models'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=verifier_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_tree_head_message_is_the_sealers() -> None:
    tree_size, root_hash, signed_at = 7, "ab" * 32, "2026-01-01T00:00:00.000000Z"
    assert fmt.tree_head_message(tree_size=tree_size, root_hash=root_hash, signed_at=signed_at) == \
        sealing.tree_head_message(tree_size=tree_size, root_hash=root_hash, signed_at=signed_at)


def test_a_public_key_can_be_given_as_a_file_hex_or_pem(
    exported: Exported,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hex_file = tmp_path / "key.hex"
    hex_file.write_text(exported.public_key + "\n")
    pem_file = tmp_path / "key.pem"
    pem = sealing.signing_key().public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    pem_file.write_bytes(pem)
    for key in (hex_file, pem_file):
        assert main(["verify", str(exported.path), "--public-key", str(key)]) == 0
    assert main(["verify", str(exported.path), "--public-key", "not-a-key"]) == 2
    assert "neither 64 hex digits nor a readable key file" in capsys.readouterr().err


def test_another_public_key_is_not_trusted(exported: Exported) -> None:
    stranger = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    result = run_verifier(exported.path, stranger)
    assert result.returncode == 1
    assert "segment 1 (segment-00000001.manifest.json)" in result.stderr and "not a trusted public key" in result.stderr


# --- tampering with the files ---------------------------------------------------------------


def delete_a_line(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    del lines[2]
    write_lines(exported, 2, lines)


def reorder_two_lines(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    lines[2], lines[4] = lines[4], lines[2]
    write_lines(exported, 2, lines)


def edit_a_field(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    event = json.loads(lines[2])
    event["payload"] = {"step": 999}
    lines[2] = json.dumps(event).encode() + b"\n"
    write_lines(exported, 2, lines)


def edit_a_field_and_its_hash(exported: Exported) -> None:
    lines = segment_lines(exported, 2)
    event = json.loads(lines[2])
    event["payload"] = {"step": 999}
    event["hash"] = api_event_hash(event)
    lines[2] = json.dumps(event).encode() + b"\n"
    write_lines(exported, 2, lines)


FILE_TAMPERING: dict[str, Callable[[Exported], None]] = {
    "delete a line": delete_a_line,
    "reorder two lines": reorder_two_lines,
    "edit a field": edit_a_field,
}


@pytest.mark.parametrize("tamper", FILE_TAMPERING.values(), ids=FILE_TAMPERING.keys())
def test_a_changed_segment_file_fails_its_sha256(
    exported: Exported,
    tamper: Callable[[Exported], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper(exported)

    code, output = verify_in_process(exported, capsys)

    assert code == 1
    assert "segment 2 (segment-00000002.jsonl): its SHA-256 is" in output and "the file was changed" in output


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        (delete_a_line, "line 4: task {task} has seq 5 where seq 4 was expected"),
        (reorder_two_lines, "line 3: task {task} has seq 5 where seq 4 was expected"),
        (edit_a_field, "line 3: task {task} seq 4: the hash recomputed from its content is"),
        (edit_a_field_and_its_hash, "line 5: task {task} seq 5: prev_hash does not link to seq 4's hash"),
    ],
    ids=["delete a line", "reorder two lines", "edit a field", "edit a field and its hash"],
)
def test_even_with_a_resigned_manifest_each_line_is_checked(
    exported: Exported,
    tamper: Callable[[Exported], None],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Segment 2 in leaf order: third#1, third#2, first#4, second#4, first#5, second#5.
    task = exported.tasks[0].pk
    tamper(exported)
    reseal(exported, 2)

    code, output = verify_in_process(exported, capsys)

    assert code == 1
    assert f"segment 2 (segment-00000002.jsonl) {problem.format(task=task)}" in output


def test_a_changed_file_with_its_new_sha256_in_the_manifest_fails_the_signature(exported: Exported) -> None:
    edit_a_field(exported)
    data = (exported.path / fmt.segment_name(2)).read_bytes()
    manifest_file = writable(exported.path / fmt.manifest_name(2))
    manifest = json.loads(manifest_file.read_bytes())
    manifest["segment_sha256"] = hashlib.sha256(data).hexdigest()  # without the key: the old signature stays
    manifest_file.write_bytes(fmt.encode_manifest(manifest))

    result = run_verifier(exported.path, exported.public_key)

    assert result.returncode == 1
    assert "segment 2 (segment-00000002.manifest.json): the manifest's signature does not verify" in result.stderr


def test_a_manifest_swapped_for_another_is_caught(exported: Exported, capsys: pytest.CaptureFixture[str]) -> None:
    first = (exported.path / fmt.manifest_name(1)).read_bytes()
    writable(exported.path / fmt.manifest_name(2)).write_bytes(first)

    code, output = verify_in_process(exported, capsys)

    assert code == 1
    assert "segment 2 (segment-00000002.manifest.json): the manifest is that of segment 1" in output


def test_a_manifest_signed_with_another_key_is_caught(exported: Exported, capsys: pytest.CaptureFixture[str]) -> None:
    forger = Ed25519PrivateKey.generate()
    forger_public = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    resign(exported.path, 2, lambda manifest: None, key=forger)  # same content, other key, trusted key claimed
    code, output = verify_in_process(exported, capsys)
    assert code == 1
    assert "segment 2 (segment-00000002.manifest.json): the manifest's signature does not verify" in output

    resign(exported.path, 2, lambda manifest: manifest.update(public_key=forger_public), key=forger)
    code, output = verify_in_process(exported, capsys)
    assert code == 1 and f"signed by '{forger_public}', which is not a trusted public key" in output


def test_a_resigned_manifest_that_skips_the_chain_is_caught(
    exported: Exported,
    capsys: pytest.CaptureFixture[str],
) -> None:
    resign(exported.path, 2, lambda manifest: manifest.update(previous_manifest_sha256="1" * 64))
    code, output = verify_in_process(exported, capsys)
    assert code == 1 and "segment 2 (segment-00000002.manifest.json): previous_manifest_sha256" in output


def test_a_missing_segment_is_caught(exported: Exported, capsys: pytest.CaptureFixture[str]) -> None:
    (exported.path / fmt.manifest_name(1)).unlink()
    code, output = verify_in_process(exported, capsys)
    assert code == 1 and "segment 1 is missing" in output


def test_reordered_events_of_different_tasks_chain_but_miss_the_signed_root(
    exported: Exported,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = segment_lines(exported, 2)
    tasks = [json.loads(line)["task_id"] for line in lines]
    i = next(i for i in range(len(lines) - 1) if tasks[i] != tasks[i + 1])
    lines[i], lines[i + 1] = lines[i + 1], lines[i]  # each task's own order is kept
    write_lines(exported, 2, lines)
    reseal(exported, 2)

    code, output = verify_in_process(exported, capsys)

    assert code == 1
    assert "segment 2 (segment-00000002.jsonl): the events' recomputed hashes do not give the signed tree head's root" \
        in output


# --- tampering with the database before the export -------------------------------------------


def test_an_edited_row_with_a_recomputed_chain_is_exported_faithfully_and_caught(
    db: None,
    audit_dir: Path,
    public_key: str,
) -> None:
    honest, victim = seed(steps=2), seed(steps=4)
    sealing.seal_new_events()
    # The attacker, a superuser, edits seq 2 and recomputes the rest of the chain (and the leaf copies).
    rewrite_history(victim, seq=2, payload={"step": "forged"})
    victim.refresh_from_db()
    assert chain_check(task=victim).valid and chain_check(task=honest).valid  # the chains alone no longer tell

    export.audit_export_until_idle()
    result = run_verifier(audit_dir, public_key)

    assert result.returncode == 1
    assert "segment 1 (segment-00000001.jsonl): the events' recomputed hashes do not give the signed tree head's " \
           "root at tree size" in result.stderr
    assert '"forged"' in (audit_dir / fmt.segment_name(1)).read_text()  # the export shows what the database holds
