"""docs/openapi.yaml is the API's contract as the code generates it: external clients are written
against the committed file, so a change of the code's schema without `make openapi` fails here."""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml
from django.core.management import call_command

import backplane

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"


def test_the_committed_openapi_file_is_what_the_code_generates(tmp_path: Path) -> None:
    generated = tmp_path / "openapi.yaml"
    call_command("spectacular", "--validate", "--file", str(generated))
    committed, fresh = COMMITTED.read_text(), generated.read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True), "docs/openapi.yaml",
                                        "generated", n=1))
    assert committed == fresh, f"run `make openapi`:\n{diff[:4000]}"


def test_it_names_the_release_the_package_names() -> None:
    assert yaml.safe_load(COMMITTED.read_text())["info"]["version"] == backplane.__version__
