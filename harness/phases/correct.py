"""fix and correct: the fix under test runs (compiled as the run says, without host syncs where the case forbids
them), then its output against the reference."""

from __future__ import annotations

import contextlib
import re
import warnings
from types import ModuleType
from typing import Any, Callable

import torch
from omegaconf import DictConfig

from harness import compiled as compile_axis
from harness.cases import load_case
from harness.measure.compare import compare, describe, tolerance_of
from harness.measure.timing import synchronize
from harness.phases.common import (
    FIXED,
    SLOW_FIX,
    SPEED_CANDIDATE,
    RunSpec,
    abnormal,
    call,
    case_function,
    compiled_for,
    confinement,
    difference,
    fix_under_test,
    record_of,
    tolerance_text,
)
from harness.process.isolate import run_isolated
from harness.process.outcome import Failure
from harness.records import PhaseRecord
from harness.statuses import Correct
from harness.symptoms import Warns, symptom_on


def fix(case: ModuleType, spec: RunSpec) -> PhaseRecord:
    cfg = spec.case_cfg
    result = run_isolated(_fix_in_child, cfg, spec.device, timeout_s=spec.timeout_s, confined=confinement(spec))
    if result.status != "returned":
        return abnormal("fix", result)
    output, failure, sync_checked, compile_figures = result.value
    figures = {"host_sync_checked": sync_checked} if sync_checked else {}
    figures.update(compile_figures)
    if failure is not None:
        return record_of("fix", Correct.RAISED, False, failure.headline, result, {**figures, "raised_at": failure.where})
    return record_of("fix", Correct.PASSED, True, f"returned {output}", result, figures)


def _fix_in_child(cfg: DictConfig, device: str) -> tuple[str | None, Failure | None, bool, dict[str, Any]]:
    case = load_case(cfg.name)
    function = fix_under_test(case, cfg)
    inputs = case.make_inputs(cfg, device)
    check_sync = device == "cuda" and bool(cfg.get("fix_must_not_sync", False))
    function, compile_figures, failure = _compiled_fix(function, case, cfg, inputs, device)
    if failure is not None:
        return None, failure, False, compile_figures
    with _sync_forbidden() if check_sync else contextlib.nullcontext():
        output, failure = call(function, inputs, device, synchronise=False)
    if failure is None:
        _, failure = call(lambda _: None, None, device)  # synchronise, so asynchronous errors surface here
    return (describe(output) if failure is None else None), failure, check_sync, compile_figures


def _compiled_fix(
    function: Callable, case: ModuleType, cfg: DictConfig, inputs: Any, device: str
) -> tuple[Callable, dict[str, Any], Failure | None]:
    """The fix as the compile mode runs it, compiled and called once (outside any sync check: compiling may sync).

    A fix should compile as one graph (`fullgraph=True`); where it cannot, the graph breaks and their reasons
    are recorded, and it runs compiled with them."""
    if compile_axis.mode_of(cfg) == "off" or getattr(case, "compiles_itself", False):
        return compiled_for(function, case, cfg), {}, None
    whole = compile_axis.compiled(function, cfg, fullgraph=True)
    output, failure = call(lambda x: compile_axis.timed_first_call(whole, x, lambda: synchronize(device)), inputs, device)
    if failure is None:
        return whole, {"fullgraph": True, "compile_s": output[1], "graphs": compile_axis.graphs_compiled()}, None
    if not compile_axis.is_compiler_error(failure.types, failure.modules):
        return whole, {"fullgraph": True}, failure
    figures: dict[str, Any] = {"fullgraph": False, "fullgraph_error": failure.headline[:300]}
    report, explain_failure = call(lambda x: compile_axis.graph_report(function, x), inputs, device)
    figures.update(report or {"graph_report_failed": explain_failure.headline[:300]})
    broken = compile_axis.compiled(function, cfg)
    output, failure = call(lambda x: compile_axis.timed_first_call(broken, x, lambda: synchronize(device)), inputs, device)
    if failure is None:
        figures["compile_s"] = output[1]
    return broken, figures, failure


@contextlib.contextmanager
def _sync_forbidden():
    """Make any op that synchronises the host with the GPU raise (the fix claims it adds none)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def correct(case: ModuleType, spec: RunSpec) -> PhaseRecord:
    cfg = spec.case_cfg
    result = run_isolated(compare_in_child, FIXED, cfg, spec.device, timeout_s=spec.timeout_s)
    if result.status != "returned":
        return abnormal("correct", result)
    figures, failure = result.value
    if failure is not None:
        return record_of("correct", Correct.RAISED, False, failure.headline, result)
    if figures.get("still_warns"):
        return record_of(
            "correct", Correct.MISMATCH, False, f"still warns as the buggy code does: {figures['still_warns']}", result, figures
        )
    if figures["match"]:
        return record_of("correct", Correct.PASSED, True, "matches the reference " + tolerance_text(cfg), result, figures)
    return record_of("correct", Correct.MISMATCH, False, "differs from the reference: " + difference(figures), result, figures)


def compare_in_child(candidate: str, cfg: DictConfig, device: str) -> tuple[dict | None, Failure | None]:
    """Compare `candidate` (FIXED, a bad fix's name, or a slow fix) with the reference.

    A slow fix stands in for the timed part of the fix, so where a case times only part of it
    (`speed_candidate`), the slow fix is compared with `speed_reference`, that part's reference.
    """
    case = load_case(cfg.name)
    inputs = case.make_inputs(cfg, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, failure = call(compiled_for(case_function(case, candidate, cfg), case, cfg), inputs, device)
    if failure is not None:
        return None, failure
    partial = candidate.startswith(SLOW_FIX) and hasattr(case, SPEED_CANDIDATE)
    fresh = case.make_inputs(
        cfg, device
    )  # a training step advances the state it is given (the memory contract): the reference starts where the candidate did
    want, failure = call(case.speed_reference if partial else case.reference, fresh, device)
    if failure is not None:
        raise RuntimeError(f"the reference itself failed: {failure.headline}")
    figures = compare(got, want, **tolerance_of(cfg.tolerance))
    warned = _still_warns(case, cfg, device, [f"{w.category.__name__}: {w.message}" for w in caught])
    return ({**figures, "still_warns": warned} if warned else figures), None


def _still_warns(case: ModuleType, cfg: DictConfig, device: str, warned: list[str]) -> str | None:
    """Where the case's failure is a warning (`Warns`) on this torch, the candidate's line that still issues it: a fix
    of a warning stops it; returning the right result while warning is the buggy code."""
    symptom = symptom_on(case.symptoms[device], torch.__version__)
    if not isinstance(symptom, Warns) or not symptom.holds(torch.__version__, compile_axis.mode_of(cfg)):
        return None
    return next((line[:300] for line in warned if re.search(symptom.warning, line)), None)
