"""Teaching a fix: hints, the exercise file a learner starts from, and the model solution shown after."""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

from omegaconf import DictConfig

from harness.cases import REQUIRED_SECTIONS, global_names, load_case, reachable
from harness.grading.common import EXERCISE_FUNCTION
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py


def solution_diff(submitted: Submission, case: ModuleType) -> str:
    """Unified diff from the case's own `fixed` to the submitted function (shown after an accepted grade)."""
    source = Path(submitted.path).read_text()
    node = next(
        (n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == submitted.function), None
    )
    mine = ast.get_source_segment(source, node) if node is not None else source
    theirs = inspect.getsource(case.fixed)
    name = case.__name__.rpartition(".")[2]
    return "".join(
        difflib.unified_diff(
            theirs.splitlines(True), (mine + "\n").splitlines(True), f"cases/{name}.py: fixed", f"{submitted.path}: {submitted.function}"
        )
    )


def hint(case_cfg: DictConfig, step: int) -> str:
    hints = list(case_cfg.get("hints") or [])
    return f"hint {step} of {len(hints)} for {case_cfg.name}: {' '.join(str(hints[step - 1]).split())}"


def hint_problem(case_cfg: DictConfig, step: Any) -> str | None:
    hints = case_cfg.get("hints") or []
    if not hints:
        return f"case {case_cfg.name} has no hints (conf/case/{case_cfg.name}.yaml: hints)"
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(hints):
        return f"hint={step}: choose a step from 1 to {len(hints)}"
    return None


def write_exercise(name: str, directory: str) -> Path:
    """A starter file in `directory`: the buggy function as `fix`, what it needs, the story without its fix."""
    folder = Path(directory).expanduser().resolve()
    path = folder / f"fix_{name}.py"
    if path.exists():
        raise FileExistsError(f"exercise={directory}: {path} exists (your work?); delete it or choose another directory")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(starter_source(load_case(name), path))
    return path


def starter_source(case: ModuleType, path: Path) -> str:
    name = case.__name__.rpartition(".")[2]
    copied = reachable(case, [case.buggy]) - reachable(case, [case.fixed])
    grade_command = f"python -m harness case={name} fix={path}:{EXERCISE_FUNCTION}"
    story = _without_fix_section(case.__doc__ or "")
    header = (
        f'r"""{story}\n\nYour task: `{EXERCISE_FUNCTION}` below is the buggy code{" (with the helpers it calls that the bug is in)" if len(copied) > 1 else ""}.\n'
        f"Change it so that it returns what the case's reference returns, without the failure above.\n\n"
        f"Grade it:\n    {grade_command}\nHints, one step at a time:\n    python -m harness case={name} hint=1\n"
        '"""\n\n'
    )
    main = f'\n\nif __name__ == "__main__":\n    print("grade this file with: {grade_command}")\n'
    return header + _functions_as_a_module(case, copied, case.buggy) + main


def solution_source(case: ModuleType) -> str:
    """The case's own fix written out as a submission: `fixed` as `fix`, with the helpers only the solution uses
    (the tripwires guard the case module's copies of those), the rest imported from the case as a starter does."""
    name = case.__name__.rpartition(".")[2]
    copied = reachable(case, [case.fixed]) - reachable(case, [case.buggy])
    return f'"""The case\'s own fix for {name}, written out as a submission."""\n\n' + _functions_as_a_module(case, copied, case.fixed)


def _functions_as_a_module(case: ModuleType, copied: set, entry: Any) -> str:
    """Imports, names taken from the case, and the source of `copied` in file order, `entry` renamed `fix`."""
    name = case.__name__.rpartition(".")[2]
    ordered = sorted(copied, key=lambda f: f.__code__.co_firstlineno)
    copied_names = {function.__name__ for function in ordered}
    needed = [n for function in ordered for n in global_names(function.__code__) if n not in copied_names and n in vars(case)]
    imports, from_case = [], []
    for needed_name in dict.fromkeys(needed):
        value = vars(case)[needed_name]
        if isinstance(value, ModuleType):
            imports.append(f"import {value.__name__}" + ("" if value.__name__ == needed_name else f" as {needed_name}"))
        else:
            from_case.append(needed_name)
    functions = []
    for function in ordered:
        source = textwrap.dedent(inspect.getsource(function))
        functions.append(
            re.sub(rf"^def {entry.__name__}\(", f"def {EXERCISE_FUNCTION}(", source, count=1, flags=re.M) if function is entry else source
        )
    body = "\n".join(sorted(imports)) + "\n\n" + (f"from cases.{name} import {', '.join(sorted(from_case))}\n" if from_case else "")
    return body + "\n\n" + "\n\n".join(functions)


def _without_fix_section(doc: str) -> str:
    kept, skipping = [], False
    for line in doc.strip().splitlines():
        starts = re.match(r"^([A-Z][A-Za-z ]*?):(?:\s+|$)", line)
        if starts and starts.group(1) in REQUIRED_SECTIONS:
            skipping = starts.group(1) == "Fix"
        if not skipping:
            kept.append(line)
    return "\n".join(kept).rstrip().replace('"""', "'''")
