"""reproduce: run `buggy` and judge how it fails against the device's symptom on this torch (harness/cases.py)."""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig

from harness import compiled as compile_axis
from harness.cases import Growth, Slow, Warns, WrongResult, load_case, symptom_on
from harness.measure.compare import compare, tolerance_of
from harness.phases.common import BUGGY, Settings, abnormal, call, compiled_for, difference, record_of, tolerance_text
from harness.phases.memory import reproduce_growth
from harness.phases.speed import time_against
from harness.process.isolate import ChildResult, Failure, run_isolated
from harness.records import PhaseRecord


def reproduce(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    if isinstance(symptom, Growth):
        return reproduce_growth(case, cfg, settings)
    result = run_isolated(
        _reproduce_in_child, cfg, settings.device, isinstance(symptom, (WrongResult, Warns, Slow)), timeout_s=settings.timeout_s
    )
    if isinstance(symptom, Slow):
        return reproduce_slow(symptom, cfg, settings, result)
    if isinstance(symptom, (WrongResult, Warns)):
        return reproduce_silent(symptom, cfg, result)
    if compile_axis.mode_of(cfg) != "off":
        return reproduce_compiled(case, cfg, settings, result)
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, context_after = seen.failure, seen.context_after
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    said = seen.said()
    if failure is None:
        if not expected:
            return record_of(
                "reproduce",
                symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)),
                True,
                f"buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
                result,
                said,
            )
        return record_of("reproduce", "not_reproduced", False, f"buggy ran without error on torch {torch.__version__}", result, said)
    figures: dict[str, Any] = {"error": failure.headline, "raised_at": failure.where, **failure.figures, **said}
    figures.setdefault("traceback", failure.traceback)  # the frames tell cases with one error text apart (harness.triage)
    if symptom.output:
        figures["output_line"] = _first_matching_line(symptom.output, result.output)
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    problems = symptom.mismatches(failure, result.output)
    if problems:
        return record_of("reproduce", "wrong_failure", False, f"{failure.headline} ({'; '.join(problems)})", result, figures)
    if not expected:
        return record_of(
            "reproduce", "reproduced", False, f"{failure.headline} (but it was recorded as failing {symptom.range_text()})", result, figures
        )
    return record_of("reproduce", "reproduced", True, failure.headline, result, figures)


