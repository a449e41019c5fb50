"""The web process itself, started as `make run` starts it (uvicorn), refuses to serve when its
key-encryption key is not the one that wrapped the data keys in the database: it exits naming the
key, before it answers anything; with the right key it serves, and opens what it sealed."""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backplane.eventlog import services
from backplane.privacy import keys
from backplane.privacy.sealing import seal_personal
from tests.support.live_server import WebProcess

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("committed_db")]


@pytest.fixture
def key_file(settings: Any, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "kek.json"
    settings.BACKPLANE_KEK_FILE = str(path)
    keys.key_encryption_keys_forget()
    yield path
    keys.key_encryption_keys_forget()


def test_a_wrong_key_stops_the_web_process_at_start_and_the_right_one_serves(key_file: Path, tmp_path: Path) -> None:
    sealed = seal_personal("acme", {"email": {"$personal": {"subject": "lead:1", "value": "ada@example.com"}}})
    token = services.agent_create(name="reader", namespace="acme").token
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"current": "k1", "keys": {"k1": base64.b64encode(secrets.token_bytes(32)).decode()}}))

    refused = WebProcess(env={"BACKPLANE_KEK_FILE": str(wrong)})
    try:
        with pytest.raises(AssertionError, match="exited early"):
            refused.start()
        assert "1 data keys are wrapped with key-encryption key 'k1'" in refused.log()
        assert "ImproperlyConfigured" in refused.log()
    finally:
        refused.close()

    served = WebProcess(env={"BACKPLANE_KEK_FILE": str(key_file)}).start()
    try:
        opened = httpx.post(f"{served.url}/api/v1/personal-data/open/", json={"value": sealed},
                            headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert opened.status_code == 200 and opened.json()["value"] == {"email": "ada@example.com"}
    finally:
        served.close()
