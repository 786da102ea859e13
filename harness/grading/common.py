"""What the grading modules share: its constants, the verdict's type, a grade's private seed."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py

IMPLAUSIBLY_FAST = 0.25  # submitted / model solution: below this the fix is flagged, not praised


GRADED_PHASES = ("fix", "correct", "correct:second_inputs", "speed", "integrity")


PROJECT_SOURCES = ("harness/**/*.py", "cases/**/*.py", "conf/**/*.yaml", "pyproject.toml")  # byte-identical after grading, or restored


HINT_STEPS = 3


EXERCISE_FUNCTION = "fix"


class BadSubmission(ValueError):
    """The fix= argument names no usable function: bad usage, one line, nothing has run."""


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    line: str


def private_seed(published: int) -> int:
    """A seed drawn for this grade alone, never the case's published one: inputs no submission can know ahead."""
    while (seed := secrets.randbelow(1 << 31)) == published:
        pass
    return seed
