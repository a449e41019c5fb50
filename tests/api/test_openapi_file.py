"""docs/openapi.yaml is the API's contract as the code generates it: external clients are written
against the committed file, so a change of the code's schema without `make openapi` fails here."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
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


def test_every_reference_names_a_schema_the_file_defines() -> None:
    """drf-spectacular's --validate leaves a dangling ``$ref`` alone; code generators (the
    TypeScript client's openapi-typescript among them) refuse the whole file for one."""
    contract = yaml.safe_load(COMMITTED.read_text())
    defined = set(contract["components"]["schemas"])

    def references(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref" and isinstance(value, str):
                    yield value
                else:
                    yield from references(value)
        elif isinstance(node, list):
            for item in node:
                yield from references(item)

    dangling = {ref for ref in references(contract) if ref.removeprefix("#/components/schemas/") not in defined}
    assert not dangling
