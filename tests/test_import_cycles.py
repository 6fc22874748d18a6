"""No module of ours imports itself back: for every package the wheel ships,
no cycle among its modules' imports, counting every import (at the top,
inside a function, or under ``TYPE_CHECKING``: each says that the two
modules depend on each other)."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIND = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
PACKAGES: list[str] = [pattern.rstrip("*") for pattern in FIND["include"]]
"""The top-level packages the wheel ships (their sub-packages with them)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every Python module of the shipped packages, by dotted name."""
    return {module_name(path): path for package in PACKAGES
            for path in sorted((REPO / package).rglob("*.py"))}


def compiled_modules() -> set[str]:
    """Extension modules (known by their stubs): imported, importing nothing of ours."""
    return {module_name(path) for package in PACKAGES
            for path in (REPO / package).rglob("*.pyi")} - set(modules())


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ours that ``name`` imports.  ``from p import x`` is an
    import of the module ``p.x`` when there is one, else of ``p``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                out.add(submodule if submodule in known else base)
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found) | compiled_modules()
    graph = {name: imports_of(name, path, known) for name, path in found.items()}
    return graph | {name: set() for name in known - set(found)}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package: str) -> None:
    graph = import_graph()
    inside = [c for c in cycles(graph) if c[0].split(".")[0] == package]
    assert inside == [], f"modules that import each other in {package}: {inside}"


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_edges() -> None:
    graph = import_graph()
    assert "comet.files" in graph["spark_jobs.lake.lakefs"]  # absolute, from-import
    assert "spark_jobs.spark.source" in graph["spark_jobs.spark.session"]  # relative, inside a function
