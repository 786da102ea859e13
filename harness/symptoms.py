"""The symptom types of the case contract (harness/cases.py): what a buggy case does, over which torch releases.

Cases import them from harness.cases, which names them as part of its contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.statuses import Reproduce

if TYPE_CHECKING:  # an annotation only: the case contract does not depend on the process layer
    from harness.process.outcome import Failure


def _between(appears_in: str | None, fixed_in: str | None, torch_version: str) -> bool:
    from torch.torch_version import TorchVersion  # here, not at the top: `python -m harness` imports this module before torch

    version = TorchVersion(torch_version)
    return (appears_in is None or version >= appears_in) and (fixed_in is None or version < fixed_in)


def _range_text(appears_in: str | None, fixed_in: str | None) -> str:
    if appears_in and fixed_in:
        return f"from torch {appears_in} until {fixed_in}"
    return f"from torch {appears_in} on" if appears_in else (f"before torch {fixed_in}" if fixed_in else "on every torch")


class _Ranged:
    """A symptom holds from torch `appears_in` (a release whose change made this code fail) until `fixed_in` (one
    that made it valid again), and under the compile modes in `modes` (None: every mode; ("off",): eager only, where
    compiling makes the code valid, e.g. dynamo rewriting a reentrant checkpoint); elsewhere the buggy code is
    expected to run clean. Each found by running it."""

    appears_in: str | None
    fixed_in: str | None
    modes: tuple[str, ...] | None

    def expected_on(self, torch_version: str) -> bool:
        """Whether the buggy code is expected to fail this way on this torch version."""
        return _between(self.appears_in, self.fixed_in, torch_version)

    def holds(self, torch_version: str, mode: str) -> bool:
        """Whether the failure is expected on this torch version under this compile mode."""
        return self.expected_on(torch_version) and (self.modes is None or mode in self.modes)

    def range_text(self) -> str:
        return _range_text(self.appears_in, self.fixed_in)

    def clean_status(self, torch_version: str) -> str:
        """The reproduce status of a clean run outside the range: `clean_before` the failure appears, `fixed_upstream` after."""
        from torch.torch_version import TorchVersion

        return Reproduce.CLEAN_BEFORE if self.appears_in and TorchVersion(torch_version) < self.appears_in else Reproduce.FIXED_UPSTREAM

    def clean_status_under(self, torch_version: str, mode: str) -> str:
        """As `clean_status`, or `clean_compiled` where the torch version holds the failure and the compile mode does not."""
        return (
            Reproduce.CLEAN_COMPILED
            if self.expected_on(torch_version) and not self.holds(torch_version, mode)
            else self.clean_status(torch_version)
        )


@dataclass(frozen=True)
class Symptom(_Ranged):
    """How a failure looks on one device.

    `exception` is a class name that must appear in the raised exception's MRO
    (so "RuntimeError" also accepts torch's newer AcceleratorError); `message` is
    a regex searched in the exception text; `output`, when set, is a regex
    searched in what the process printed (CUDA prints device-side assertions
    there, not in the exception). `fixed_in` and `appears_in` as `_Ranged` says.
    """

    exception: str
    message: str
    output: str | None = None
    fixed_in: str | None = None  # torch version from which this code no longer fails (found by running it)
    appears_in: str | None = None  # torch version from which it fails
    modes: tuple[str, ...] | None = None  # compile modes it shows under (None: all)

    def mismatches(self, failure: Failure, output: str) -> list[str]:
        """Why `failure` is not this symptom; empty when it is."""
        problems = []
        if self.exception not in failure.types:
            problems.append(f"expected {self.exception}, got {failure.types[0]}")
        if not re.search(self.message, failure.message):
            problems.append(f"message does not match /{self.message}/")
        if self.output and not re.search(self.output, output):
            problems.append(f"output does not match /{self.output}/")
        return problems


@dataclass(frozen=True)
class Growth(_Ranged):
    """A failure that is memory growing step after step until the device runs out (no error where it is measured).

    The reproduce phase runs `buggy` for `memory.steps` steps on one inputs object (harness/measure/footprint.py) and
    expects the lower bound of its retained memory's slope to be at least `at_least` x the baseline's peak
    per step. `oom` is the text a real run ends with on that device (e.g. "CUDA out of memory"), for the
    record and triage: the growth is measured, an OOM is never waited for. `fixed_in` as for `Symptom`.
    """

    at_least: float
    oom: str | None = None
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class WrongResult(_Ranged):
    """A failure that raises nothing: `buggy` returns, and its output (values, gradients, parameters after a step, a
    loaded state dict: harness/measure/compare.py's `training_outputs`) differs from `reference` beyond the case's tolerance.

    `warning`, when set, is a regex searched in the warnings the buggy call issued ("Category: message", as
    `warnings` formats them): the one sign a user sees (`Using a target size ... that is different to the input
    size`); the reproduce record keeps every warning verbatim either way.
    """

    warning: str | None = None
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Warns(_Ranged):
    """The buggy code runs and its result is right, but torch warns of what a later release will refuse (a
    FutureWarning before the default changes): `warning` is a regex searched in "Category: message"."""

    warning: str
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Slow(_Ranged):
    """A failure that is time: `buggy` returns the reference's output (within the case's tolerance) and takes more
    than `at_least` x the time of `baseline` (a case function, `fixed` by default) on the speed inputs, judged as the
    speed phase judges a fix: reproduced when the ratio's interval lies above `at_least`, never on a point ratio.
    `log`, when set, is a regex searched in what torch warned or logged during the buggy call ("torch._dynamo hit
    config.recompile_limit"); the record keeps those lines verbatim and the graphs dynamo compiled. `calls`: how many
    calls the reproduce child makes on one inputs object (the first one's output is compared with the reference),
    where what explains the time shows only after several (the limit is hit at the ninth new shape)."""

    at_least: float
    log: str | None = None
    baseline: str = "fixed"
    calls: int = 1
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


AnySymptom = Symptom | Growth | WrongResult | Warns | Slow


class Versions:
    """A failure that changes across torch releases: each symptom holds over its own range (`appears_in`,
    `fixed_in`), e.g. silence, then a FutureWarning from 2.4, then an error from 2.6. Outside every range
    the buggy code is expected to run clean; `on` picks the symptom for a torch version."""

    def __init__(self, *symptoms: AnySymptom) -> None:
        if not symptoms:
            raise ValueError("Versions needs at least one symptom")
        self.symptoms = symptoms

    def on(self, torch_version: str) -> AnySymptom | None:
        return next((symptom for symptom in self.symptoms if symptom.expected_on(torch_version)), None)

    def expected_on(self, torch_version: str) -> bool:
        return self.on(torch_version) is not None

    def range_text(self) -> str:
        return "; ".join(f"{type(symptom).__name__} {symptom.range_text()}" for symptom in self.symptoms)

    def __repr__(self) -> str:
        return f"Versions{self.symptoms!r}"


def symptom_on(symptom: AnySymptom | Versions, torch_version: str) -> AnySymptom:
    """The symptom to judge a run on this torch version by: a `Versions`' member for it, else (none applies,
    so a clean run is expected) the member nearest in time, whose `expected_on` then says False."""
    if not isinstance(symptom, Versions):
        return symptom
    chosen = symptom.on(torch_version)
    if chosen is not None:
        return chosen
    from torch.torch_version import TorchVersion

    before = [s for s in symptom.symptoms if s.appears_in and TorchVersion(torch_version) < s.appears_in]
    return min(before, key=lambda s: TorchVersion(s.appears_in)) if before else symptom.symptoms[-1]
