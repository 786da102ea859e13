"""The one seam between a run and grading: harness/run.py imports this module and nothing else of grading/.

A run takes its grading from `grading_of(spec.submission)` and calls it at the same points whatever is graded, as
Inspect AI's solver loop calls a Scorer it knows only by its protocol:

    plan(case_cfg, phases, device)          the case config the phases get, and the phases that run
    session(spec)                           around the phases: what the run needs set up, given back as the spec
    run_phase(phase, case, spec, earlier)   each phase's records (`earlier`: the run's records so far)
    at_close, check_at_close(name, ...)     the checks a run ends with, in the parent, even when it was cut
    verdict(record)                         the run's one-line verdict, or None

A plain run (no fix=) is `Ungraded`: the case's phases and nothing around them. A grade is `Graded`: the graded
checks (harness/grading/grade.py), its compiled kernels kept in a folder of its own, and integrity at the close.
`submitted` turns a fix= argument into the checked `Submission` a spec carries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator, Protocol

from harness.grading.common import BadSubmission
from harness.grading.grade import phases_of_a_grade
from harness.grading.grade import run_phase as run_graded_phase
from harness.grading.integrity import integrity, project_sources
from harness.grading.submission import graded_config, submission
from harness.grading.verdict import verdict
from harness.phases import run_phase
from harness.process.submitted import Submission, file_sha256
from harness.records import CaseRecord, PhaseRecord
from harness.spec import RunSpec

__all__ = ["BadSubmission", "Graded", "Grading", "Ungraded", "grading_of", "submitted"]


class Grading(Protocol):
    submission: Submission | None
    at_close: tuple[str, ...]

    def plan(self, case_cfg: Any, phases: tuple[str, ...], device: str) -> tuple[Any, tuple[str, ...]]: ...

    def session(self, spec: RunSpec) -> contextlib.AbstractContextManager[RunSpec]: ...

    def run_phase(self, phase: str, case: ModuleType, spec: RunSpec, earlier: list[PhaseRecord]) -> Iterable[PhaseRecord]: ...

    def check_at_close(self, name: str, record: CaseRecord, folder: Path) -> PhaseRecord: ...

    def verdict(self, record: CaseRecord) -> str | None: ...


@dataclasses.dataclass
class Ungraded:
    """A run of the case's own fix: its phases as configured, nothing checked around them, no verdict."""

    submission: None = None
    at_close: tuple[str, ...] = ()

    def plan(self, case_cfg: Any, phases: tuple[str, ...], device: str) -> tuple[Any, tuple[str, ...]]:
        return case_cfg, phases

    @contextlib.contextmanager
    def session(self, spec: RunSpec) -> Iterator[RunSpec]:
        yield spec

    def run_phase(self, phase: str, case: ModuleType, spec: RunSpec, earlier: list[PhaseRecord]) -> Iterable[PhaseRecord]:
        return run_phase(phase, case, spec)

    def check_at_close(self, name: str, record: CaseRecord, folder: Path) -> PhaseRecord:
        raise LookupError(f"a run that grades nothing has no closing check {name!r}")

    def verdict(self, record: CaseRecord) -> str | None:
        return None


@dataclasses.dataclass
class Graded:
    """A grade of a submitted fix: the graded checks in place of the case's, the project's sources snapshot before
    the first phase and checked (restored where changed) at the close, and the verdict read from the records."""

    submission: Submission
    at_close: tuple[str, ...] = ("integrity",)
    _sources: dict = dataclasses.field(default_factory=dict, repr=False)

    def plan(self, case_cfg: Any, phases: tuple[str, ...], device: str) -> tuple[Any, tuple[str, ...]]:
        graded = graded_config(case_cfg, self.submission)
        return graded, tuple(phases_of_a_grade(list(phases), graded, device))

    @contextlib.contextmanager
    def session(self, spec: RunSpec) -> Iterator[RunSpec]:
        # The submission's kernels, shared by its children alone: it may compile where compile=off too (a case that
        # compiles itself, a fix that calls torch.compile), and each child compiling cold cost recompile_limit 30 s.
        kernels = tempfile.mkdtemp(prefix="harness-grade-kernels-")
        self._sources = project_sources()
        try:
            yield dataclasses.replace(spec, limits=dataclasses.replace(spec.limits, kernels=kernels))
        finally:
            shutil.rmtree(kernels, ignore_errors=True)

    def run_phase(self, phase: str, case: ModuleType, spec: RunSpec, earlier: list[PhaseRecord]) -> Iterable[PhaseRecord]:
        return run_graded_phase(phase, case, spec, earlier)

    def check_at_close(self, name: str, record: CaseRecord, folder: Path) -> PhaseRecord:
        if name != "integrity":
            raise LookupError(f"a grade has no closing check {name!r}")
        return integrity(self._sources, record, folder / "displaced")

    def verdict(self, record: CaseRecord) -> str | None:
        return verdict(record).line


def grading_of(submission: Submission | None) -> Grading:
    """The grading of a run whose spec carries `submission` (None: the case's own fix)."""
    return Ungraded() if submission is None else Graded(submission)


def submitted(fix: str | None, timeout_s: float) -> Submission | None:
    """The fix= argument checked (`BadSubmission` where it names no usable function); None without fix=. Its import
    runs in a child once per version of the file."""
    if fix is None:
        return None
    path = Path(str(fix).rpartition(":")[0]).expanduser()
    return _checked(str(fix), float(timeout_s), file_sha256(path) if path.is_file() else "")


@functools.cache
def _checked(spec: str, timeout_s: float, sha256: str) -> Submission:  # sha256: a changed file is checked again
    return submission(spec, timeout_s)
