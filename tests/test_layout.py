"""The package's layering, as its docstring draws it, against the real import graph."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import forged

PACKAGE = Path(forged.__file__).parent


def _layers() -> list[list[str]]:
    """The module names of each layer the package docstring draws, from the top."""
    drawing = (forged.__doc__ or "").split("::\n\n", 1)[1].split("\n\n", 1)[0]
    layers: list[list[str]] = []
    for line in drawing.splitlines():
        names = re.split(r"\s{2,}", line.strip())[0]
        if line.startswith("    ") and not line.startswith("     "):
            layers.append(names.split())
    return layers


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The forged modules `name` imports, anywhere in it (lazy imports too)."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:
                full = f"{target}.{alias.name}".strip(".")
                found.add(full if full in modules else target)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("forged."):
            found.add((node.module or "").removeprefix("forged."))
    return {module for module in found if module in modules and module != name}


def _layer_of(module: str, layers: list[list[str]]) -> int:
    for index, names in enumerate(layers):
        if module in names or module.split(".")[0] in names:
            return index
    raise AssertionError(f"forged.{module} is in no layer of the package docstring")


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    layers = _layers()
    assert len(layers) > 10 and ["_wire"] in layers
    modules = _modules()
    upward = []
    for name, path in modules.items():
        for imported in _imports(name, path, modules):
            if _layer_of(imported, layers) < _layer_of(name, layers):
                upward.append(f"{name} -> {imported}")
    assert upward == []


def test_no_module_imports_the_package_itself() -> None:
    """``from . import name`` of what is not a module reads the package's ``__init__``, which
    loads the session and all under it: a cycle the graph below would not show."""
    modules = _modules()
    found = []
    for name, path in modules.items():
        package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and not node.module and (
                    len(package) - node.level + 1 == 0):
                found += [f"{name}: from . import {alias.name}" for alias in node.names
                          if alias.name not in modules]
    assert found == []


def test_there_is_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append(" -> ".join([*trail[trail.index(name):], name]))
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert cycles == []
