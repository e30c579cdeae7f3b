"""The package's layering, as its docstring draws it, against the real import graph."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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


def _imports(name: str, path: Path, modules: dict[str, Path],
             tree: ast.AST | None = None) -> set[str]:
    """The forged modules `name` imports, anywhere in it (lazy imports too), or in `tree`,
    a part of it."""
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    found: set[str] = set()
    for node in ast.walk(tree or ast.parse(path.read_text())):
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


def _opened_nurseries() -> dict[str, list[tuple[str, str]]]:
    """Each name a nursery is opened as (``async with trio.open_nursery() as name``), and
    the (module, function) pairs that open one under it."""
    opened: dict[str, list[tuple[str, str]]] = {}
    for module, path in _modules().items():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.AsyncWith):
                    continue
                for item in node.items:
                    call, target = item.context_expr, item.optional_vars
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                            and call.func.attr == "open_nursery"
                            and isinstance(target, ast.Name)):
                        opened.setdefault(target.id, []).append((module, function.name))
    return opened


@pytest.mark.parametrize("module", ["_fronts.stdio", "_daemon"])
def test_a_supervision_tree_is_one_function_and_its_drawing_is_true(module: str) -> None:
    """The tree the module's docstring draws: its root is one function, which opens every
    nursery of this module; each nursery the drawing names elsewhere is opened there."""
    path = _modules()[module]
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    drawing = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    root = drawing.split()[0]
    named = set(re.findall(r"\b(\w+_nursery)\b", drawing))
    opened = _opened_nurseries()
    assert named, f"forged.{module} draws no nursery"
    for name in sorted(named):
        assert opened.get(name), f"no function opens {name}"
    here = {(name, function) for name, openers in opened.items()
            for opener, function in openers if opener == module and name.endswith("_nursery")}
    assert here == {(name, root) for name, _ in here}, f"not all opened in {root}: {here}"
    assert {name for name, _ in here} <= named, "a nursery of this module the drawing lacks"


def test_every_exception_class_is_in_the_drawn_tree() -> None:
    """`forged._errors` holds every exception class forged defines, and its docstring draws
    each one (the two in `forged._mcp.http` are httpx2's errors too, and said so there)."""
    from forged import _errors

    drawing = _errors.__doc__ or ""
    defined = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    re.search(r"(Error|Exception|Exited|Gone|Failed|Refused|Timeout)$",
                              ast.unparse(base)) for base in node.bases):
                defined[node.name] = module
    outside = {name: module for name, module in defined.items()
               if module != "_errors" and name not in ("MessageTooLarge", "EventTooLarge")}
    assert outside == {}
    for name, obj in vars(_errors).items():
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == (
                "forged._errors"):
            assert re.search(rf"\b{name}\b", drawing), f"{name} is not drawn"


def _deferred_imports() -> dict[str, set[str]]:
    """What each function imports inside itself: the module (forged's own by name, others'
    by their top package) and where."""
    modules = _modules()
    found: dict[str, set[str]] = {}
    for name, path in [*modules.items(), ("", PACKAGE / "__init__.py")]:
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
                continue
            for node in ast.walk(function):
                targets: set[str] = set()
                if isinstance(node, ast.Import):
                    targets = {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    module = node.module or ""
                    targets = {module.split(".")[0] if not module.startswith("forged.")
                               else module}
                elif isinstance(node, ast.ImportFrom) and not name:  # the package's own
                    targets = {f"forged.{node.module or alias.name}" for alias in node.names}
                elif isinstance(node, ast.ImportFrom):
                    targets = {f"forged.{target}" for target in _imports(
                        name, path, modules, node)}
                for target in targets:
                    found.setdefault(target, set()).add(f"{name}.{function.name}")
    return found


def test_every_deferred_import_is_listed_with_its_reason() -> None:
    from forged._startup import DEFERRED

    found = _deferred_imports()
    assert {module: sorted(where) for module, where in found.items()
            if module not in DEFERRED} == {}, "imported late without a reason in DEFERRED"
    assert sorted(set(DEFERRED) - set(found)) == [], "listed in DEFERRED, imported at the top"


MAX_MODULE_LINES = 650
"""Past this a module is two concepts (the protocol's classes, `forged._wire`, excepted: one
concept, long because the protocol is)."""


def test_no_module_is_two_concepts_long() -> None:
    long = {module: lines for module, path in _modules().items()
            if not module.startswith("_wire")
            and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
