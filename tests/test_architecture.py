"""Imports run one way (STYLE.md, "Layout shows the architecture"; docs/architecture.md).

Every module under backplane/, api/, recovery/, dashboard/, demo/ and backplane_client/ is read
with ``ast``, not imported: ``import x`` and ``from x import y`` anywhere in a file count, inside
functions and under ``if TYPE_CHECKING:`` too, with relative imports resolved. A lower part that
reached up "only lazily" would still depend on the part above it; a circle closed by a lazy
import is a circle. No module is longer than ``MAX_MODULE_LINES``.

The offline verifier is the exception to "anywhere": what matters there is what runs when it
is imported, so only imports at module level (not in a function, not under ``TYPE_CHECKING``)
count, followed through every first-party module they load, parent packages included.
tests/backplane/integrity/test_audit_verify.py checks the same in a real process; this one says which
line is to blame.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("backplane", "api", "recovery", "dashboard", "demo", "backplane_client")
# A module longer than this does more than one job (STYLE.md); a migration is generated, not read.
MAX_MODULE_LINES = 800

LOWER_PARTS = ("backplane.eventlog", "backplane.delivery", "backplane.integrity", "backplane.runtime",
               "backplane.privacy")
CORE_PARTS = ("backplane.eventlog", "backplane.delivery", "backplane.integrity")
# What ``python -m backplane.integrity.audit verify`` loads: the package's __main__, then the verifier.
OFFLINE_VERIFIER = ("backplane.integrity.audit.__main__", "backplane.integrity.audit.verify",
                    "backplane.integrity.audit.proof")
DATABASE_LIBRARIES = ("django", "psycopg", "psycopg2", "psycopg_pool")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. "backplane.eventlog.writer"; a package is named by its __init__
    path: str  # relative to the repository, for messages
    source: str

    @property
    def is_package(self) -> bool:
        return self.path.endswith("__init__.py")


@dataclass(frozen=True)
class Import:
    module: Module
    line: int
    target: str  # the dotted name the statement reaches: "recovery.sagas.x" for ``from recovery.sagas import x``
    statement: str  # as written, on one line
    at_import_time: bool  # at module level and not under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        return f"{self.module.path}:{self.line}: {self.statement}"


@dataclass(frozen=True)
class Rule:
    description: str
    sources: tuple[str, ...]  # modules in these packages...
    forbidden: tuple[str, ...]  # ...may not import anything in these
    exempt: tuple[str, ...] = ()  # ...except these modules of theirs


RULES = (
    Rule(
        "the event log, delivery, integrity, runtime and privacy do not import recovery, the dashboard or the API",
        sources=LOWER_PARTS,
        forbidden=("recovery", "dashboard", "api"),
    ),
    Rule("recovery does not import the dashboard or the API", sources=("recovery",),
         forbidden=("dashboard", "api")),
    Rule("the runtime does not import the event log, delivery or integrity", sources=("backplane.runtime",),
         forbidden=CORE_PARTS),
    # The event log writes into delivery's outbox in its transaction; delivery knows tasks only by
    # id, so the two never import each other both ways.
    Rule("delivery does not import the event log or integrity", sources=("backplane.delivery",),
         forbidden=("backplane.eventlog", "backplane.integrity")),
    # Personal values are sealed before the writer sees them (at the API's door), so the event log
    # and integrity never need the keys: a chain, a seal or an export is checked without them.
    Rule("the event log, delivery and integrity do not import privacy",
         sources=("backplane.eventlog", "backplane.delivery", "backplane.integrity"), forbidden=("backplane.privacy",)),
    Rule("the shared helpers import no part", sources=("backplane.lib",),
         forbidden=(*CORE_PARTS, "backplane.runtime", "recovery", "dashboard", "api")),
    # The two surfaces stand side by side: the dashboard reads through the parts' selectors.
    Rule("the dashboard does not import the API", sources=("dashboard",), forbidden=("api",)),
    Rule("the API does not import the dashboard", sources=("api",), forbidden=("dashboard",)),
    # The demo fleet is a client of the product that sits on top of it (docs/demo.md).
    Rule("nothing imports the demo fleet", sources=("backplane", "api", "recovery", "dashboard"), forbidden=("demo",)),
    # Its agents are what a customer would write: the SDK, no Django, no database, no product code.
    Rule("the demo's agents use only the SDK", sources=("demo.agent", "demo.llm"),
         forbidden=("backplane", "recovery", "dashboard", "django", "psycopg")),
    # Every part reports through telemetry (traces, counters, log fields); it knows none of them.
    Rule("telemetry imports no part", sources=("backplane.telemetry",),
         forbidden=(*CORE_PARTS, "backplane.runtime", "backplane.metrics", "recovery", "dashboard", "api")),
    # The API is a surface on top (api/, beside dashboard/); the lower package reaches it only
    # where it wires the surfaces into one process: its URL conf, its ASGI entry and its settings.
    Rule("the lower package imports the API only in its wiring", sources=("backplane",), forbidden=("api",),
         exempt=("backplane.urls", "backplane.asgi", "backplane.settings")),
    # Its admin too: the agents' and the dead letters' admin act through recovery's services, so
    # they are registered by recovery/admin.py.
    Rule("the lower package does not import recovery", sources=("backplane",), forbidden=("recovery",)),
)


# --- reading the code ----------------------------------------------------------------------


def module_name(relative: Path) -> str:
    parts = relative.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load_tree(root: Path = ROOT) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            name = module_name(relative)
            modules[name] = Module(name=name, path=relative.as_posix(), source=path.read_text(encoding="utf-8"))
    return modules


def fake_module(path: str, source: str) -> Module:
    return Module(name=module_name(Path(path)), path=path, source=source)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: Module, level: int, name: str | None) -> str:
    """The absolute module a ``from`` statement names, with ``level`` leading dots."""
    if not level:
        return name or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if level - 1 >= len(package):
        raise ValueError(f"{module.path}: relative import beyond the top-level package")
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(module: Module) -> Iterator[Import]:
    tree = ast.parse(module.source, filename=module.path)

    def statement(node: ast.stmt) -> str:
        return " ".join((ast.get_source_segment(module.source, node) or "").split())

    def visit(node: ast.AST, at_import_time: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, node.lineno, alias.name, statement(node), at_import_time)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node.level, node.module)
            for alias in node.names:
                target = base if alias.name == "*" else f"{base}.{alias.name}"
                yield Import(module, node.lineno, target, statement(node), at_import_time)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for child in ast.iter_child_nodes(node):
                yield from visit(child, False)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, False)
            for child in node.orelse:  # the ``else`` of ``if TYPE_CHECKING`` is what runs
                yield from visit(child, at_import_time)
        else:
            for child in ast.iter_child_nodes(node):
                yield from visit(child, at_import_time)

    yield from visit(tree, True)


def within(name: str, packages: Iterable[str]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


# --- the checks ----------------------------------------------------------------------------


def rule_violations(rule: Rule, modules: Iterable[Module]) -> list[str]:
    found: list[str] = []
    for module in modules:
        if not within(module.name, rule.sources) or module.name in rule.exempt:
            continue
        for imp in imports_of(module):
            if within(imp.target, rule.forbidden) and str(imp) not in found:
                found.append(str(imp))
    return found


def _loaded_module(target: str, modules: Mapping[str, Module]) -> str | None:
    """The first-party module an import of ``target`` executes (``a.b.name`` -> ``a.b``)."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _with_parents(name: str, modules: Mapping[str, Module]) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, then ``a.b``, then ``a.b.c``."""
    parts = name.split(".")
    return [p for p in (".".join(parts[:end]) for end in range(1, len(parts) + 1)) if p in modules]


