"""Every module of the harness stays small enough to read, and every function short enough to follow (issue 46):
no module over 400 lines, no function over 60. Past either, split it along its seams."""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def long_modules(root: Path = HARNESS) -> dict[str, int]:
    sizes = {str(path.relative_to(root.parent)): len(path.read_text().splitlines()) for path in sorted(root.rglob("*.py"))}
    return {path: lines for path, lines in sizes.items() if lines > MAX_MODULE_LINES}


def long_functions(root: Path = HARNESS) -> dict[str, int]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                found[f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"] = node.end_lineno - node.lineno + 1
    return found


def test_made_up_offenders_are_found(tmp_path):
    package = tmp_path / "harness"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text("def long():\n" + body + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    (package / "short.py").write_text("def short():\n    return 1\n")
    assert long_modules(package) == {"harness/long.py": MAX_MODULE_LINES + 1}
    assert long_functions(package) == {"harness/long.py:1 long": MAX_FUNCTION_LINES + 1}


def test_no_harness_module_is_over_400_lines():
    assert long_modules() == {}


def test_no_harness_function_is_over_60_lines():
    assert long_functions() == {}
