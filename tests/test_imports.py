"""Imports go one way: no circles among first-party modules, and the library never reaches up.

- No module of minispec/, model/, sampling/ or benchmarks/ is in an import cycle, counting the
  imports inside functions too: a deferred import is still a dependency, only a later one.
- The library (minispec/ outside minispec/commands/, model/, sampling/) imports neither the
  command line (minispec.commands) nor the benchmarks. `python -m minispec`'s entry,
  minispec/__main__.py, is the command line's front door and so is left out.

Static reads of the source (ast): nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("minispec", "model", "sampling", "benchmarks")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def first_party_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The first-party modules `path` imports, at the top or inside a function. `from a import b`
    is module a.b when that is a module, else a (b is a name defined in a); a relative import
    is resolved against the importing module's package."""
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *filter(None, [base])])
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            # `import a.b.c` names a.b.c; a name that is no module belongs to its nearest module.
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    found.discard(module_name(path))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = first_party_modules()
    return {name: imports_of(path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm), each
    as a sorted list: every module in one can reach every other, so each is one circle or more."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    """One cycle's modules, and who imports whom inside it."""
    members = set(component)
    edges = [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]
    return f"{', '.join(component)}: " + "; ".join(edges)


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The finder itself: a -> b -> c -> a is one cycle, d (imported, importing) none."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions() -> None:
    """cli.py imports build_index only inside run_decode: the graph must still hold the edge."""
    assert "minispec.commands.build_index" in import_graph()["minispec.commands.cli"]


def test_no_first_party_import_cycle() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(c, graph) for c in found)


def is_library(module: str) -> bool:
    if module in ("minispec.__main__",) or module.startswith("minispec.commands"):
        return False
    return module.split(".")[0] in ("minispec", "model", "sampling")


def test_the_library_imports_neither_the_commands_nor_the_benchmarks() -> None:
    graph = import_graph()
    offenders = [
        f"{module} imports {target}"
        for module in sorted(graph)
        if is_library(module)
        for target in sorted(graph[module])
        if target.startswith(("minispec.commands", "benchmarks"))
    ]
    assert not offenders, "\n".join(offenders)
