"""What every phase shares: its run spec (harness/spec.py), the case function a phase runs (the submitted fix when grading), calling
case code in a child, and the record a phase returns."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from harness import compiled as compile_axis
from harness.measure.timing import synchronize
from harness.process.confine import Limits
from harness.process.outcome import ChildResult, Failure
from harness.process.submitted import load_submitted, submission_of
from harness.records import PhaseRecord
from harness.spec import RunSpec
from harness.statuses import BROKE, ERROR
from harness.symptoms import symptom_on

FIXED = "fixed"
BUGGY = "buggy"
SPEED_CANDIDATE = "speed_candidate"
SLOW_FIX = "slow_fix:"
MEMORY_FIX = "memory_fix:"
MEMORY_BASELINE = "memory_baseline"
GRADED_PAIRS = 6  # at least, per timing process of a submitted fix (plus 0-2 more, drawn privately): more calls than a case's own timing


def failure_holds(case: ModuleType, spec: RunSpec) -> bool:
    """Whether the case's failure is expected on this run: its symptom holds on this torch under this compile mode.
    Where it does not (a torch before or after it, a compile mode that makes the code valid), a bad fix may be right
    and a control may show nothing: their verdicts say so instead of failing the run."""
    return symptom_on(case.symptoms[spec.device], torch.__version__).holds(torch.__version__, spec.compile)


def fix_under_test(case: ModuleType, cfg: DictConfig) -> Callable:
    """In a child: the case's own `fixed`, or the submitted fix when grading (loaded here by path, never pickled)."""
    submission = submission_of(cfg)
    return case.fixed if submission is None else load_submitted(submission, case)


def confinement(spec: RunSpec) -> Limits | None:
    """The limits for a child that loads the fix under test: a submitted fix is confined, the case's own is not."""
    return spec.limits if spec.graded else None


def case_function(case: ModuleType, name: str, cfg: DictConfig) -> Callable[[Any], Any]:
    """The case function a phase runs: FIXED, SPEED_CANDIDATE (default `fixed`), BUGGY, "slow_fix:<name>", or a bad
    fix's name. When grading, FIXED and SPEED_CANDIDATE are the submitted fix (`fix_under_test`)."""
    if name == FIXED or (name == SPEED_CANDIDATE and submission_of(cfg) is not None):
        return fix_under_test(case, cfg)
    if name == SPEED_CANDIDATE:
        return getattr(case, SPEED_CANDIDATE, case.fixed)
    if name == BUGGY:  # timed against the fix where the failure is time (`Slow`)
        return case.buggy
    if name.startswith(SLOW_FIX):
        return case.slow_fixes[name.removeprefix(SLOW_FIX)]
    return case.bad_fixes[name]


def compiled_for(function: Callable, case: ModuleType, cfg: DictConfig) -> Callable:
    """`function` under the config's compile mode (harness/compiled.py); itself where the case compiles its unit itself.
    A child that runs a submitted fix is confined, and confinement points its kernel cache, and its ranks', at the
    grade's own folder (harness/process/confine.py); every other child, in a grade too, uses the harness's cache."""
    if getattr(case, "compiles_itself", False):
        return function
    return compile_axis.compiled(function, cfg)


def call(function: Callable, inputs: Any, device: str, *, synchronise: bool = True) -> tuple[Any, Failure | None]:
    """Run case code, synchronising so that an asynchronous CUDA error surfaces here."""
    try:
        output = function(inputs)
        if synchronise:
            synchronize(device)
        return output, None
    except BaseException as error:  # noqa: BLE001 - every failure of case (or submitted) code is a result, SystemExit too
        return None, Failure.from_exception(error)


def abnormal(phase: str, result: ChildResult) -> PhaseRecord:
    if result.status == "raised":
        return record_of(
            phase,
            ERROR,
            False,
            f"the case failed before the phase could run: {result.failure.headline}",
            result,
            {"traceback": result.failure.traceback},
        )
    status = BROKE[result.status]
    said = result.output.rpartition("[harness] ")[2].strip() if "[harness] " in result.output else ""
    return record_of(
        phase, status, False, result.summary + (f" ({said})" if said else ""), result, {"signal": result.signal} if result.signal else {}
    )


def record_of(phase: str, status: str, ok: bool, message: str, result: ChildResult, figures: dict | None = None) -> PhaseRecord:
    return PhaseRecord(phase, status, ok, message, {**(figures or {}), **containment(result)}, round(result.seconds, 4), result.output)


def containment(result: ChildResult) -> dict[str, Any]:
    """What a confined child tried or left behind, and how it was held: for the grade's integrity check."""
    said = {"refused_writes": result.refused_writes, "left_behind": result.left_behind, "confinement": result.confinement}
    return {key: value for key, value in said.items() if value}


def difference(figures: dict[str, Any]) -> str:
    if "reason" in figures:
        return figures["reason"]
    parts = []
    if figures["integers"]:
        parts.append(f"{figures['mismatched_integers']} of {figures['integers']} integers differ")
    if figures["floats"]:
        parts.append(
            f"{figures['mismatched_floats']} of {figures['floats']} floats beyond tolerance, max |diff| {figures['max_abs_diff']:.3g}"
        )
    if "snr_db" in figures:
        parts.append(f"relative error {figures['relative_error']:.3g} (SNR {figures['snr_db']:.1f} dB)")
    if any(d["output"] != "output" for d in figures.get("differing", [])):  # a single tensor needs no name
        named = ", ".join(d["output"].removeprefix("output") or "output" for d in figures["differing"][:4])
        parts.append(f"in {named}" + (f" and {figures['outputs_differing'] - 4} more" if figures["outputs_differing"] > 4 else ""))
    return "; ".join(parts)


def tolerance_text(cfg: DictConfig) -> str:
    scale = cfg.tolerance.get("scale")
    scaled = f" + {scale} x each tensor's largest magnitude" if scale else ""
    return f"(atol {cfg.tolerance.atol}{scaled}, rtol {cfg.tolerance.rtol}; integers exact)"


def speed_config(cfg: DictConfig, device: str, inputs: Any = None) -> DictConfig:
    """The case config that speed inputs are made from: `speed.inputs` merged over it, then
    `speed.device_inputs.<device>`, then a comparison's own `inputs` (from `speed.also`)."""
    return OmegaConf.merge(
        cfg, OmegaConf.select(cfg, "speed.inputs") or {}, OmegaConf.select(cfg, f"speed.device_inputs.{device}") or {}, inputs or {}
    )
