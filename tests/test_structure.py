"""The package's shape: no import cycles between its modules, no module over 600 lines,
backends reached only through the registry, the environment read only by the options.

Imports are read from the source (``ast``), at module level and inside
functions alike, relative imports resolved: a function-level import that
closes a cycle is a cycle all the same, only deferred. ``from pkg import name``
depends on ``pkg.name`` when that is a module, else on ``pkg`` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import anyshape

PACKAGE_DIR = Path(anyshape.__file__).parent
MAX_LINES = 600


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module under ``anyshape/``."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules) -> dict[str, int]:
    """The modules of the package ``name`` imports -> the line of the first such import."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in modules and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node.lineno)
    return found


def _import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    modules = _module_files()
    return {m: _imports(m, p, modules) for m, p in modules.items()}, modules


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm: the components of more than one module (the import cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _cycle_in(component: list[str], graph) -> list[str]:
    """One cycle through the component's first module, as the modules along it."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in members and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return component


def _describe(cycle: list[str], graph, modules) -> str:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        rel = modules[a].relative_to(PACKAGE_DIR.parent)
        steps.append(f"  {a} -> {b}  ({rel}:{graph[a][b]})")
    return "\n".join(steps)


def test_no_import_cycles():
    graph, modules = _import_graph()
    assert "anyshape.codegen.cpu.kernels" in graph  # the walk found the package
    cycles = _strongly_connected(graph)
    report = "\n\n".join(_describe(_cycle_in(c, graph), graph, modules) for c in cycles)
    assert not cycles, f"import cycles between modules of anyshape:\n{report}"


def test_the_cycle_walk_sees_relative_and_function_level_imports():
    graph, _ = _import_graph()
    # ``from . import conv_emit`` (a module of the package, relative).
    assert "anyshape.codegen.cpu.conv_emit" in graph["anyshape.codegen.cpu.kernels"]
    # ``from .api import optimize`` inside ``anyshape.optimize()``.
    assert "anyshape.api" in graph["anyshape"]
    cycle = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _strongly_connected(cycle) == [["a", "b", "c"]]
    assert _cycle_in(["a", "b", "c"], cycle) == ["a", "b", "c", "a"]


def test_no_module_is_over_600_lines():
    long = {
        str(path.relative_to(PACKAGE_DIR.parent)): n
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_only_the_registry_imports_a_backend():
    """A backend's modules are its own business: plugin mode, standalone export and
    every frontend reach a target through ``codegen/registry.py``."""
    graph, modules = _import_graph()
    outside = {
        f"{m} -> {dep}  ({modules[m].relative_to(PACKAGE_DIR.parent)}:{line})"
        for m, deps in graph.items()
        for dep, line in deps.items()
        if dep.startswith("anyshape.codegen.cpu")
        and not m.startswith("anyshape.codegen.cpu")
        and m != "anyshape.codegen.registry"
    }
    assert not outside, "imports of the CPU backend from outside it:\n" + "\n".join(sorted(outside))


def test_only_the_options_module_reads_the_environment():
    """Every knob is an ``Options`` field (help text, keyword argument, and an
    ``ANYSHAPE_*`` variable read in one place)."""
    readers = sorted(
        f"{path.relative_to(PACKAGE_DIR.parent)}:{n}"
        for path in PACKAGE_DIR.rglob("*.py")
        if path.name != "config.py"
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if "os.environ" in line or "os.getenv" in line
    )
    assert not readers, f"environment read outside anyshape/config.py: {readers}"
