"""Production settings pass ``manage.py check --deploy`` (HSTS, HTTPS redirect, secure cookies);
development and tests keep working over plain http."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from tests.support.live_server import ROOT

PROXY_HEADER = "X-Forwarded-Proto: https"


def _production_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BACKPLANE_", "DJANGO_")) and k not in {"DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS",
                                                                         "REDIS_URL", "DEBUG"}}
    return {
        **env,
        "BACKPLANE_ENV": "production",
        "BACKPLANE_VAR_DIR": str(var_dir),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "BACKPLANE_SIGNING_KEY": secrets.token_hex(32),
        "ALLOWED_HOSTS": "backplane.example.com",
        # check --deploy reads the settings only; nothing connects to these.
        "DATABASE_URL": "postgresql://backplane:secret@db.example.com:5432/backplane",
        "BACKPLANE_SECURE_PROXY_SSL_HEADER": PROXY_HEADER,
        **extra,
    }


@pytest.mark.parametrize("redis", ["", "redis://redis.example.com:6379/0"], ids=["database-cache", "redis"])
def test_production_settings_pass_the_deploy_check(tmp_path: Path, redis: str) -> None:
    env = _production_env(tmp_path, **({"REDIS_URL": redis} if redis else {}))
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr and "identified no issues" in done.stdout


def test_a_malformed_proxy_header_setting_is_refused(tmp_path: Path) -> None:
    env = _production_env(tmp_path, BACKPLANE_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "BACKPLANE_SECURE_PROXY_SSL_HEADER" in done.stderr


def test_tests_and_development_speak_plain_http(client: Client, db: None) -> None:
    assert not settings.SECURE_SSL_REDIRECT and not settings.SECURE_HSTS_SECONDS
    assert not settings.SESSION_COOKIE_SECURE and not settings.CSRF_COOKIE_SECURE
    assert client.get("/readyz/traffic").status_code == 200


def test_behind_the_proxy_http_is_redirected_and_probes_are_not(client: Client, db: None,
                                                                settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    redirected = client.get("/login/")
    assert redirected.status_code == 301 and redirected["Location"] == "https://testserver/login/"
    served = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert served.status_code == 200 and served["Strict-Transport-Security"].startswith("max-age=3600")
    # The compose healthcheck and load balancers probe from inside, over plain http.
    assert client.get("/readyz").status_code == 200
    assert client.get("/readyz/traffic").status_code == 200


def test_the_api_over_plain_http_is_a_json_403_not_a_redirect(client: Client, db: None, settings: Any) -> None:
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    refused = client.post("/api/v1/tasks/", {"kind": "k", "input": {}}, content_type="application/json")
    assert refused.status_code == 403 and refused["Content-Type"] == "application/json"
    error = refused.json()["error"]
    assert error["code"] == "permission_denied"
    assert error["details"] == {"url": "https://testserver/api/v1/tasks/"}
    # Over HTTPS (as the proxy says) the API answers as usual: here, 401 without a token.
    served = client.post("/api/v1/tasks/", {"kind": "k", "input": {}}, content_type="application/json",
                         HTTP_X_FORWARDED_PROTO="https")
    assert served.status_code == 401


def _production_setting(tmp_path: Path, name: str, **extra: str) -> str:
    env = _production_env(tmp_path, **extra)
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-c",
                           f"from django.conf import settings; print(settings.{name})"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_production_closes_metrics_without_a_token_unless_told(tmp_path: Path) -> None:
    assert _production_setting(tmp_path, "BACKPLANE_METRICS_OPEN") == "False"
    assert _production_setting(tmp_path, "BACKPLANE_METRICS_OPEN", BACKPLANE_METRICS_OPEN="true") == "True"


def test_production_allows_no_private_outbound_address_by_default(tmp_path: Path) -> None:
    assert _production_setting(tmp_path, "BACKPLANE_OUTBOUND_ALLOWED_NETWORKS") == "[]"
