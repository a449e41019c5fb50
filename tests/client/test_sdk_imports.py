"""The SDK's modules import each other one way (STYLE.md, "imports run one way").

Read with ``ast`` as tests/test_architecture.py reads the product, so an import under
``if TYPE_CHECKING:`` or inside a function counts too. The package's ``__init__`` is left out:
it is the facade that names every module's exports and is imported by none of them.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_architecture import ROOT, Module, _loaded_module, imports_of, module_name


def sdk_modules() -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((ROOT / "backplane_client").glob("*.py")):
        relative = path.relative_to(ROOT)
        if path.name != "__init__.py":
            name = module_name(relative)
            modules[name] = Module(name=name, path=relative.as_posix(), source=path.read_text(encoding="utf-8"))
    return modules


def import_cycles(modules: dict[str, Module]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for name, module in modules.items():
        targets = {_loaded_module(imp.target, modules) for imp in imports_of(module)}
        graph[name] = {target for target in targets if target is not None and target != name}
    cycles: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for target in sorted(graph[path[-1]]):
            if target == path[0]:
                cycles.append([*path, target])
            elif target not in path and target > path[0]:  # each cycle once, from its smallest module
                walk([*path, target])

    for start in sorted(graph):
        walk([start])
    return cycles


def test_no_sdk_module_imports_one_that_imports_it_back() -> None:
    assert import_cycles(sdk_modules()) == []


def test_it_sees_a_cycle_made_of_type_checking_imports() -> None:
    modules = {
        name: Module(name=name, path=str(Path(*name.split(".")).with_suffix(".py")), source=source)
        for name, source in {
            "backplane_client.a": "from backplane_client.b import B\n",
            "backplane_client.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from backplane_client.a import A\n",
        }.items()
    }
    assert import_cycles(modules) == [["backplane_client.a", "backplane_client.b", "backplane_client.a"]]
