"""reproduce: run `buggy` and judge how it fails against the device's symptom on this torch (harness/cases.py)."""

from __future__ import annotations

import re
import warnings
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig

from harness import compiled as compile_axis
from harness.cases import Growth, Warns, WrongResult, load_case, symptom_on
from harness.compare import compare, tolerance_of
from harness.isolate import ChildResult, Failure, run_isolated
from harness.phases.common import Settings, abnormal, call, compiled_for, difference, record_of, tolerance_text
from harness.phases.memory import reproduce_growth
from harness.records import PhaseRecord


def reproduce(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    if isinstance(symptom, Growth):
        return reproduce_growth(case, cfg, settings)
    result = run_isolated(_reproduce_in_child, cfg, settings.device, isinstance(symptom, (WrongResult, Warns)), timeout_s=settings.timeout_s)
    if isinstance(symptom, (WrongResult, Warns)):
        return reproduce_silent(symptom, cfg, result)
    if compile_axis.mode_of(cfg) != "off":
        return reproduce_compiled(case, cfg, settings, result)
    if result.status != "returned":
        return abnormal("reproduce", result)
    failure, context_after, _, warned = result.value
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    said = {"warnings": warned} if warned else {}
    if failure is None:
        if not expected:
            return record_of("reproduce", symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)), True, f"buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})", result, said)
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
        return record_of("reproduce", "reproduced", False, f"{failure.headline} (but it was recorded as failing {symptom.range_text()})", result, figures)
    return record_of("reproduce", "reproduced", True, failure.headline, result, figures)


def reproduce_silent(symptom: WrongResult | Warns, cfg: DictConfig, result: ChildResult) -> PhaseRecord:
    """A failure that raises nothing, eager or compiled alike: `buggy`'s output against the reference (`WrongResult`:
    wrong_result when it differs beyond the tolerance), or the warning it issued (`Warns`: warned).
    Every warning the call issued is kept verbatim; an error is `wrong_failure`."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    failure, _, compared, warned = result.value
    expected = symptom.holds(torch.__version__, compile_axis.mode_of(cfg))
    figures: dict[str, Any] = {"warnings": warned, **(compared or {})}
    if failure is not None:
        figures.update(error=failure.headline, raised_at=failure.where, traceback=failure.traceback)
        return record_of("reproduce", "wrong_failure", False, f"{failure.headline} (expected it to return {'a wrong result' if isinstance(symptom, WrongResult) else 'with a warning'})", result, figures)
    warning = next((line for line in warned if re.search(symptom.warning, line)), None) if symptom.warning else None
    figures["warning"] = warning
    if isinstance(symptom, Warns):
        if warning is not None:
            return record_of("reproduce", "warned", expected, warning, result, figures)
        return record_of("reproduce", symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)) if not expected else "not_reproduced", not expected, f"buggy ran without the warning /{symptom.warning}/ on torch {torch.__version__}", result, figures)
    wrong = not compared["match"]
    if wrong and (symptom.warning is None or warning is not None):
        said = f"returned a wrong result: {difference(compared)}" + (f"; warned {warning}" if warning else "")
        return record_of("reproduce", "wrong_result", expected, said, result, figures)
    if wrong:
        return record_of("reproduce", "wrong_failure", False, f"returned a wrong result, without the warning /{symptom.warning}/: {difference(compared)}", result, figures)
    if not expected:
        return record_of("reproduce", symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)), True, f"buggy returned the reference's output, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})", result, figures)
    return record_of("reproduce", "not_reproduced", False, f"buggy returned the reference's output {tolerance_text(cfg)} on torch {torch.__version__}", result, figures)


FAILURE_REPRODUCED = frozenset({"reproduced", "wrong_result", "warned", "raised", "aborted", "silent"})  # eager's statuses, then the compiled outcomes


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
    failure, context_after, silent, _ = result.value
    if failure is None:
        if not expected:
            return record_of("reproduce", symptom.clean_status_under(torch.__version__, compile_axis.mode_of(cfg)), True, f"compiled buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()}{_modes_text(symptom)})", result)
        if silent["match"]:
            return record_of("reproduce", "not_reproduced", False, f"compiled buggy returned the reference's output on torch {torch.__version__}", result, silent)
        message = f"returned an output under {mode} where eager raises {symptom.exception}: {difference(silent)}"
        return record_of("reproduce", "silent", True, message, result, {**silent, "same_as_eager": False})
    problems = symptom.mismatches(failure, result.output)
    figures: dict[str, Any] = {"error": failure.headline, "raised_at": failure.where, "same_as_eager": not problems, "traceback": failure.traceback, **failure.figures}
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    if problems and compile_axis.is_compiler_error(failure.types, failure.modules):
        return record_of("reproduce", "compile_failed", False, f"the compiler raised {failure.headline}", result, figures)
    eager = "" if not problems else f" (eager: {symptom.exception}; {'; '.join(problems)})"
    return record_of("reproduce", "raised", expected, failure.headline + eager, result, figures)


def _reproduce_in_child(cfg: DictConfig, device: str, silent: bool) -> tuple[Failure | None, str | None, dict | None, list[str]]:
    """`buggy` as a user's process runs it: how it failed, the unrelated op after a CUDA error, how its output
    compares with the reference (where it returned compiled, or the failure is `silent`), and the warnings it issued."""
    case = load_case(cfg.name)
    cfg = compile_axis.as_users_run_it(cfg)  # the failure as a user's process shows it
    inputs = case.make_inputs(cfg, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output, failure = call(compiled_for(case.buggy, case, cfg), inputs, device)
    warned = list(dict.fromkeys(f"{w.category.__name__}: {w.message}"[:1000] for w in caught))[:20]
    if failure is None:
        if compile_axis.mode_of(cfg) == "off" and not silent:
            return None, None, None, warned
        want, _ = call(case.reference, case.make_inputs(cfg, device), device)  # fresh: buggy may have advanced its inputs' state
        return None, None, compare(output, want, **tolerance_of(cfg.tolerance)), warned
    if device != "cuda":
        return failure, None, None, warned
    # A device-side assert is sticky: an unrelated op in the same process fails too.
    _, after = call(lambda _: torch.ones(4, device=device).add(1).sum().item(), None, device)
    return failure, ("failed too: " + after.headline) if after else "ran fine", None, warned


def _first_matching_line(pattern: str, output: str) -> str | None:
    for line in output.splitlines():
        if re.search(pattern, line):
            return line.strip()[:500]
    return None


def _modes_text(symptom: Any) -> str:
    return "" if getattr(symptom, "modes", None) is None else f", under compile={'/'.join(symptom.modes)}"
