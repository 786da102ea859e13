"""A fix submitted for grading, loaded in the child that runs it: by path and name, never pickled.

The parent passes only plain data (`Submission`: path, function name, sha256 of the file) inside the
case config the phases get, under `SUBMITTED_KEY`. Each child imports the file itself, after checking
that it still has the hash the record names, and before that it swaps the model solution's functions
in the case module for tripwires: called from inside the submitted fix, they raise
`ModelSolutionCalled`; called by the harness (the speed phase's baseline is the case's own `fixed`),
they do what they did. This stops a fix that imports `fixed`, `reference` or their helpers from the
case module; it cannot stop code that re-executes the case's source file itself.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any, Callable

from harness.cases import reachable

SUBMITTED_KEY = "submitted_fix"  # in the case config given to the phases: {path, function, sha256}
SOLUTION_ENTRY_POINTS = ("fixed", "reference", "speed_candidate")


class ModelSolutionCalled(BaseException):
    """The submitted fix called the case's own solution. A BaseException: `except Exception` in the fix does not hide it."""


@dataclass(frozen=True)
class Submission:
    path: str  # absolute
    function: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.function}"


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def submission_of(cfg: Any) -> Submission | None:
    """The submission a case config carries, or None when the case's own `fixed` is under test."""
    entry = cfg.get(SUBMITTED_KEY) if cfg is not None else None
    return None if entry is None else Submission(str(entry["path"]), str(entry["function"]), str(entry["sha256"]))


def import_file(path: str) -> ModuleType:
    """Import a Python file by path, under a module name of its own; module-level errors propagate."""
    name = "submitted_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_submitted(submission: Submission, case: ModuleType) -> Callable[[Any], Any]:
    """In a child: the submitted function, guarded so that it cannot call the case's solution."""
    if file_sha256(submission.path) != submission.sha256:
        raise RuntimeError(f"{submission.path} changed after it was validated (sha256 differs): grade it again")
    inside = _install_tripwires(case)
    function = getattr(import_file(submission.path), submission.function)
    if not callable(function):
        raise TypeError(f"{submission.spec} is a {type(function).__name__}, not a function")

    def submitted_fix(inputs):
        inside["now"] = True
        try:
            return function(inputs)
        finally:
            inside["now"] = False

    return submitted_fix


def _install_tripwires(case: ModuleType) -> dict[str, bool]:
    inside = {"now": False}
    solution = solution_functions(case)
    for name, value in list(vars(case).items()):
        if isinstance(value, FunctionType) and value in solution:
            setattr(case, name, _tripwire(case.__name__, name, value, inside))
    return inside


def _tripwire(module: str, name: str, original: Callable, inside: dict[str, bool]) -> Callable:
    def tripwire(*args, **kwargs):
        if inside["now"]:
            raise ModelSolutionCalled(f"the submitted fix called {module}.{name}, part of the case's own solution: write the fix yourself")
        return original(*args, **kwargs)

    return tripwire


def solution_functions(case: ModuleType) -> set[FunctionType]:
    """The case's functions reachable from `fixed`, `reference` and `speed_candidate` but not from `buggy`."""
    roots = [getattr(case, name) for name in SOLUTION_ENTRY_POINTS if isinstance(getattr(case, name, None), FunctionType)]
    return reachable(case, roots) - reachable(case, [case.buggy])
