"""Facts about the package's modules that anyone can check: no import cycle, no file over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "dartree"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere in its body (deferred imports count too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import a.b.c` of a name inside a module: its module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> nx.DiGraph:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for f in files:
        for target in imported_modules(f, modules):
            # a package's __init__ runs before its submodules, so importing `a.b` also imports `a`; that
            # edge is implied and would make every `from . import x` in an __init__ look like a cycle
            if not module_name(f).startswith(target + "."):
                graph.add_edge(module_name(f), target)
    return graph


def test_the_graph_sees_relative_and_deferred_imports():
    graph = import_graph()
    assert graph.has_edge("dartree.train.cli", "dartree.train.presets")  # from .presets import get_preset
    assert graph.has_edge("dartree.train.datagen", "dartree.models.target")  # from ..models.target import ...
    assert graph.number_of_edges() > 30


def test_no_import_cycle_among_the_package_modules():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:10])


def test_no_file_in_the_package_over_500_lines():
    long = {str(f.relative_to(PACKAGE.parent)): n for f in PACKAGE.rglob("*.py")
            if (n := len(f.read_text().splitlines())) > 500}
    assert not long, long
