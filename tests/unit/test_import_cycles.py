"""The import graph of the package has no cycle, type-only imports included.

A cycle through `if TYPE_CHECKING:` is the mark of a helper that takes a hub
(the front, the engine) whole and reaches back into it; helpers get what they
use instead: collaborators, or a small protocol (server/partition/ports.py).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> dict[str, Path]:
    """Every module by its import name, laid out as pyproject.toml's package-dir maps folders to packages."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, Path] = {}
    for package in setup["packages"]:
        parent, _, leaf = package.rpartition(".")
        folder = setup["package-dir"].get(package)
        if folder is None:
            folder = str(Path(setup["package-dir"].get(parent, parent.replace(".", "/"))) / leaf)
        for path in (ROOT / folder).glob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


def _graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs or [node.module]  # `from pkg import submodule` imports the submodule
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_has_the_modules_and_their_type_only_imports() -> None:
    modules = _modules()
    for name in ("streamtx.server.partition.engine", "streamtx.server.front.front", "streamtx.recovery.log"):
        assert name in modules
    graph = _graph(modules)
    assert "streamtx.server.partition.state" in graph["streamtx.server.partition.engine"]
    assert "streamtx.server.partition.journal" in graph["streamtx.server.partition.dataflow"]  # under TYPE_CHECKING


def test_a_cycle_is_found() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_its_way_back_to_itself() -> None:
    assert _cycles(_graph(_modules())) == []
