"""Grade a fix written by someone else: `python -m harness case=<name> fix=<file.py>:<function>`.

The submitted function replaces the case's `fixed` in the fix, correct and speed phases (see
`harness.phases.fix_under_test`); reproduce runs as always, and the case's controls (slow, bad and
memory fixes: they show the harness can fail on the case, which its own run does, and say nothing of
a submission) are left out. Grading adds what a fix written by someone else needs and the case's own
does not:

    correct                the submitted fix runs in one child (the file imported there, never in the
    correct:second_inputs  parent); its output and its inputs afterwards come back as `torch.save` bytes.
                           A second, clean child, where the submitted code never ran, builds the inputs
                           again, computes the reference from them, loads the bytes (`weights_only`) and
                           judges, first failure first:
                               wrong_output    not tensors, or another count, shape, dtype or device
                               mismatch        values beyond the case's tolerance
                               aliases_input   an output shares storage with an input
                               changed_inputs  a tensor, parameter, buffer, plain attribute or key of the inputs changed
                           `correct:second_inputs` does it again on inputs from a seed drawn for this grade
                           alone (`secrets`; recorded afterwards), in fresh processes: a remembered or
                           hard-coded result fails there. It runs where `correct` passed.
    speed                  the submitted fix timed against the case's `fixed` (the model solution) on the
                           parent's clock (harness/measure/clock.py), judged against `speed.grade_budget` where a case
                           sets one, else `speed.budget`; then, first failure first:
                               timed_output_wrong         a timed output picked after its call differs from the
                                                          reference for its inputs (judged in a clean child)
                               clock_tampered             the graded process's own clock disagrees with the parent's
                               work_beside_the_clock      CPU past one core (past the model solution's) in a block, or while idle
                               faster_on_repeated_inputs  a cache answers the timed inputs after their first call
                               implausibly_fast           below IMPLAUSIBLY_FAST times the model solution
    memory                 where the case sets a memory budget (`memory.grade_budget`, else `memory.budget`; else not run):
                           the submitted fix's memory over the steps (harness/measure/footprint.py), in a confined child,
                           against the case's `fixed` in a child that never imports it, over a number of
                           steps the submission cannot know;
                           its resident memory read from outside its process. An interval that still
                           straddles the budget is `undecided`, a rejection. Without a budget it is not run.
                           Neither speed nor memory measures a fix that fix or correct already showed wrong:
                           their record is `not_timed`, and names that check.
    integrity              last, in this process: the project's sources byte-identical (a changed one is
                           restored: tampered; what it found is kept in the output folder's displaced/), no
                           write outside the sandbox attempted (wrote_outside_sandbox), no process of the
                           submission left running (left_processes, killed).

Every child that imports the submitted file confines itself first (harness/process/confine.py: Landlock, a
write guard, rlimits); the harness's own process never imports it.
A crash or a hang is the verdict `crashed` or `timeout`. The verdict comes from the records, never
from what the submitted code printed. What the graded process reports about its inputs could be
forged by code that subverts the harness inside that process; its output cannot pass that way, as
it is judged elsewhere against a reference computed elsewhere.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Iterator

from omegaconf import DictConfig, OmegaConf

from harness.grading.common import EXERCISE_FUNCTION, GRADED_PHASES, HINT_STEPS, PROJECT_SOURCES, BadSubmission, Verdict, private_seed
from harness.grading.exercise import hint, hint_problem, solution_diff, solution_source, starter_source, write_exercise
from harness.grading.integrity import integrity, project_sources
from harness.grading.judge import check_timed_outputs, correct, judge
from harness.grading.submission import _not_imported, graded_config, import_failure, submission
from harness.grading.verdict import _flag_implausibly_fast, _name_the_slow_symptom, _name_the_symptom, verdict
from harness.measure.compare import snapshot
from harness.phases import CASE_CONTROLS, RunSpec, memory_budget
from harness.phases import run_phase as run_case_phase
from harness.process.submitted import Submission, file_sha256
from harness.records import PhaseRecord
from harness.statuses import Memory, Run

__all__ = [  # the grade's entry points, for run.py, the bench and the tests: the checks live in the modules beside this one
    "EXERCISE_FUNCTION",
    "GRADED_PHASES",
    "HINT_STEPS",
    "PROJECT_SOURCES",
    "BadSubmission",
    "Submission",
    "Verdict",
    "file_sha256",
    "graded_config",
    "hint",
    "hint_problem",
    "integrity",
    "judge",
    "phases_of_a_grade",
    "project_sources",
    "run_phase",
    "snapshot",
    "solution_diff",
    "solution_source",
    "starter_source",
    "submission",
    "verdict",
    "write_exercise",
]


def phases_of_a_grade(phases: list[str], cfg: DictConfig, device: str) -> list[str]:
    """The configured phases that judge a submission, or show its failure: the case's controls left out, and
    the memory phase where the case sets no memory budget on this device (it would give figures only)."""
    return [name for name in phases if name not in CASE_CONTROLS and (name != "memory" or memory_budget(cfg, device) is not None)]


TIMED = ("speed", "memory")  # the measurements of a grade: each costs seconds to minutes of timing or stepping
SHOWN_WRONG_BY = ("fix", "correct", "correct:second_inputs")


def not_timed(phase: str, earlier: list[PhaseRecord]) -> PhaseRecord | None:
    """A fix already shown wrong is not measured: its speed or memory would decide nothing (the grade is a rejection
    already), and timing a wrong output costs a grade up to `speed.grade_max_s` (111 s of clip_before_unscale's
    starter). The record says which check showed it wrong."""
    wrong = next((record for record in earlier if record.phase in SHOWN_WRONG_BY and not record.ok), None)
    if phase not in TIMED or wrong is None:
        return None
    return PhaseRecord(
        phase,
        Run.NOT_TIMED,
        False,
        f"not measured: the fix is wrong ({wrong.phase}: {wrong.status}), and a grade measures only a right one",
    )


def run_phase(phase: str, case: ModuleType, spec: RunSpec, earlier: list[PhaseRecord]) -> Iterator[PhaseRecord]:
    """As `harness.phases.run_phase`, with the graded checks in place of `correct` and around fix and speed; `earlier`,
    the grade's records so far, spares the measurements of a fix they show wrong (`not_timed`)."""
    if (skipped := not_timed(phase, earlier)) is not None:
        yield skipped
        return
    cfg = spec.case_cfg
    failed = import_failure(spec.submission, spec.timeout_s) if phase in ("fix", "correct", "speed") else None
    if failed is not None:
        yield from _not_imported(phase, failed)
        return
    if phase == "correct":
        yield (first := correct(case, spec))
        if not first.ok:  # wrong on the published inputs: other inputs would decide nothing more
            return
        second = OmegaConf.merge(cfg, {"seed": private_seed(cfg.seed)})
        yield correct(case, dataclasses.replace(spec, case_cfg=second), "correct:second_inputs")
        return
    for record in run_case_phase(phase, case, spec):
        if phase == "fix":
            yield _name_the_symptom(record, case, spec.device)
        elif record.phase == "speed" or record.phase.startswith("speed:"):
            yield _name_the_slow_symptom(_flag_implausibly_fast(check_timed_outputs(record, cfg, spec)), case, spec.device)
        elif record.phase == "memory" and record.status == Memory.INCONCLUSIVE:
            yield dataclasses.replace(record, status=Memory.UNDECIDED, ok=False, message=record.message + "; a grade must be decisive")
        else:
            yield record
