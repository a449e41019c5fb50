"""Key-encryption keys (docs/privacy.md, "Keys"): a wrong or lost key stops the web process at
start naming the key, never opening garbage; a rotation re-wraps every data key and changes no
sealed value; the keys show nowhere (log, /metrics)."""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client

from backplane.privacy import keys
from backplane.privacy.models import DataSubject, LookupKey
from backplane.privacy.sealing import KeysUnavailable, seal_personal
from backplane.privacy.services import kek_problems, personal_open, require_key_encryption_keys

pytestmark = pytest.mark.django_db

MARKED = {"email": {"$personal": {"subject": "lead:1", "value": "ada@example.com", "lookup": True}},
          "phone": {"$personal": {"subject": "lead:2", "value": "+44 20 7946 0000"}}}


@pytest.fixture
def key_file(settings: Any, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "keys" / "kek.json"
    settings.BACKPLANE_KEK_FILE = str(path)
    keys.key_encryption_keys_forget()
    yield path
    keys.key_encryption_keys_forget()


def write_keys(path: Path, current: str, **named: bytes) -> None:
    path.write_text(json.dumps({"current": current,
                                "keys": {name: base64.b64encode(key).decode() for name, key in named.items()}}))
    keys.key_encryption_keys_forget()


def test_development_makes_a_key_file_readable_by_its_owner_only(key_file: Path) -> None:
    sealed = seal_personal("acme", MARKED)
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert personal_open("acme", sealed, reader=None, where_read="test").value == {
        "email": "ada@example.com", "phone": "+44 20 7946 0000"}
    assert kek_problems() == []
    require_key_encryption_keys()


def test_a_wrong_key_under_the_same_name_stops_the_start_naming_it(key_file: Path) -> None:
    seal_personal("acme", MARKED)
    write_keys(key_file, "k1", k1=secrets.token_bytes(32))
    with pytest.raises(ImproperlyConfigured, match="3 data keys are wrapped with key-encryption key 'k1'.*not the one"):
        require_key_encryption_keys()
    with pytest.raises(CommandError):
        call_command("privacy_keys", "check")
    # A request that needs a key is the contract's 503, never garbage.
    with pytest.raises(KeysUnavailable):
        seal_personal("acme", MARKED)


def test_a_lost_key_stops_the_start_naming_it(key_file: Path) -> None:
    seal_personal("acme", MARKED)
    write_keys(key_file, "k9", k9=secrets.token_bytes(32))
    with pytest.raises(ImproperlyConfigured, match="no key-encryption key 'k1'"):
        require_key_encryption_keys()


def test_a_malformed_or_absent_key_file_is_a_configuration_error(key_file: Path, settings: Any) -> None:
    key_file.parent.mkdir(parents=True)
    key_file.write_text('{"current": "k1", "keys": {"k1": "c2hvcnQ="}}')
    with pytest.raises(ImproperlyConfigured, match="is not 32 bytes"):
        keys.key_encryption_keys()
    key_file.write_text("not json")
    keys.key_encryption_keys_forget()
    with pytest.raises(ImproperlyConfigured, match="is not a key file"):
        keys.key_encryption_keys()
    settings.IS_LOCAL = False
    key_file.unlink()
    keys.key_encryption_keys_forget()
    with pytest.raises(ImproperlyConfigured, match="does not exist"):
        keys.key_encryption_keys()
    settings.BACKPLANE_KEK_FILE = None
    keys.key_encryption_keys_forget()
    with pytest.raises(KeysUnavailable):
        seal_personal("acme", MARKED)
    # Nothing was wrapped yet, so a deployment that marks nothing starts without keys.
    assert kek_problems() == []


def test_a_rotation_rewraps_every_key_and_changes_no_sealed_value(
    key_file: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    sealed = seal_personal("acme", MARKED)
    before = {row.subject: bytes(row.wrapped_key or b"") for row in DataSubject.objects.all()}
    call_command("privacy_keys", "rotate", "--new", "k2")
    assert "3 data keys re-wrapped with key-encryption key 'k2'" in capsys.readouterr().out
    assert set(DataSubject.objects.values_list("kek_id", flat=True)) == {"k2"}
    assert LookupKey.objects.get().kek_id == "k2"
    assert all(bytes(row.wrapped_key or b"") != before[row.subject] for row in DataSubject.objects.all())
    # The old key may go once every process reads the new file.
    document = json.loads(key_file.read_text())
    del document["keys"]["k1"]
    key_file.write_text(json.dumps(document))
    keys.key_encryption_keys_forget()
    call_command("privacy_keys", "check")
    assert seal_personal("acme", MARKED) == sealed  # the same data keys: the same envelopes
    assert personal_open("acme", sealed, reader=None, where_read="test").value["email"] == "ada@example.com"
    # The keys show nowhere: not in the log, not on /metrics.
    secrets_in_file = list(json.loads(key_file.read_text())["keys"].values())
    metrics = Client().get("/metrics").content.decode()
    for secret in secrets_in_file:
        assert secret not in caplog.text and secret not in metrics
    with pytest.raises(CommandError, match="already holds a key named 'k2'"):
        call_command("privacy_keys", "rotate", "--new", "k2")


def test_a_rotation_interrupted_carries_on_where_it_stopped(key_file: Path) -> None:
    for n in range(5):
        seal_personal("acme", {"v": {"$personal": {"subject": f"lead:{n}", "value": n}}})
    keys.kek_file_add(key_file, "k2")
    keys.key_encryption_keys_forget()
    from backplane.privacy.services import kek_rotate

    progress: list[int] = []
    assert kek_rotate(batch=2, progress=progress.append) == 5
    assert progress == [2, 4, 5]
    assert kek_rotate(batch=2) == 0
