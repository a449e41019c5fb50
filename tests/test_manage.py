"""manage.py from a checkout: development settings where ``var/`` exists, production elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.live_server import database_url_of_test_db

ROOT = Path(__file__).resolve().parents[1]


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("BACKPLANE_", "DJANGO_")) and k not in {"DATABASE_URL", "SECRET_KEY", "ALLOWED_HOSTS"}}
    return {**env, **extra}


def test_it_uses_the_development_settings_and_make_runs_database_when_var_exists(tmp_path: Path, db: None) -> None:
    var = tmp_path / "var"
    var.mkdir()
    (var / "database_url").write_text(database_url_of_test_db() + "\n")
    done = _manage("shell", "-c", "from django.conf import settings; print(settings.BACKPLANE_ENV, settings.DEBUG)",
                   env=_bare_env(BACKPLANE_VAR_DIR=str(var)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].split() == ["development", "True"]


def test_without_var_it_is_production_and_refuses_without_its_variables(tmp_path: Path) -> None:
    done = _manage("check", env=_bare_env(BACKPLANE_VAR_DIR=str(tmp_path / "no-such-var")))
    assert done.returncode != 0
    assert "must be set" in done.stderr


def test_an_explicit_environment_wins_over_the_checkout(tmp_path: Path) -> None:
    var = tmp_path / "var"
    var.mkdir()
    done = _manage("check", env=_bare_env(BACKPLANE_VAR_DIR=str(var), BACKPLANE_ENV="production"))
    assert done.returncode != 0 and "must be set" in done.stderr