def reproduce_silent(symptom: WrongResult | Warns, cfg: DictConfig, result: ChildResult) -> PhaseRecord:
    """A failure that raises nothing, eager or compiled alike: `buggy`'s output against the reference (`WrongResult`:
    wrong_result when it differs beyond the tolerance), or the warning it issued (`Warns`: warned).
    Every warning the call issued is kept verbatim; an error is `wrong_failure`."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, compared, warned = seen.failure, seen.compared, seen.warned
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    figures: dict[str, Any] = {"warnings": warned, **seen.said(), **(compared or {})}
    if failure is not None:
        figures.update(error=failure.headline, raised_at=failure.where, traceback=failure.traceback)
        return record_of(
            "reproduce",
            "wrong_failure",
            False,
            f"{failure.headline} (expected it to return {'a wrong result' if isinstance(symptom, WrongResult) else 'with a warning'})",
            result,
            figures,
        )
    warning = next((line for line in warned if re.search(symptom.warning, line)), None) if symptom.warning else None
    figures["warning"] = warning
    if isinstance(symptom, Warns):
        if warning is not None:
            return record_of("reproduce", "warned", expected, warning, result, figures)
        return record_of(
            "reproduce",
            symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)) if not expected else "not_reproduced",
            not expected,
            f"buggy ran without the warning /{symptom.warning}/ on torch {torch.__version__}",
            result,
            figures,
        )
    wrong = not compared["match"]
    if wrong and (symptom.warning is None or warning is not None):
        said = f"returned a wrong result: {difference(compared)}" + (f"; warned {warning}" if warning else "")
        return record_of("reproduce", "wrong_result", expected, said, result, figures)
    if wrong:
        return record_of(
            "reproduce",
            "wrong_failure",
            False,
            f"returned a wrong result, without the warning /{symptom.warning}/: {difference(compared)}",
            result,
            figures,
        )
    if not expected:
        return record_of(
            "reproduce",
            symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)),
            True,
            f"buggy returned the reference's output, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
            result,
            figures,
        )
    return record_of(
        "reproduce",
        "not_reproduced",
        False,
        f"buggy returned the reference's output {tolerance_text(cfg)} on torch {torch.__version__}",
        result,
        figures,
    )


FAILURE_REPRODUCED = frozenset(
    {"reproduced", "wrong_result", "warned", "slow", "raised", "aborted", "silent"}
)  # eager's statuses, then the compiled outcomes
CLEAN_RUN = frozenset({"fixed_upstream", "clean_before", "clean_compiled"})  # no failure, where the case records none


def reproduce_compiled(case: ModuleType, cfg: DictConfig, settings: Settings, result: ChildResult) -> PhaseRecord:
    """The buggy code compiled: how it failed, which may not be how it fails eager.

    raised          it raised: `same_as_eager` says whether it is the device's eager symptom
    aborted         a native error killed the process (inductor's kernels throw C++ exceptions): the signal
                    and the native lines of its output, verbatim
    silent          it returned where eager fails: how far the output is from the reference
    compile_failed  the compiler itself raised something other than the symptom
    fixed_upstream  it ran clean on a torch the case records as having made the code valid
    not_reproduced  it returned the reference's output on a torch where the bug is expected
    """
    mode = compile_axis.mode_of(cfg)
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    if result.status == "signalled":
        native = compile_axis.native_message(result.output)
        figures = {"signal": result.signal, "native_message": native, "same_as_eager": False}
        said = compile_axis.native_headline(native)
        return record_of("reproduce", "aborted", expected, f"{result.signal} under {mode}: {said}", result, figures)
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    failure, context_after, silent = seen.failure, seen.context_after, seen.compared
    if failure is None:
        if not expected:
            return record_of(
                "reproduce",
                symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)),
                True,
                f"compiled buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})",
                result,
            )
        if silent["match"]:
            return record_of(
                "reproduce",
                "not_reproduced",
                False,
                f"compiled buggy returned the reference's output on torch {torch.__version__}",
                result,
                silent,
            )
        message = f"returned an output under {mode} where eager raises {symptom.exception}: {difference(silent)}"
        return record_of("reproduce", "silent", True, message, result, {**silent, "same_as_eager": False})
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
        return record_of("reproduce", "compile_failed", False, f"the compiler raised {failure.headline}", result, figures)
    eager = "" if not problems else f" (eager: {symptom.exception}; {'; '.join(problems)})"
    return record_of("reproduce", "raised", expected, failure.headline + eager, result, figures)


@dataclass
class BuggyRun:
    """What the reproduce child saw of one buggy call: how it failed, the unrelated op after a CUDA error, its output
    against the reference (compiled, or where the failure raises nothing), every warning it issued and every line
    torch logged at WARNING or above ("Category: message" / "logger: message", verbatim), and the graphs dynamo
    compiled during it (a recompile is one more)."""

    failure: Failure | None
    context_after: str | None = None
    compared: dict | None = None
    warned: list[str] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)
    graphs_compiled: int = 0

    def said(self) -> dict[str, Any]:
        said = {"warnings": self.warned, "logged": self.logged, "graphs_compiled": self.graphs_compiled}
        return {key: value for key, value in said.items() if value}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(f"{record.name}: {record.getMessage()}"[:2000])


def _torch_loggers() -> list[logging.Logger]:
    """torch's loggers that hand their records to no parent: "torch", and those torch._logging sets up with handlers
    of their own ("torch._dynamo", "torch._inductor", ...); a handler on each hears every torch log line once."""
    named = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("torch.")]
    return [logging.getLogger("torch")] + [logger for logger in named if isinstance(logger, logging.Logger) and not logger.propagate]


def _reproduce_in_child(cfg: DictConfig, device: str, silent: bool) -> dict[str, Any]:
    """`buggy` as a user's process runs it: a `BuggyRun`'s fields (plain data back to the parent)."""
    case = load_case(cfg.name)
    cfg = compile_axis.as_users_run_it(cfg)  # the failure as a user's process shows it
    inputs = case.make_inputs(cfg, device)
    logged = _Lines()
    listened = _torch_loggers()
    graphs_before = compile_axis.graphs_compiled()
    for logger in listened:
        logger.addHandler(logged)
    buggy = compiled_for(case.buggy, case, cfg)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            output, failure = call(buggy, inputs, device)
            for _ in range(getattr(symptom_on(case.symptoms[device], torch.__version__), "calls", 1) - 1):  # `Slow(calls=...)`
                if failure is not None:
                    break
                _, failure = call(buggy, inputs, device)
    finally:
        for logger in listened:
            logger.removeHandler(logged)
    warned = list(dict.fromkeys(f"{w.category.__name__}: {w.message}"[:1000] for w in caught))[:20]
    seen = BuggyRun(
        failure,
        warned=warned,
        logged=list(dict.fromkeys(logged.lines))[:20],
        graphs_compiled=compile_axis.graphs_compiled() - graphs_before,
    )
    if failure is None:
        if compile_axis.mode_of(cfg) == "off" and not silent:
            return vars(seen)
        want, _ = call(case.reference, case.make_inputs(cfg, device), device)  # fresh: buggy may have advanced its inputs' state
        seen.compared = compare(output, want, **tolerance_of(cfg.tolerance))
        return vars(seen)
    if device == "cuda":  # a device-side assert is sticky: an unrelated op in the same process fails too
        _, after = call(lambda _: torch.ones(4, device=device).add(1).sum().item(), None, device)
        seen.context_after = ("failed too: " + after.headline) if after else "ran fine"
    return vars(seen)


def reproduce_slow(symptom: Slow, cfg: DictConfig, settings: Settings, result: ChildResult) -> PhaseRecord:
    """A failure that is time (`Slow`): `buggy` must return the reference's output (else wrong_failure); then it is
    timed against the symptom's baseline by the speed phase's protocol (harness/phases/speed.py) on the speed inputs:
    `slow` when the ratio's interval lies above `at_least`, with the lines torch logged and the graphs it compiled."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    seen = BuggyRun(**result.value)
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    figures: dict[str, Any] = {**seen.said(), **(seen.compared or {}), "at_least": symptom.at_least, "baseline_function": symptom.baseline}
    if seen.failure is not None:
        figures.update(error=seen.failure.headline, raised_at=seen.failure.where, traceback=seen.failure.traceback)
        return record_of(
            "reproduce",
            "wrong_failure",
            False,
            f"{seen.failure.headline} (expected it to return the right result, slowly)",
            result,
            figures,
        )
    if not seen.compared["match"]:
        return record_of(
            "reproduce",
            "wrong_failure",
            False,
            f"returned a wrong result (expected it right and slow): {difference(seen.compared)}",
            result,
            figures,
        )
    said = [line for line in seen.logged + seen.warned if symptom.log and re.search(symptom.log, line)]
    figures["log_line"] = said[0] if said else None
    timed = time_against("reproduce", BUGGY, symptom.at_least, cfg, settings, baseline=symptom.baseline)
    figures.update(timed.figures)
    seconds = round(result.seconds + timed.seconds, 4)
    explained = (
        f"; {seen.graphs_compiled} graphs compiled in {symptom.calls} call{'s' if symptom.calls > 1 else ''}"
        if seen.graphs_compiled
        else ""
    ) + (f"; logged: {said[0].splitlines()[0]}" if said else "")
    if timed.status == "over_budget":
        if symptom.log and not said:
            return PhaseRecord(
                "reproduce",
                "wrong_failure",
                False,
                f"slow, but torch logged nothing like /{symptom.log}/: {timed.message}",
                figures,
                seconds,
                result.output,
            )
        message = f"correct and slow: buggy against `{symptom.baseline}` {timed.message.replace('over budget', 'over')}{explained}"
        return PhaseRecord("reproduce", "slow", expected, message, figures, seconds, result.output)
    if timed.status == "within_budget":
        if expected:
            return PhaseRecord(
                "reproduce",
                "not_reproduced",
                False,
                f"buggy is not slower than {symptom.at_least}x `{symptom.baseline}` on torch {torch.__version__}: {timed.message}",
                figures,
                seconds,
                result.output,
            )
        status = symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg))
        return PhaseRecord(
            "reproduce",
            status,
            True,
            f"buggy is not slow, as expected on torch {torch.__version__} (it is slow {symptom.range_text()}{_modes_text(symptom)}): {timed.message}",
            figures,
            seconds,
            result.output,
        )
    if timed.status == "inconclusive":
        return PhaseRecord(
            "reproduce",
            "inconclusive",
            False,
            f"the interval still straddles {symptom.at_least}x: {timed.message}",
            figures,
            seconds,
            result.output,
        )
    return timed  # the timing itself broke (raised, crashed, timeout): its own record


def _first_matching_line(pattern: str, output: str) -> str | None:
    for line in output.splitlines():
        if re.search(pattern, line):
            return line.strip()[:500]
    return None


def _modes_text(symptom: Any) -> str:
    return "" if getattr(symptom, "modes", None) is None else f", under compile={'/'.join(symptom.modes)}"
