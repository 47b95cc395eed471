"""The torch layer's structure: no import cycles between its modules, and one place that builds
the exceptions for bad indices (so every frontend words them the same)."""
from __future__ import annotations

import ast
import pathlib

import pytest

TORCH_LAYER = pathlib.Path(__file__).resolve().parents[1] / "perfkernels" / "torch"
if not TORCH_LAYER.is_dir():
    pytest.skip("the checkout's perfkernels/torch/ is not next to tests/ (a copy of tests/ run "
                "against an installed wheel)", allow_module_level=True)


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(TORCH_LAYER.parent.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """Every module of ``modules`` that ``path`` imports, at module level or inside a function
    (a lazy import hides a cycle; it does not remove it).  ``from . import _x`` imports the
    submodule ``_x``, not the package."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in TORCH_LAYER.rglob("*.py")}
    compiled = {_module_name(p) for p in TORCH_LAYER.rglob("*.pyx")}   # they import no module here
    return {name: {m for m in _imports(path, set(files) | compiled) if m in files and m != name}
            for name, path in files.items()}


def test_the_graph_sees_the_imports():
    graph = _graph()
    assert "perfkernels.torch._bridge" in graph["perfkernels.torch._bags"]
    assert "perfkernels.torch._placement" in graph["perfkernels.torch._quantized"]


def test_no_import_cycles_between_modules():
    graph = _graph()
    # the package's __init__ re-exports its modules; a module importing the package is fine
    # only where the package does not import it back, which the walk below checks as any other
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_index_errors_are_built_in_one_place():
    builders = []
    for path in TORCH_LAYER.rglob("*.py"):
        if path.name == "_bridge.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "IndexOutOfRangeError"):
                builders.append(f"{path.name}:{node.lineno}")
    assert builders == [], f"build index errors with _bridge.index_error: {builders}"
