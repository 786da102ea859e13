"""The verdict of a grade, read from its records; and the names a graded phase gives the case's own symptom."""

from __future__ import annotations

import dataclasses
import re
from types import ModuleType

import torch

from harness.grading.common import GRADED_PHASES, IMPLAUSIBLY_FAST, Verdict
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py
from harness.records import CaseRecord, PhaseRecord
from harness.statuses import Correct, Run, Speed
from harness.symptoms import Slow, symptom_on


def _name_the_symptom(record: PhaseRecord, case: ModuleType, device: str) -> PhaseRecord:
    """A fix that still raises the case's own error says so: the bug is still there."""
    symptom = symptom_on(case.symptoms[device], torch.__version__)
    raised = record.message.partition(":")[0]
    if not hasattr(symptom, "exception"):  # `Growth`, `WrongResult`, `Warns`, `Slow`: nothing raised
        return record
    if record.status == Correct.RAISED and (raised == symptom.exception or re.search(symptom.message, record.message)):
        return dataclasses.replace(record, message=f"{record.message} (the case's own symptom: the bug is still there)")
    return record


def _name_the_slow_symptom(record: PhaseRecord, case: ModuleType, device: str) -> PhaseRecord:
    """A fix of a case whose failure is time (`Slow`), timed over budget: the case's own symptom, still there."""
    symptom = symptom_on(case.symptoms[device], torch.__version__)
    if isinstance(symptom, Slow) and record.status == Speed.OVER_BUDGET:
        return dataclasses.replace(record, message=f"{record.message} (the case's own symptom, slow: the bug is still there)")
    return record


def _flag_implausibly_fast(record: PhaseRecord) -> PhaseRecord:
    ratio = record.figures.get("ratio_high", record.figures.get("ratio"))
    if not record.ok or ratio is None or ratio >= IMPLAUSIBLY_FAST:
        return record
    message = (
        f"{ratio:.3f}x the model solution's time, under {IMPLAUSIBLY_FAST}x: implausibly fast "
        "(a fix that skips the work, returning a remembered or hard-coded result, looks like this)"
    )
    return dataclasses.replace(
        record,
        status=Speed.IMPLAUSIBLY_FAST,
        ok=False,
        message=message,
        figures={**record.figures, "implausibly_fast_below": IMPLAUSIBLY_FAST},
    )


def verdict(record: CaseRecord) -> Verdict:
    """Accepted when every graded check that ran passed, with what was checked; else the first failing one
    (the integrity check first: it names what a submission did to the grader), with its evidence."""
    graded = [phase for phase in record.phases if phase.phase in GRADED_PHASES or phase.phase.startswith("speed:") or _memory_judged(phase)]
    failed = sorted((phase for phase in graded if not phase.ok), key=lambda phase: phase.phase != "integrity")
    if failed:
        also = "".join(
            f"; also {phase.phase}: {phase.status}" for phase in [each for each in failed[1:] if each.status != Run.NOT_TIMED][:3]
        )
        refused = (
            " (writes outside its scratch directory, and signals to processes not its own, are refused while grading)"
            if re.search(r"Permission ?denied|PermissionError", failed[0].message) and "grading: " not in failed[0].message
            else ""
        )
        return Verdict(False, f"rejected by {failed[0].phase}: {failed[0].status}: {' '.join(failed[0].message.split())}{refused}{also}")
    if not graded:
        return Verdict(False, "rejected: no graded check ran (phases= must include fix, correct or speed)")
    skipped = [name for name in GRADED_PHASES if name not in {phase.phase for phase in graded}]
    return Verdict(
        True,
        "accepted: "
        + ", ".join(phase.phase for phase in graded)
        + " passed"
        + (f" ({', '.join(skipped)} not run)" if skipped else "")
        + _what_was_checked(graded),
    )


def _memory_judged(phase: PhaseRecord) -> bool:
    """The memory phase is a graded check where the case sets a memory budget (else its figures are for show)."""
    return phase.phase == "memory" and (bool(phase.figures.get("budget")) or not phase.ok)


def _what_was_checked(graded: list[PhaseRecord]) -> str:
    by_name = {phase.phase: phase.figures for phase in graded}
    said = []
    if "speed" in by_name and "timed_outputs_checked" in by_name["speed"]:
        speed = by_name["speed"]
        said.append(f"{speed['timed_outputs_checked']} of {speed['timed_outputs_of']} timed outputs checked, the parent's clock decided")
    if "integrity" in by_name:
        integrity_figures = by_name["integrity"]
        said.append(f"writes: {(integrity_figures.get('confinement') or 'not confined').partition(';')[0].removeprefix('writes: ')}")
        said.append(f"{integrity_figures['sources']} sources unchanged (sha256 {integrity_figures['sources_sha256'][:12]})")
    return f" ({'; '.join(said)})" if said else ""
