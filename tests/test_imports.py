"""The harness's import graph runs one way: no module imports, at any depth, one that imports it back
(lazy imports inside functions included, since they hide a circle rather than remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(HARNESS.parent).with_suffix("").parts).removesuffix(".__init__")


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in HARNESS.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "harness":
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in modules)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names if alias.name.split(".")[0] == "harness")
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                found.append(path[path.index(imported):] + [imported])
            elif imported not in done:
                visit(imported, path + [imported])
        done.add(module)

    for module in sorted(graph):
        visit(module, [module])
    return found


def test_a_made_up_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_harness_imports_without_circles():
    graph = import_graph()
    assert "harness.grading.grade" in graph and "harness.phases" in graph["harness.grading.grade"]
    assert circles(graph) == []


def test_each_phase_module_is_small_enough_to_read():
    """The phases are a package of one module a phase (issue 36): none grows past 400 lines."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in (HARNESS / "phases").glob("*.py")}
    assert sizes and all(lines <= 400 for lines in sizes.values()), sizes
