"""The reference tables of the docs, read against the code, so the two cannot drift apart: the
event types only the backplane writes (docs/events.md) and the error codes with their statuses
(docs/api.md). A type or a code added to the code without its row fails here, and so does a row
the code no longer has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from api import errors as api_errors
from api import middleware
from backplane.eventlog import errors
from backplane.eventlog.event_types import SERVER_ONLY_TYPES
from backplane.runtime import env
from recovery import errors as recovery_errors

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
    """Every (status, code) the API answers with: the event log's and recovery's errors, the
    answers the middleware gives before or instead of a view, and DRF's own (authentication,
    throttling)."""
    raised = {(cls.status, cls.code) for module in (errors, recovery_errors) for cls in vars(module).values()
              if isinstance(cls, type) and issubclass(cls, errors.BackplaneError) and cls is not errors.BackplaneError
              and getattr(cls, "status", None)}
    converted = {(status, code) for status, (code, _) in middleware._CONTRACT_CODES.items()}
    drf = {(exception.status_code, code) for exception, code in api_errors._DRF_CODES}
    return raised | converted | drf | {(503, "unavailable")}


def test_every_error_the_api_answers_with_is_in_the_error_table_and_nothing_else() -> None:
    documented = {(int(status), code) for status, cell, *_ in table_after(DOCS / "api.md", "| status | code | when |")
                  if status.isdigit() for code in codes_in(cell)}
    assert documented == contract_errors(), {"not in the table": contract_errors() - documented,
                                             "in the table, not in the code": documented - contract_errors()}


# --- the configuration tables against backplane/settings.py ------------------------------------

SETTINGS = Path(__file__).resolve().parents[1] / "backplane" / "settings.py"
CONFIG_TABLE_HEADER = "| variable | default | meaning |"

# Variables the tables document that settings.py does not read, and who does.
READ_ELSEWHERE = {
    "BACKPLANE_HOST": "the launcher (make run), where it serves",
    "BACKPLANE_PORT": "the launcher (make run), where it serves",
    "BACKPLANE_DEMO": "the launcher (make run), whether it starts the demo fleet",
    "BACKPLANE_CELERY_LOG_LEVEL": "the launcher (make run), the worker's and beat's log level",
    "BACKPLANE_HTTP_THREADS": "backplane/asgi.py, the threads that serve HTTP",
    "OTEL_TRACES_SAMPLER": "the OpenTelemetry SDK itself",
    "OTEL_TRACES_SAMPLER_ARG": "the OpenTelemetry SDK itself",
}


def _number(node: ast.expr) -> float | None:
    """The value of a literal number, or of arithmetic on literal numbers (``24 * 3600``); else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub)):
        left, right = _number(node.left), _number(node.right)
        if left is not None and right is not None:
            return {ast.Mult: left * right, ast.Add: left + right, ast.Sub: left - right}[type(node.op)]
    return None


def settings_reads() -> dict[str, float | None]:
    """Every variable settings.py reads: the env helpers' calls with a literal name (to the literal
    number default, or None) and plain ``os.environ`` / ``os.getenv`` reads."""
    helpers = {name for name in vars(env) if name.startswith("env_")}
    reads: dict[str, float | None] = {}
    for node in ast.walk(ast.parse(SETTINGS.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            attribute_of = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            is_environ_get = (name, attribute_of) in {("get", "os.environ"), ("getenv", "os")}
            if name in helpers or is_environ_get:
                default = node.args[1] if len(node.args) > 1 else next(
                    (kw.value for kw in node.keywords if kw.arg == "default"), None)
                reads[str(node.args[0].value)] = _number(default) if default is not None else None
        elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
              and ast.unparse(node.value) == "os.environ" and isinstance(node.slice, ast.Constant)):
            reads[str(node.slice.value)] = None
    return reads


_PLAIN_NUMBERS = re.compile(r"^-?\d+(?:\.\d+)?(?: s)?(?:, -?\d+(?:\.\d+)?(?: s)?)*$")


def config_rows() -> list[tuple[str, list[str], str]]:
    """(file, the variables a row names, its default cell) for every configuration table in docs/."""
    rows = []
    for path in sorted(DOCS.glob("*.md")):
        in_table = False
        for line in path.read_text().splitlines():
            if line.strip() == CONFIG_TABLE_HEADER:
                in_table = True
            elif not line.startswith("|"):
                in_table = False
            elif in_table and not set(line) <= set("|-: "):
                variables, default, *_ = (cell.strip() for cell in line.strip().strip("|").split("|"))
                rows.append((path.name, re.findall(r"`([A-Z][A-Z0-9_]+)`", variables), default))
    return rows


def test_the_configuration_tables_name_every_variable_settings_reads_and_no_other() -> None:
    reads = settings_reads()
    documented = {name for _, names, _ in config_rows() for name in names}
    assert documented, "no configuration table found in docs/"
    unread = documented - set(reads) - set(READ_ELSEWHERE)
    assert not unread and set(reads) <= documented, {
        "read by settings.py, in no table": sorted(set(reads) - documented),
        "in a table, read by nothing": sorted(unread),
    }
    assert not set(READ_ELSEWHERE) & set(reads), "READ_ELSEWHERE names a variable settings.py reads"


def test_every_plain_number_default_in_the_tables_is_the_default_in_settings() -> None:
    reads = settings_reads()
    wrong = []
    for path, names, cell in config_rows():
        if not _PLAIN_NUMBERS.match(cell) or not names:
            continue
        numbers = [float(part.removesuffix(" s")) for part in cell.split(", ")]
        assert len(numbers) == len(names), f"{path}: {names} has the defaults {cell!r}"
        for name, number in zip(names, numbers, strict=True):
            if name in reads and reads[name] != number:
                wrong.append(f"{path}: {name} is documented as {number:g}, settings.py says {reads[name]}")
    assert not wrong, wrong
