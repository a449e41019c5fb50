"""The reference tables of the docs, read against the code, so the two cannot drift apart: the
event types only the backplane writes (docs/events.md) and the error codes with their statuses
(docs/api.md). A type or a code added to the code without its row fails here, and so does a row
the code no longer has."""

from __future__ import annotations

import re
from pathlib import Path

from backplane.api import middleware
from backplane.eventlog import errors
from backplane.eventlog.event_types import SERVER_ONLY_TYPES

DOCS = Path(__file__).resolve().parents[1] / "docs"


def table_after(path: Path, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first Markdown table after ``heading``, a title or the
    table's own header row, without its header."""
    lines = path.read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.strip() == heading)
    rows: list[list[str]] = [[]] if heading.startswith("|") else []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # without the header


def codes_in(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_]+)`", cell)


def test_the_server_only_event_types_are_the_ones_events_md_lists() -> None:
    listed = {kind for row in table_after(DOCS / "events.md", "## Types only the backplane writes")
              for kind in codes_in(row[0])}
    assert listed == set(SERVER_ONLY_TYPES), {"not in the docs": set(SERVER_ONLY_TYPES) - listed,
                                              "not server-only in the code": listed - set(SERVER_ONLY_TYPES)}


def contract_errors() -> set[tuple[int, str]]:
    """Every (status, code) the API answers with: the event log's errors, the answers the
    middleware gives before or instead of a view, and DRF's own (authentication, throttling)."""
    raised = {(cls.status, cls.code) for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.BackplaneError) and cls is not errors.BackplaneError
              and getattr(cls, "status", None)}
    converted = {(status, code) for status, (code, _) in middleware._CONTRACT_CODES.items()}
    return raised | converted | {(401, "not_authenticated"), (503, "unavailable")}


def test_every_error_the_api_answers_with_is_in_the_error_table_and_nothing_else() -> None:
    documented = {(int(status), code) for status, cell, *_ in table_after(DOCS / "api.md", "| status | code | when |")
                  if status.isdigit() for code in codes_in(cell)}
    assert documented == contract_errors(), {"not in the table": contract_errors() - documented,
                                             "in the table, not in the code": documented - contract_errors()}
