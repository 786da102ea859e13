"""reproduce: run `buggy` and judge how it fails against the device's symptom on this torch (harness/cases.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import torch
from omegaconf import DictConfig

from harness import compiled as compile_axis
from harness.phases.buggy_run import BuggyRun, reproduce_in_child
from harness.phases.common import BUGGY, RunSpec, abnormal, difference, record_of, tolerance_text
from harness.phases.memory import reproduce_growth
from harness.phases.speed import time_against
from harness.process.isolate import run_isolated
from harness.process.outcome import ChildResult
from harness.records import PhaseRecord
from harness.statuses import Reproduce, Speed
from harness.symptoms import Growth, Slow, Symptom, Warns, WrongResult, symptom_on


@dataclass(frozen=True)
class Kind:
    """How reproduce judges one kind of failure (harness/cases.py): `judge(symptom, case, cfg, spec, result)`;
    `returns`: the buggy child is expected to return (its output and warnings are kept); `in_child`: buggy runs in a
    child of this phase first (a `Growth` is measured by the memory protocol instead)."""

    judge: Callable[..., PhaseRecord]
    returns: bool = False
    in_child: bool = True


def reproduce(case: ModuleType, spec: RunSpec) -> PhaseRecord:
    cfg = spec.case_cfg
    symptom = symptom_on(case.symptoms[spec.device], torch.__version__)
    kind = next(KINDS[cls] for cls in type(symptom).__mro__ if cls in KINDS)
    result = run_isolated(reproduce_in_child, cfg, spec.device, kind.returns, timeout_s=spec.timeout_s) if kind.in_child else None
    return kind.judge(symptom, case, cfg, spec, result)


def reproduce_raised(symptom: Symptom, case: ModuleType, cfg: DictConfig, spec: RunSpec, result: ChildResult) -> PhaseRecord:
    """A failure that raises (`Symptom`): the error, where, and what it printed, against the device's symptom."""
    if spec.compile != "off":
        return reproduce_compiled(case, cfg, spec, result)
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, context_after = seen.failure, seen.context_after
    expected = symptom.holds(torch.__version__, spec.compile)
    said = seen.said()
    if failure is None:
        if not expected:
            return record_of(
                "reproduce",
                symptom.clean_status_under(torch.__version__, spec.compile),
                True,
                f"buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
                result,
                said,
            )
        return record_of(
            "reproduce", Reproduce.NOT_REPRODUCED, False, f"buggy ran without error on torch {torch.__version__}", result, said
        )
    figures: dict[str, Any] = {"error": failure.headline, "raised_at": failure.where, **failure.figures, **said}
    figures.setdefault("traceback", failure.traceback)  # the frames tell cases with one error text apart (harness.triage)
    if symptom.output:
        figures["output_line"] = _first_matching_line(symptom.output, result.output)
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    problems = symptom.mismatches(failure, result.output)
    if problems:
        return record_of("reproduce", Reproduce.WRONG_FAILURE, False, f"{failure.headline} ({'; '.join(problems)})", result, figures)
    if not expected:
        return record_of(
            "reproduce",
            Reproduce.REPRODUCED,
            False,
            f"{failure.headline} (but it was recorded as failing {symptom.range_text()})",
            result,
            figures,
        )
    return record_of("reproduce", Reproduce.REPRODUCED, True, failure.headline, result, figures)


