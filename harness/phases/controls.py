"""The controls: slow fixes the speed verdict must flag, bad fixes that must be rejected, memory controls the
memory verdict must flag. Each shows that its verdict can fail."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness import margins
from harness.phases.common import MEMORY_FIX, SLOW_FIX, RunSpec, abnormal, difference, failure_holds, record_of, tolerance_text
from harness.phases.correct import compare_in_child
from harness.phases.memory import memory_budget, memory_judged
from harness.phases.speed import budget_of, time_against, traced_every_call
from harness.process.isolate import run_isolated
from harness.records import PhaseRecord
from harness.statuses import BadFix, Memory, MemoryControl, SlowControl, Speed


def slow_fix(name: str, case: ModuleType, spec: RunSpec) -> PhaseRecord:
    """A correct but slower fix must be flagged by the speed verdict: `flagged`, else `missed`."""
    cfg = spec.case_cfg
    phase = f"{SLOW_FIX}{name}"
    budget = budget_of(cfg.get("speed"), spec.device)
    if budget is None:
        return PhaseRecord(phase, SlowControl.NO_BUDGET, True, f"no speed budget on {spec.device}: nothing to flag", {}, 0.0, "")
    checked = run_isolated(compare_in_child, phase, cfg, spec.device, timeout_s=spec.timeout_s)
    if checked.status != "returned":
        return abnormal(phase, checked)
    figures, failure = checked.value
    if failure is not None:
        return record_of(phase, SlowControl.MISSED, False, f"the control is broken: it raises {failure.headline}", checked)
    if not figures["match"]:
        return record_of(
            phase,
            SlowControl.MISSED,
            False,
            "the control is broken: it differs from the reference: " + difference(figures),
            checked,
            figures,
        )
    timed = time_against(phase, phase, budget, cfg, spec, clear_by=margins.SLOW)
    if timed.status == Speed.OVER_BUDGET:
        status, message = SlowControl.FLAGGED, "correct, and flagged: " + timed.message
    elif timed.status in (Speed.WITHIN_BUDGET, Speed.INCONCLUSIVE) and not failure_holds(case, spec):
        status, message = (
            SlowControl.NOT_APPLICABLE,
            f"not flagged ({timed.status}) on a run where the case's failure does not occur ({ABSENT}): " + timed.message,
        )
    elif timed.status in (Speed.WITHIN_BUDGET, Speed.INCONCLUSIVE) and traced_every_call(timed.figures):
        status, message = (
            SlowControl.RETRACED,
            f"not judged ({timed.status}): a control is slower than a settled compiled baseline, and this one never "
            "settled: " + timed.message,
        )
    elif timed.status in (Speed.WITHIN_BUDGET, Speed.INCONCLUSIVE):
        status, message = SlowControl.MISSED, f"correct but not flagged ({timed.status}): " + timed.message
    else:  # the timing itself crashed, hung or raised: the control proves nothing
        return timed
    return PhaseRecord(phase, status, status.ok, message, timed.figures, timed.seconds + checked.seconds, timed.output_tail)


def bad_fix(name: str, case: ModuleType, spec: RunSpec) -> PhaseRecord:
    cfg = spec.case_cfg
    phase = f"bad_fix:{name}"
    result = run_isolated(compare_in_child, name, cfg, spec.device, timeout_s=spec.timeout_s)
    if result.status == "signalled":
        return record_of(phase, BadFix.REJECTED, True, f"crashed: {result.summary}", result, {"how": "crashed"})
    if result.status != "returned":
        return abnormal(phase, result)
    figures, failure = result.value
    if failure is not None:
        return record_of(phase, BadFix.REJECTED, True, f"raises {failure.headline}", result, {"how": "raised", "error": failure.headline})
    if not figures["match"]:
        return record_of(
            phase, BadFix.REJECTED, True, "differs from the reference: " + difference(figures), result, {"how": "differs", **figures}
        )
    if figures.get("still_warns"):
        return record_of(phase, BadFix.REJECTED, True, f"still warns: {figures['still_warns']}", result, {"how": "warns", **figures})
    if not failure_holds(case, spec):
        return record_of(
            phase,
            BadFix.NOT_WRONG_HERE,
            True,
            f"matches the reference on a run where the case's failure does not occur ({ABSENT}): wrong only where it does",
            result,
            figures,
        )
    right_on = getattr(case, "bad_fixes_right_on", {}).get(name)
    if right_on and SpecifierSet(right_on).contains(Version(torch.__version__.split("+")[0]), prereleases=True):
        return record_of(
            phase,
            BadFix.NOT_WRONG_HERE,
            True,
            f"matches the reference on torch {torch.__version__}, a release the case says it is right on ({right_on}): "
            "wrong only outside them",
            result,
            figures,
        )
    return record_of(
        phase, BadFix.ACCEPTED, False, "matches the reference: this bad fix is not caught " + tolerance_text(cfg), result, figures
    )


def memory_fix(name: str, case: ModuleType, spec: RunSpec) -> PhaseRecord:
    """A memory control (a wrong fix that keeps every step's memory) must be flagged by the memory verdict."""
    cfg = spec.case_cfg
    phase = f"{MEMORY_FIX}{name}"
    if memory_budget(cfg, spec.device) is None:
        return PhaseRecord(phase, MemoryControl.NO_BUDGET, True, f"no memory budget on {spec.device}: nothing to flag", {}, 0.0, "")
    judged = memory_judged(phase, phase, case, cfg, spec)
    if judged.status == Memory.OVER_BUDGET:
        return dataclasses.replace(judged, status=MemoryControl.FLAGGED, ok=True, message="flagged: " + judged.message)
    if judged.status in (Memory.WITHIN_BUDGET, Memory.INCONCLUSIVE) and not failure_holds(case, spec):
        return dataclasses.replace(
            judged,
            status=MemoryControl.NOT_APPLICABLE,
            ok=True,
            message=f"not flagged ({judged.status}) on a run where the case's failure does not occur ({ABSENT}): " + judged.message,
        )
    if judged.status in (Memory.WITHIN_BUDGET, Memory.INCONCLUSIVE):
        return dataclasses.replace(
            judged, status=MemoryControl.MISSED, ok=False, message=f"not flagged ({judged.status}): " + judged.message
        )
    return judged


ABSENT = "this torch or this compile mode, as its symptom's appears_in, fixed_in and modes say"