def verifier_violations(modules: Mapping[str, Module], entries: Iterable[str] = OFFLINE_VERIFIER) -> list[str]:
    """Imports of Django or psycopg that run when the offline verifier is imported, each with
    the chain of first-party imports that leads to it."""
    how: dict[str, tuple[str, ...]] = {}  # module -> the imports that load it, from an entry
    queue: list[str] = []
    for entry in entries:
        for name in _with_parents(entry, modules):
            if name not in how:
                how[name] = ()
                queue.append(name)
    found: list[str] = []
    while queue:
        name = queue.pop(0)
        for imp in imports_of(modules[name]):
            if not imp.at_import_time:
                continue
            chain = (*how[name], str(imp))
            if within(imp.target, DATABASE_LIBRARIES):
                found.append(" -> ".join(chain))
                continue
            loaded = _loaded_module(imp.target, modules)
            for next_name in _with_parents(loaded, modules) if loaded else []:
                if next_name not in how:
                    how[next_name] = chain
                    queue.append(next_name)
    return found


def import_graph(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Each module and the first-party modules its imports load (anywhere in it, as the rules
    count them: a circle closed only by a lazy import is still a circle)."""
    graph: dict[str, set[str]] = {}
    for name, module in modules.items():
        loaded = {_loaded_module(imp.target, modules) for imp in imports_of(module)}
        graph[name] = {target for target in loaded if target is not None and target != name}
    return graph


def import_circle(modules: Mapping[str, Module]) -> list[str] | None:
    """One circle of imports (``a -> b -> a``), or None when the imports run one way."""
    try:
        graphlib.TopologicalSorter(import_graph(modules)).prepare()
    except graphlib.CycleError as exc:
        circle: list[str] = exc.args[1]
        return circle
    return None


def modules_too_long(modules: Iterable[Module], limit: int = MAX_MODULE_LINES) -> list[str]:
    return [f"{module.path}: {lines} lines" for module in modules
            if ".migrations." not in f".{module.name}."
            and (lines := len(module.source.splitlines())) > limit]


def violations_message(description: str, found: list[str]) -> str:
    return f"{description}; {len(found)} import(s) break it:\n  " + "\n  ".join(found)


# --- the real tree -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tree() -> dict[str, Module]:
    return load_tree()


def test_it_reads_the_whole_code_base(tree: dict[str, Module]) -> None:
    # A wrong root or pattern would make every check below pass on nothing.
    assert len(tree) > 40, sorted(tree)
    for name in ("backplane.eventlog.writer", "backplane.delivery.relay", "backplane.integrity.sealing",
                 "backplane.runtime.launcher", "api.views", "recovery.handlers", "dashboard.routing",
                 *OFFLINE_VERIFIER):
        assert name in tree, name
    assert sum(1 for _ in imports_of(tree["backplane.eventlog.writer"])) > 10


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.description)
def test_imports_run_one_way(rule: Rule, tree: dict[str, Module]) -> None:
    found = rule_violations(rule, tree.values())
    assert not found, violations_message(rule.description, found)


def test_no_import_circles(tree: dict[str, Module]) -> None:
    circle = import_circle(tree)
    assert circle is None, "an import circle (move what both sides need down a level): " + " -> ".join(circle or [])


def test_no_module_over_the_line_limit(tree: dict[str, Module]) -> None:
    found = modules_too_long(tree.values())
    assert not found, f"over {MAX_MODULE_LINES} lines (split it by job): " + ", ".join(found)


def test_the_offline_verifier_loads_neither_django_nor_psycopg(tree: dict[str, Module]) -> None:
    found = verifier_violations(tree)
    assert not found, violations_message("the offline verifier must import without Django or psycopg", found)


# --- the checker catches what it is there to catch -------------------------------------------


@pytest.mark.parametrize(
    ("rule", "path", "source", "reported"),
    [
        (RULES[0], "backplane/eventlog/fake.py", "from recovery.sagas import x\n", "1: from recovery.sagas import x"),
        (RULES[0], "backplane/delivery/fake.py", "def f():\n    from api import views\n",
         "2: from api import views"),
        (RULES[0], "backplane/integrity/audit/fake.py",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dashboard.routing\n",
         "3: import dashboard.routing"),
        (RULES[2], "backplane/runtime/fake.py", "from ..eventlog.models import Task\n",
         "1: from ..eventlog.models import Task"),
        (RULES[2], "backplane/runtime/__init__.py", "from .. import eventlog\n", "1: from .. import eventlog"),
        (RULES[1], "recovery/fake.py", "import api\n", "1: import api"),
        (RULES[-2], "backplane/models.py", "from api import views\n", "1: from api import views"),
        (RULES[-1], "backplane/admin.py", "def f():\n    from recovery import bulk\n", "2: from recovery import bulk"),
        (RULES[1], "recovery/fake.py", "class C:\n    import dashboard\n", "2: import dashboard"),
        (RULES[2], "backplane/runtime/fake.py", "from backplane.eventlog.writer import write_events\n",
         "1: from backplane.eventlog.writer import write_events"),
        (RULES[2], "backplane/runtime/fake.py", "def f():\n    from .. import delivery\n",
         "2: from .. import delivery"),
        (RULES[2], "backplane/runtime/fake.py", "import backplane.integrity.sealing as s\n",
         "1: import backplane.integrity.sealing as s"),
        (RULES[3], "backplane/delivery/fake.py", "from backplane.eventlog.models import Task\n",
         "1: from backplane.eventlog.models import Task"),
        (RULES[6], "dashboard/fake.py", "from api.base import ApiView\n",
         "1: from api.base import ApiView"),
        (RULES[7], "api/fake.py", "from dashboard import selectors\n", "1: from dashboard import selectors"),
        (RULES[4], "backplane/integrity/fake.py", "from backplane.privacy.sealing import seal_personal\n",
         "1: from backplane.privacy.sealing import seal_personal"),
        (RULES[5], "backplane/lib/fake.py", "from backplane.delivery import outbox\n",
         "1: from backplane.delivery import outbox"),
    ],
)
def test_each_rule_reports_a_violation_with_its_line(rule: Rule, path: str, source: str, reported: str) -> None:
    assert rule_violations(rule, [fake_module(path, source)]) == [f"{path}:{reported}"]


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("recovery/fake.py", "from backplane.eventlog.writer import write_events\nfrom backplane import metrics\n"),
        ("api/fake.py", "from recovery import leases\n"),
        ("backplane/eventlog/fake.py", "from backplane.delivery.outbox import Message\nfrom . import chain\n"),
        ("backplane/runtime/fake.py", "from backplane.runtime import embedded_db\nimport backplane.apps\n"),
        ("dashboard/fake.py", "from backplane.eventlog import selectors\nfrom recovery import selectors\n"),
    ],
)
def test_imports_that_respect_the_layers_are_not_reported(path: str, source: str) -> None:
    module = fake_module(path, source)
    assert [rule_violations(rule, [module]) for rule in RULES] == [[] for _ in RULES]


def test_the_circle_check_reports_a_lazy_circle_and_passes_one_way_imports() -> None:
    one_way = {m.name: m for m in (fake_module("recovery/a.py", "from recovery import b\n"),
                                   fake_module("recovery/b.py", "import json\n"))}
    assert import_circle(one_way) is None
    lazy = {**one_way, "recovery.b": fake_module("recovery/b.py", "def f():\n    from recovery.a import x\n")}
    assert set(import_circle(lazy) or []) == {"recovery.a", "recovery.b"}


def test_the_line_limit_reports_a_long_module_but_not_a_migration() -> None:
    long = "x = 1\n" * (MAX_MODULE_LINES + 1)
    assert modules_too_long([fake_module("recovery/a.py", long), fake_module("recovery/migrations/0001_x.py", long),
                             fake_module("recovery/b.py", "x = 1\n" * MAX_MODULE_LINES)]) == [
        f"recovery/a.py: {MAX_MODULE_LINES + 1} lines"]


def _tree_with(tree: Mapping[str, Module], path: str, source: str) -> dict[str, Module]:
    module = fake_module(path, source)
    return {**tree, module.name: module}


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        ("import django\n", "import django"),
        ("from django.conf import settings\n", "from django.conf import settings"),
        ("try:\n    import psycopg\nexcept ImportError:\n    psycopg = None\n", "import psycopg"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    from psycopg import sql\n",
         "from psycopg import sql"),
    ],
)
def test_the_verifier_check_reports_a_database_import_at_module_level(
    tree: dict[str, Module], source: str, reported: str
) -> None:
    path = "backplane/integrity/audit/verify.py"
    found = verifier_violations(_tree_with(tree, path, source))
    assert len(found) == 1 and found[0].startswith(f"{path}:") and found[0].endswith(reported), found


def test_the_verifier_check_follows_first_party_imports(tree: dict[str, Module]) -> None:
    # chain.py is what the verifier imports for hashing; a model import there would load Django.
    path = "backplane/eventlog/chain.py"
    found = verifier_violations(_tree_with(tree, path, tree["backplane.eventlog.chain"].source
                                           + "\nfrom backplane.eventlog.models import Event\n"))
    models = tree["backplane.eventlog.models"]
    assert found, "a module-level model import in chain.py was not followed"
    assert all(f"{path}:" in chain and f"{models.path}:" in chain for chain in found), found
    assert any("from django.db import models" in chain for chain in found), found


def test_the_verifier_check_follows_parent_packages(tree: dict[str, Module]) -> None:
    path = "backplane/integrity/__init__.py"
    found = verifier_violations(_tree_with(tree, path, "from django.db import connection\n"))
    assert found == [f"{path}:1: from django.db import connection"]


def test_the_verifier_check_allows_lazy_and_type_only_imports(tree: dict[str, Module]) -> None:
    source = tree["backplane.integrity.audit.verify"].source + (
        "\nif TYPE_CHECKING:\n    from django.db.models import QuerySet\n"
        "\ndef _later():\n    import psycopg\n"
    )
    assert verifier_violations(_tree_with(tree, "backplane/integrity/audit/verify.py", source)) == []