def reproduce_silent(symptom: WrongResult | Warns, case: ModuleType, cfg: DictConfig, spec: RunSpec, result: ChildResult) -> PhaseRecord:
    """A failure that raises nothing, eager or compiled alike: `buggy`'s output against the reference (`WrongResult`:
    wrong_result when it differs beyond the tolerance), or the warning it issued (`Warns`: warned).
    Every warning the call issued is kept verbatim; an error is `wrong_failure`."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, compared, warned = seen.failure, seen.compared, seen.warned
    expected = symptom.holds(torch.__version__, spec.compile)
    figures: dict[str, Any] = {"warnings": warned, **seen.said(), **(compared or {})}
    if failure is not None:
        figures.update(error=failure.headline, raised_at=failure.where, traceback=failure.traceback)
        return record_of(
            "reproduce",
            Reproduce.WRONG_FAILURE,
            False,
            f"{failure.headline} (expected it to return {'a wrong result' if isinstance(symptom, WrongResult) else 'with a warning'})",
            result,
            figures,
        )
    warning = next((line for line in warned if re.search(symptom.warning, line)), None) if symptom.warning else None
    figures["warning"] = warning
    if isinstance(symptom, Warns):
        return _judge_warned(symptom, spec, result, figures, warning, expected)
    return _judge_wrong_result(symptom, spec, result, figures, warning, expected, compared)


def _judge_warned(symptom: Warns, spec: RunSpec, result: ChildResult, figures: dict, warning: str | None, expected: bool) -> PhaseRecord:
    if warning is not None:
        return record_of("reproduce", Reproduce.WARNED, expected, warning, result, figures)
    return record_of(
        "reproduce",
        symptom.clean_status_under(torch.__version__, spec.compile) if not expected else Reproduce.NOT_REPRODUCED,
        not expected,
        f"buggy ran without the warning /{symptom.warning}/ on torch {torch.__version__}",
        result,
        figures,
    )


def _judge_wrong_result(
    symptom: WrongResult, spec: RunSpec, result: ChildResult, figures: dict, warning: str | None, expected: bool, compared: dict
) -> PhaseRecord:
    wrong = not compared["match"]
    if wrong and (symptom.warning is None or warning is not None):
        said = f"returned a wrong result: {difference(compared)}" + (f"; warned {warning}" if warning else "")
        return record_of("reproduce", Reproduce.WRONG_RESULT, expected, said, result, figures)
    if wrong:
        return record_of(
            "reproduce",
            Reproduce.WRONG_FAILURE,
            False,
            f"returned a wrong result, without the warning /{symptom.warning}/: {difference(compared)}",
            result,
            figures,
        )
    if not expected:
        return record_of(
            "reproduce",
            symptom.clean_status_under(torch.__version__, spec.compile),
            True,
            f"buggy returned the reference's output, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
            result,
            figures,
        )
    return record_of(
        "reproduce",
        Reproduce.NOT_REPRODUCED,
        False,
        f"buggy returned the reference's output {tolerance_text(spec.case_cfg)} on torch {torch.__version__}",
        result,
        figures,
    )


def reproduce_compiled(case: ModuleType, cfg: DictConfig, spec: RunSpec, result: ChildResult) -> PhaseRecord:
    """The buggy code compiled: how it failed, which may not be how it fails eager.

    raised          it raised: `same_as_eager` says whether it is the device's eager symptom
    aborted         a native error killed the process (inductor's kernels throw C++ exceptions): the signal
                    and the native lines of its output, verbatim
    silent          it returned where eager fails: how far the output is from the reference
    compile_failed  the compiler itself raised something other than the symptom
    fixed_upstream  it ran clean on a torch the case records as having made the code valid
    not_reproduced  it returned the reference's output on a torch where the bug is expected
    """
    mode = spec.compile
    symptom = symptom_on(case.symptoms[spec.device], torch.__version__)
    expected = symptom.holds(torch.__version__, spec.compile)
    if result.status == "signalled":
        native = compile_axis.native_message(result.output)
        figures = {"signal": result.signal, "native_message": native, "same_as_eager": False}
        said = compile_axis.native_headline(native)
        return record_of("reproduce", Reproduce.ABORTED, expected, f"{result.signal} under {mode}: {said}", result, figures)
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, context_after, silent = seen.failure, seen.context_after, seen.compared
    if failure is None:
        if not expected:
            return record_of(
                "reproduce",
                symptom.clean_status_under(torch.__version__, spec.compile),
                True,
                f"compiled buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
                result,
            )
        if silent["match"]:
            return record_of(
                "reproduce",
                Reproduce.NOT_REPRODUCED,
                False,
                f"compiled buggy returned the reference's output on torch {torch.__version__}",
                result,
                silent,
            )
        message = f"returned an output under {mode} where eager raises {symptom.exception}: {difference(silent)}"
        return record_of("reproduce", Reproduce.SILENT, True, message, result, {**silent, "same_as_eager": False})
    problems = symptom.mismatches(failure, result.output)
    figures: dict[str, Any] = {
        "error": failure.headline,
        "raised_at": failure.where,
        "same_as_eager": not problems,
        "traceback": failure.traceback,
        **failure.figures,
    }
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    if problems and compile_axis.is_compiler_error(failure.types, failure.modules):
        return record_of("reproduce", Reproduce.COMPILE_FAILED, False, f"the compiler raised {failure.headline}", result, figures)
    eager = "" if not problems else f" (eager: {symptom.exception}; {'; '.join(problems)})"
    return record_of("reproduce", Reproduce.RAISED, expected, failure.headline + eager, result, figures)


def reproduce_slow(symptom: Slow, case: ModuleType, cfg: DictConfig, spec: RunSpec, result: ChildResult) -> PhaseRecord:
    """A failure that is time (`Slow`): `buggy` must return the reference's output (else wrong_failure); then it is
    timed against the symptom's baseline by the speed phase's protocol (harness/phases/speed.py) on the speed inputs:
    `slow` when the ratio's interval lies above `at_least`, with the lines torch logged and the graphs it compiled."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    expected = symptom.holds(torch.__version__, spec.compile)
    figures: dict[str, Any] = {**seen.said(), **(seen.compared or {}), "at_least": symptom.at_least, "baseline_function": symptom.baseline}
    wrong = _not_right(seen, result, figures)
    if wrong is not None:
        return wrong
    said = [line for line in seen.logged + seen.warned if symptom.log and re.search(symptom.log, line)]
    figures["log_line"] = said[0] if said else None
    timed = time_against("reproduce", BUGGY, symptom.at_least, cfg, spec, baseline=symptom.baseline)
    figures.update(timed.figures)
    seconds = round(result.seconds + timed.seconds, 4)
    explained = (
        f"; {seen.graphs_compiled} graphs compiled in {symptom.calls} call{'s' if symptom.calls > 1 else ''}"
        if seen.graphs_compiled
        else ""
    ) + (f"; logged: {said[0].splitlines()[0]}" if said else "")
    if timed.status == Speed.OVER_BUDGET:
        if symptom.log and not said:
            return PhaseRecord(
                "reproduce",
                Reproduce.WRONG_FAILURE,
                False,
                f"slow, but torch logged nothing like /{symptom.log}/: {timed.message}",
                figures,
                seconds,
                result.output,
            )
        message = f"correct and slow: buggy against `{symptom.baseline}` {timed.message.replace('over budget', 'over')}{explained}"
        return PhaseRecord("reproduce", Reproduce.SLOW, expected, message, figures, seconds, result.output)
    if timed.status == Speed.WITHIN_BUDGET:
        return _not_slow(symptom, spec, timed, expected, figures, seconds, result.output)
    if timed.status == Speed.INCONCLUSIVE:
        return PhaseRecord(
            "reproduce",
            Reproduce.INCONCLUSIVE,
            False,
            f"the interval still straddles {symptom.at_least}x: {timed.message}",
            figures,
            seconds,
            result.output,
        )
    return timed  # the timing itself broke (raised, crashed, timeout): its own record


def _not_right(seen: BuggyRun, result: ChildResult, figures: dict[str, Any]) -> PhaseRecord | None:
    """A `Slow` case's buggy call must return the reference's output before it is timed: wrong_failure where it did not."""
    if seen.failure is not None:
        figures.update(error=seen.failure.headline, raised_at=seen.failure.where, traceback=seen.failure.traceback)
        return record_of(
            "reproduce",
            Reproduce.WRONG_FAILURE,
            False,
            f"{seen.failure.headline} (expected it to return the right result, slowly)",
            result,
            figures,
        )
    if not seen.compared["match"]:
        return record_of(
            "reproduce",
            Reproduce.WRONG_FAILURE,
            False,
            f"returned a wrong result (expected it right and slow): {difference(seen.compared)}",
            result,
            figures,
        )
    return None


def _not_slow(
    symptom: Slow, spec: RunSpec, timed: PhaseRecord, expected: bool, figures: dict[str, Any], seconds: float, output: str
) -> PhaseRecord:
    if expected:
        return PhaseRecord(
            "reproduce",
            Reproduce.NOT_REPRODUCED,
            False,
            f"buggy is not slower than {symptom.at_least}x `{symptom.baseline}` on torch {torch.__version__}: {timed.message}",
            figures,
            seconds,
            output,
        )
    status = symptom.clean_status_under(torch.__version__, spec.compile)
    return PhaseRecord(
        "reproduce",
        status,
        True,
        f"buggy is not slow, as expected on torch {torch.__version__} (it is slow {symptom.range_text()}{_modes_text(symptom)}): {timed.message}",
        figures,
        seconds,
        output,
    )


def _first_matching_line(pattern: str, output: str) -> str | None:
    for line in output.splitlines():
        if re.search(pattern, line):
            return line.strip()[:500]
    return None


def _modes_text(symptom: Any) -> str:
    return "" if getattr(symptom, "modes", None) is None else f", under compile={'/'.join(symptom.modes)}"


def _reproduce_growth(symptom: Growth, case: ModuleType, cfg: DictConfig, spec: RunSpec, result: None) -> PhaseRecord:
    return reproduce_growth(case, cfg, spec)


# One entry a kind of failure (harness/symptoms.py): a new kind adds its class there, its judge here.
KINDS: dict[type, Kind] = {
    Symptom: Kind(reproduce_raised),
    WrongResult: Kind(reproduce_silent, returns=True),
    Warns: Kind(reproduce_silent, returns=True),
    Slow: Kind(reproduce_slow, returns=True),
    Growth: Kind(_reproduce_growth, in_child=False),
}
