"""The harness's import graph runs one way: no module imports, at any depth, one that imports it back
(lazy imports inside functions included, since they hide a circle rather than remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(HARNESS.parent).with_suffix("").parts).removesuffix(".__init__")


def _run_time_nodes(tree: ast.AST):
    """Every node but those under `if TYPE_CHECKING:`, imports that never run (an annotation's type)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    return (node for node in ast.walk(tree) if id(node) not in skipped)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in HARNESS.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        tree = ast.parse(path.read_text())
        for node in _run_time_nodes(tree):
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
                found.append(path[path.index(imported) :] + [imported])
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


def test_a_run_reaches_grading_through_its_one_seam():
    """harness/run.py calls grading at the same points whether or not it grades (harness/grading/seam.py), and
    imports nothing else of grading/: a new graded check costs grading/ alone."""
    graph = import_graph()
    assert {module for module in graph["harness.run"] if module.startswith("harness.grading")} == {"harness.grading.seam"}


def test_each_phase_module_is_small_enough_to_read():
    """The phases are a package of one module a phase (issue 36): none grows past 400 lines."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in (HARNESS / "phases").glob("*.py")}
    assert sizes and all(lines <= 400 for lines in sizes.values()), sizes


LAYERS = (  # lowest first: a module imports only modules of its own layer or of those beneath (docs/reference/architecture.md)
    (
        "foundation",
        (
            "harness",
            "harness.compiled",
            "harness.statuses",
            "harness.recordset",
            "harness.margins",
            "harness.triage",
            "harness.preload_compiler",
        ),
    ),
    ("case contract", ("harness.cases", "harness.symptoms", "harness.preload")),  # preload: the fork server imports every case
    ("process", ("harness.process",)),
    ("measurement", ("harness.measure",)),
    ("records", ("harness.records", "harness.spec")),
    ("phases", ("harness.phases",)),
    ("grading", ("harness.grading",)),
    (
        "entry points",
        (
            "harness.run",
            "harness.cli",
            "harness.sweep",
            "harness.seed_sweep",
            "harness.report",
            "harness.matrix",
            "harness.record_changes",
            "harness.scaffold",
            "harness.teach",
            "harness.bench",
            "harness.__main__",
        ),
    ),
)


def layer_of(module: str) -> int:
    """The layer a module belongs to: the one naming it, or the package holding it, most specific name first."""
    best = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (index, name)
    if best is None:
        raise LookupError(f"{module} is in no layer of tests/test_imports.py's LAYERS: place it there")
    return best[0]


def imports_running_back_up(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {imported} ({LAYERS[layer_of(imported)][0]})"
        for module, imported_set in graph.items()
        for imported in imported_set
        if layer_of(imported) > layer_of(module)
    )


def test_a_made_up_import_running_back_up_is_found():
    assert imports_running_back_up({"harness.process.isolate": {"harness.phases.speed"}, "harness.phases.speed": set()}) == [
        "harness.process.isolate (process) imports harness.phases.speed (phases)"
    ]


def test_every_harness_module_has_a_layer_and_no_import_runs_back_up():
    """The process layer (isolate, confine, submitted) and the measurement layer (clock, footprint, timing, compare)
    sit beneath the phases and grading (issue 46): nothing beneath imports what stands on it."""
    graph = import_graph()
    assert {"harness.process.isolate", "harness.measure.clock", "harness.grading.grade"} <= graph.keys()
    assert imports_running_back_up(graph) == []


def test_every_harness_package_is_installed():
    """pyproject.toml lists the packages a non-editable install (the Dockerfile's, a wheel) ships: each folder of
    harness/ with an __init__.py must be there, or an install imports harness and fails on its first subpackage."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "harness").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
