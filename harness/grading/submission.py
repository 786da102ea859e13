"""The submitted file, checked before anything runs: it exists, compiles, imports in a confined child and has its function."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from harness.grading.common import BadSubmission
from harness.phases.common import record_of
from harness.process.confine import Limits
from harness.process.isolate import run_isolated
from harness.process.outcome import ChildResult
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py
from harness.records import PhaseRecord
from harness.statuses import BROKE


def submission(spec: str, timeout_s: float) -> Submission:
    """`<file.py>:<function>` checked: the file exists and compiles, and, imported in a child, has that function."""
    path_text, colon, function = str(spec).rpartition(":")
    if not colon or not path_text or not function.isidentifier():
        raise BadSubmission(f"fix={spec}: expected <file.py>:<function>, e.g. fix=my_fix.py:fix")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise BadSubmission(f"fix={spec}: no such file {path}")
    source = path.read_bytes()
    try:
        compile(source, str(path), "exec")
    except SyntaxError as error:
        raise BadSubmission(f"{path}:{error.lineno}: {type(error).__name__}: {error.msg}") from None
    submitted = Submission(str(path), function, file_sha256(path))
    problem = _import_problem(submitted, timeout_s)
    if problem:
        raise BadSubmission(problem)
    return submitted


def _import_problem(submitted: Submission, timeout_s: float) -> str | None:
    """A usage error in the file (its import raised an exception: a missing module, a name error; no such
    function), or None. An import that crashes, kills or stops its parent, hangs, exits or writes outside its
    sandbox is no usage error but the submission's own doing: the grade runs and rejects it (`run_phase`)."""
    result = import_check(submitted, timeout_s)
    if result.refused_writes or result.left_behind:
        return None
    if result.status == "raised":
        failure = result.failure
        if "Exception" not in failure.types:  # SystemExit, KeyboardInterrupt: it left, it did not fail to load
            return None
        lines = re.findall(rf'File "{re.escape(submitted.path)}", line (\d+)', failure.traceback)
        return f"{submitted.path}:{lines[-1] if lines else 1}: importing it raised {failure.headline}"
    if result.status != "returned":
        return None
    return result.value


_IMPORTED: dict[Submission, ChildResult] = {}


def import_check(submitted: Submission, timeout_s: float) -> ChildResult:
    """The file imported once in a confined child of its own, per version of the file: how that ended."""
    if submitted not in _IMPORTED:
        _IMPORTED[submitted] = run_isolated(_import_in_child, submitted.path, submitted.function, timeout_s=timeout_s, confined=Limits())
    return _IMPORTED[submitted]


def import_failure(submitted: Submission | None, timeout_s: float) -> ChildResult | None:
    """How importing the graded file went wrong (it crashed, hung, exited, killed or stopped its parent), or None."""
    if submitted is None:
        return None
    result = import_check(submitted, timeout_s)
    if result.status == "returned" and not result.refused_writes and not result.left_behind:
        return None
    if result.status == "raised" and "Exception" in result.failure.types:  # a usage error, refused before any phase; or changed since
        return None
    return result if result.status != "returned" else None


def _not_imported(phase: str, result: ChildResult) -> Iterator[PhaseRecord]:
    """The phases that would import the file, when its import check did not end: one verdict, every grade,
    whichever process the import happened to take down."""
    status = BROKE[result.status]
    said = result.output.rpartition("[harness] ")[2].strip() if "[harness] " in result.output else ""
    what = f"importing it {result.summary}" + (f" ({said})" if said and not result.lost_server else "")
    for name in {"fix": ["fix"], "correct": ["correct", "correct:second_inputs"], "speed": ["speed"]}[phase]:
        message = what if name == "fix" else f"not run: {what} (the fix check)"
        yield record_of(
            name, status, False, message, result, {"import_check": result.status, **({"signal": result.signal} if result.signal else {})}
        )


def _import_in_child(path: str, function: str) -> str | None:
    module = import_file(path)
    if not hasattr(module, function):
        defined = sorted(name for name, value in vars(module).items() if inspect.isfunction(value) and value.__module__ == module.__name__)
        return f"{path}: no function {function!r} (functions defined there: {', '.join(defined) or 'none'})"
    if not callable(getattr(module, function)):
        return f"{path}: {function!r} is a {type(getattr(module, function)).__name__}, not a function"
    return None


def graded_config(case_cfg: DictConfig, submitted: Submission) -> DictConfig:
    """The case config the phases get when grading: the submission, the grading speed budget, and only the
    `speed.also` comparisons that apply to a submitted fix (one that sets `graded: false` times something else
    than a whole fix, e.g. one training step where the fix is a launch)."""
    graded = OmegaConf.create({**OmegaConf.to_container(case_cfg, resolve=True), SUBMITTED_KEY: dataclasses.asdict(submitted)})
    grade_budget = OmegaConf.select(case_cfg, "speed.grade_budget")
    if grade_budget is not None:
        graded.speed.budget = grade_budget
    memory_grade_budget = OmegaConf.select(case_cfg, "memory.grade_budget")
    if memory_grade_budget is not None:
        graded.memory.budget = memory_grade_budget
    also = OmegaConf.select(graded, "speed.also")
    if also:
        graded.speed.also = {name: comparison for name, comparison in also.items() if comparison.get("graded", True)}
    return graded
