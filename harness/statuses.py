"""The statuses a phase record can hold, one `StrEnum` per family of phases (harness/phases/__init__.py lists them).

A member is its string: it compares, hashes, formats and serialises (JSON, f-strings) as the value the records have
always held, so a record read back from JSON (plain strings) compares equal to the names here. A `PhaseRecord`
keeps the plain string (harness/records.py), so no writer (JSON, yaml, OmegaConf, which would write a member's name)
sees an enum. `ok` says whether a
status is the one its phase expects, where the status alone decides that (reproduce's depends on the torch version).
"""

from __future__ import annotations

from enum import StrEnum


class Reproduce(StrEnum):
    """reproduce: the failure seen, a clean run where none is recorded, or how the run broke."""

    REPRODUCED = "reproduced"
    WRONG_RESULT = "wrong_result"
    WARNED = "warned"
    SLOW = "slow"
    RAISED = "raised"  # compiled: raised, as eager does or otherwise
    ABORTED = "aborted"  # compiled: the process died on a signal
    SILENT = "silent"  # compiled: returned where eager raises
    NOT_REPRODUCED = "not_reproduced"
    FIXED_UPSTREAM = "fixed_upstream"
    CLEAN_BEFORE = "clean_before"
    CLEAN_COMPILED = "clean_compiled"
    WRONG_FAILURE = "wrong_failure"
    COMPILE_FAILED = "compile_failed"
    INCONCLUSIVE = "inconclusive"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"


FAILURE_REPRODUCED = frozenset(
    {Reproduce.REPRODUCED, Reproduce.WRONG_RESULT, Reproduce.WARNED, Reproduce.SLOW, Reproduce.RAISED, Reproduce.ABORTED, Reproduce.SILENT}
)  # eager's statuses, then the compiled outcomes
CLEAN_RUN = frozenset({Reproduce.FIXED_UPSTREAM, Reproduce.CLEAN_BEFORE, Reproduce.CLEAN_COMPILED})  # no failure, where none is recorded


class Correct(StrEnum):
    """fix and correct (and a grade's correct:second_inputs): passed, or how the fix failed."""

    PASSED = "passed"
    RAISED = "raised"
    MISMATCH = "mismatch"
    WRONG_OUTPUT = "wrong_output"  # grading: the submission returned what cannot be compared
    ALIASES_INPUT = "aliases_input"  # grading: an output shares storage with an input
    CHANGED_INPUTS = "changed_inputs"  # grading: the fix changed its inputs
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self is Correct.PASSED


class Integrity(StrEnum):
    """integrity (grading): the project's sources, the sandbox and the process table after the submission ran."""

    PASSED = "passed"
    TAMPERED = "tampered"
    SIGNALLED_OUTSIDE_SANDBOX = "signalled_outside_sandbox"
    WROTE_OUTSIDE_SANDBOX = "wrote_outside_sandbox"
    LEFT_PROCESSES = "left_processes"

    @property
    def ok(self) -> bool:
        return self is Integrity.PASSED


class Speed(StrEnum):
    """speed and speed:NAME: the ratio's interval against the budget."""

    WITHIN_BUDGET = "within_budget"
    OVER_BUDGET = "over_budget"
    INCONCLUSIVE = "inconclusive"  # a case's own timing: no failure, shown apart
    UNDECIDED = "undecided"  # grading: inconclusive, a rejection
    MEASURED = "measured"  # no budget on this device
    TIMED_OUTPUT_WRONG = "timed_output_wrong"  # grading: what was timed differs from the reference
    IMPLAUSIBLY_FAST = "implausibly_fast"  # grading, and what the parent saw beside the samples (harness/measure/anomaly.py):
    CLOCK_TAMPERED = "clock_tampered"
    WORK_BESIDE_THE_CLOCK = "work_beside_the_clock"
    FASTER_ON_REPEATED_INPUTS = "faster_on_repeated_inputs"
    BASELINE_DISTURBED = "baseline_disturbed"
    BASELINE_SLOWED = "baseline_slowed"
    RAISED = "raised"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self in (Speed.WITHIN_BUDGET, Speed.INCONCLUSIVE, Speed.MEASURED)


class SlowControl(StrEnum):
    """slow_fix:NAME: a correct but slower fix the speed verdict must flag."""

    FLAGGED = "flagged"
    MISSED = "missed"
    NO_BUDGET = "no_budget"
    NOT_APPLICABLE = "not_applicable"  # not flagged where the case's failure does not occur
    RETRACED = "retraced"  # not flagged where the compiled baseline was traced again on every timed call: not judged
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self in (SlowControl.FLAGGED, SlowControl.NO_BUDGET, SlowControl.NOT_APPLICABLE, SlowControl.RETRACED)


class BadFix(StrEnum):
    """bad_fix:NAME: a wrong fix that must be rejected."""

    REJECTED = "rejected"
    ACCEPTED = "accepted"
    NOT_WRONG_HERE = "not_wrong_here"  # right on a run where the case's failure does not occur
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self in (BadFix.REJECTED, BadFix.NOT_WRONG_HERE)


class Memory(StrEnum):
    """memory: the fix's memory per step against the budget."""

    WITHIN_BUDGET = "within_budget"
    OVER_BUDGET = "over_budget"
    INCONCLUSIVE = "inconclusive"
    UNDECIDED = "undecided"  # grading: inconclusive, a rejection
    MEASURED = "measured"
    NOT_APPLICABLE = "not_applicable"
    RAISED = "raised"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self in (Memory.WITHIN_BUDGET, Memory.INCONCLUSIVE, Memory.MEASURED, Memory.NOT_APPLICABLE)


class MemoryControl(StrEnum):
    """memory_fix:NAME: a wrong fix that keeps memory, which the memory verdict must flag."""

    FLAGGED = "flagged"
    MISSED = "missed"
    NO_BUDGET = "no_budget"
    NOT_APPLICABLE = "not_applicable"
    RAISED = "raised"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    ERROR = "error"

    @property
    def ok(self) -> bool:
        return self in (MemoryControl.FLAGGED, MemoryControl.NO_BUDGET, MemoryControl.NOT_APPLICABLE)


class Run(StrEnum):
    """What the run itself did to a phase, whichever its family."""

    CUT = "cut"  # the job was cut (a signal) while this phase ran
    NOT_TIMED = "not_timed"  # grading: speed or memory not measured, the fix already shown wrong (harness/grading/grade.py)


# How a child that did not return (harness/process/outcome.py: ChildResult.status) reads in a phase record: the
# same in every family.
BROKE = {
    "raised": Correct.RAISED,
    "signalled": Correct.CRASHED,
    "exited": Correct.CRASHED,
    "timeout": Correct.TIMEOUT,
    "limit": Correct.CRASHED,
}
ERROR = Correct.ERROR  # the case itself broke (e.g. `make_inputs` raised): not a verdict on the bug
