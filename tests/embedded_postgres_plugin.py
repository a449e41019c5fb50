"""Give the test run a throw-away embedded PostgreSQL, before Django reads its settings.

Loaded with ``-p`` (see pyproject.toml) so that its hook wraps pytest-django's, which
sets Django up while the initial conftests load. With ``DATABASE_URL`` set, that server
is used instead and nothing is started here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

_state: dict[str, Path] = {}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, object, object]:
    os.environ.setdefault("BACKPLANE_ENV", "test")
    root = Path(tempfile.mkdtemp(prefix="bp-test-"))
    _state["root"] = root
    var_dir = root / "var"
    var_dir.mkdir()
    os.environ["BACKPLANE_VAR_DIR"] = str(var_dir)
    if not os.environ.get("DATABASE_URL"):
        from backplane.runtime import embedded_db

        pgdata = root / "pgdata"
        os.environ["DATABASE_URL"] = embedded_db.start(pgdata)
        os.environ["BACKPLANE_TEST_PGDATA"] = str(pgdata)
        _state["pgdata"] = pgdata
    return (yield)


def pytest_unconfigure(config: pytest.Config) -> None:
    if "pgdata" in _state:
        from backplane.runtime import embedded_db

        embedded_db.destroy(_state["pgdata"])
    if "root" in _state:
        shutil.rmtree(_state["root"], ignore_errors=True)
