"""What gets installed where: the runtime set, the development set and the client package.

``requirements.txt`` is what the production image installs (Dockerfile); ``requirements-dev.txt``
adds the test, benchmark and lint tools on top (``make venv``). The split is derived here from the
code itself: the distributions the product imports (and what they depend on) must all be in the
runtime file, and what only the tests and benchmarks import must not be.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("backplane", "api", "recovery", "dashboard", "backplane_client", "manage.py")
TEST_CODE = ("tests", "bench")
LOCAL = {"backplane", "api", "recovery", "dashboard", "backplane_client", "tests", "bench"}
# The product also needs what it names only in strings, commands or settings, never in an import.
NAMED_NOT_IMPORTED = (
    "uvicorn[standard]",  # the web server (docker-compose.yml, the launcher)
    "channels-postgres",  # the embedded Channels layer (settings.CHANNEL_LAYERS)
    "channels-redis",  # the production Channels layer
    "redis",  # the production Celery broker
    "whitenoise",  # settings.MIDDLEWARE
    "drf-spectacular-sidecar",  # settings.INSTALLED_APPS: the API docs' assets
    "psycopg[binary,pool]",  # Django's PostgreSQL backend and its pool
    "plotly",  # its JavaScript is served as a static file (settings.STATICFILES_DIRS)
    "django-axes",  # settings.INSTALLED_APPS and AUTHENTICATION_BACKENDS: login throttling
)
# Tools run as programs, never imported: they belong to the development set by definition.
DEV_TOOLS = {"pytest", "pytest-django", "pytest-timeout", "ruff", "mypy", "django-stubs",
             "djangorestframework-stubs", "schemathesis", "moto", "playwright", "hypothesis"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path) -> dict[str, str]:
    """name -> the whole requirement line, for every requirement in ``path`` (not ``-r`` lines)."""
    lines = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            lines[canonical(Requirement(line).name)] = line
    return lines


def _run_time_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``, which only the type checker imports."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def imported_modules(roots: Iterable[str]) -> set[str]:
    """Top-level names of absolute imports anywhere in ``roots`` (nested imports included), but
    for those only the type checker makes."""
    names: set[str] = set()
    for root in roots:
        path = REPO / root
        for file in [path] if path.is_file() else path.rglob("*.py"):
            for node in _run_time_nodes(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names and name not in LOCAL}


def distributions_of(modules: Iterable[str]) -> set[str]:
    """The installed distributions providing ``modules`` (the ones not installed are skipped:
    a test helper module such as ``_support`` is no distribution)."""
    providers = packages_distributions()
    return {canonical(dist) for module in modules for dist in providers.get(module, [])}


@cache
def _requires(name: str, extras: frozenset[str]) -> tuple[tuple[str, frozenset[str]], ...]:
    try:
        requirements = distribution(name).requires or []
    except PackageNotFoundError:
        return ()
    found = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker and not any(requirement.marker.evaluate({"extra": e}) for e in extras or {""}):
            continue
        found.append((canonical(requirement.name), frozenset(requirement.extras)))
    return tuple(found)


def closure(roots: Iterable[str]) -> set[str]:
    """``roots`` (requirement strings, extras allowed) and everything they depend on, as installed."""
    pending = [(canonical(r.name), frozenset(r.extras)) for r in map(Requirement, roots)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        item = pending.pop()
        if item not in seen:
            seen.add(item)
            pending.extend(_requires(*item))
    return {name for name, _ in seen}


@pytest.fixture(scope="module")
def runtime_needs() -> set[str]:
    return closure([*distributions_of(imported_modules(PRODUCT)), *NAMED_NOT_IMPORTED])


def test_it_pins_every_requirement_exactly() -> None:
    for path in (REPO / "requirements.txt", REPO / "requirements-dev.txt", REPO / "requirements-bench.txt"):
        for line in pinned(path).values():
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[^=\s]+", line), f"{path.name}: {line!r} unpinned"


def test_the_development_set_adds_to_the_runtime_set_without_repeating_it() -> None:
    dev_lines = (REPO / "requirements-dev.txt").read_text().splitlines()
    assert "-r requirements.txt" in dev_lines
    assert not set(pinned(REPO / "requirements.txt")) & set(pinned(REPO / "requirements-dev.txt"))


def test_the_bench_set_stands_alone_and_agrees_with_the_other_two() -> None:
    """requirements-bench.txt (the peers of `make bench`, bench/peers.py) is installed into a venv
    of its own: it names everything it needs, at the versions the other two files pin."""
    bench = pinned(REPO / "requirements-bench.txt")
    assert not [line for line in (REPO / "requirements-bench.txt").read_text().splitlines() if line.startswith("-")]
    assert {"dbos", "langgraph", "langgraph-checkpoint-postgres"} <= set(bench)
    others = {**pinned(REPO / "requirements.txt"), **pinned(REPO / "requirements-dev.txt")}
    assert not {"dbos", "langgraph", "langsmith"} & set(others), "the peers belong to the bench set only"
    disagree = {name: (line, others[name]) for name, line in bench.items()
                if name in others and line.split("==")[1] != others[name].split("==")[1]}
    assert not disagree, f"requirements-bench.txt pins other versions than the product: {disagree}"
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet -r requirements-bench.txt" in makefile
    assert "requirements-bench" not in makefile.split("\n$(STAMP):")[1].split("\n\n")[0], "not in `make venv`"


def test_the_runtime_set_holds_everything_the_product_imports(runtime_needs: set[str]) -> None:
    missing = runtime_needs - set(pinned(REPO / "requirements.txt"))
    assert not missing, f"the product needs {sorted(missing)}: add them to requirements.txt"


def test_it_keeps_test_only_packages_out_of_the_runtime_set(runtime_needs: set[str]) -> None:
    test_only = (distributions_of(imported_modules(TEST_CODE)) | DEV_TOOLS) - runtime_needs
    assert {"pytest", "schemathesis", "moto", "playwright", "ruff"} <= test_only
    in_runtime = test_only & set(pinned(REPO / "requirements.txt"))
    assert not in_runtime, f"test-only packages in requirements.txt: {sorted(in_runtime)}"
    # And nothing rides along that the product does not need (a leftover of an old freeze).
    unneeded = set(pinned(REPO / "requirements.txt")) - runtime_needs
    assert not unneeded, f"requirements.txt holds {sorted(unneeded)}, which the product never uses"


def test_the_dockerfile_installs_only_the_runtime_set_and_make_installs_both() -> None:
    dockerfile = "\n".join(line for line in (REPO / "Dockerfile").read_text().splitlines()
                           if not line.lstrip().startswith("#"))
    assert "pip install -r /tmp/requirements-image.txt" in dockerfile
    assert "requirements-dev" not in dockerfile
    assert "requirements-bench" not in dockerfile
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet -r requirements-dev.txt" in makefile
    assert not (REPO / ".dockerignore").read_text().count("requirements")


def test_the_client_package_declares_httpx_and_rfc8785_as_its_only_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"] == ["backplane_client"]
    assert [Requirement(r).name for r in project["project"]["dependencies"]] == ["httpx", "rfc8785"]
    client_imports = distributions_of(imported_modules(["backplane_client"]))
    # psycopg is imported inside the consumer helpers only, and is the "consumer" extra;
    # confluent-kafka inside the Kafka one only, the "kafka" extra.
    assert client_imports <= {"httpx", "rfc8785", "psycopg", "psycopg-binary", "confluent-kafka"}, client_imports
    extras = {name: [Requirement(r).name for r in requirements]
              for name, requirements in project["project"]["optional-dependencies"].items()}
    assert extras == {"consumer": ["psycopg"], "kafka": ["psycopg", "confluent-kafka"]}


@pytest.mark.slow
def test_the_client_installs_and_imports_in_a_fresh_venv_without_django(tmp_path: Path) -> None:
    """Build from a copy (a build in place would leave build/ and *.egg-info in the work tree),
    install into a new venv with its declared dependencies from the package index, import."""
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copytree(REPO / "backplane_client", source / "backplane_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"

    def run(*args: str) -> str:
        done = subprocess.run([str(python), *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run("-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source))
    installed = {canonical(item["name"]) for item in json.loads(run("-m", "pip", "list", "--format", "json"))}
    assert "agent-backplane-client" in installed
    assert not installed & {"django", "djangorestframework", "celery", "psycopg"}, installed
    assert installed - {"pip", "setuptools", "wheel"} <= {"agent-backplane-client"} | closure(["httpx", "rfc8785"]) | {
        "sniffio", "exceptiongroup", "typing-extensions"}, installed
    script = (
        f"venv = {str(venv)!r}\n"
        "import importlib.util, backplane_client\n"
        "from backplane_client import AgentClient, sign, verify\n"
        "assert importlib.util.find_spec('django') is None\n"
        "assert backplane_client.__file__.startswith(venv)\n"
        "header = sign('secret', b'{}', timestamp=1)\n"
        "assert verify('secret', header, b'{}', now=1) == 1\n"
        "print(AgentClient.__module__)\n"
    )
    assert run("-c", script).strip() == "backplane_client.agent"


def test_one_version_names_the_release_everywhere() -> None:
    import backplane

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    changelog = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", (REPO / "CHANGELOG.md").read_text(),
                           re.MULTILINE)
    assert project["project"]["version"] == backplane.__version__ == changelog[0]
    assert (REPO / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]
    assert project["project"]["license"] == {"text": "Apache-2.0"}
