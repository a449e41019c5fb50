"""The docs in the repository: no link leaves it, every relative link resolves, and every
environment variable the product reads is documented in docs/operations.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Every way the product reads its environment: settings' typed helpers and plain os.environ.
ENV_READ = re.compile(
    r"""(?:env_(?:str|int|bool|float|list)\(|os\.environ\.get\(|os\.environ\[)\s*["']([A-Z][A-Z0-9_]+)["']"""
)
# Read by the process environment of libraries or tests, not settings a person chooses.
NOT_SETTINGS = {"DJANGO_SETTINGS_MODULE", "PYTHONUNBUFFERED", "BACKPLANE_TEST_PGDATA", "DJANGO_ALLOW_ASYNC_UNSAFE"}


def test_no_doc_points_outside_the_repository() -> None:
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text and "../.library" not in text, doc
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"^[a-z]+://|^mailto:", target):
                continue
            resolved = (doc.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
            assert resolved.exists(), f"{doc.name} links to a missing file: {target}"


def test_every_environment_variable_the_product_reads_is_documented() -> None:
    sources = [*ROOT.glob("backplane/**/*.py"), *ROOT.glob("recovery/**/*.py"), *ROOT.glob("dashboard/**/*.py"),
               ROOT / "manage.py"]
    read = {name for path in sources for name in ENV_READ.findall(path.read_text())} - NOT_SETTINGS
    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = sorted(name for name in read if f"`{name}`" not in operations)
    assert not missing, f"not documented in docs/operations.md: {missing}"
