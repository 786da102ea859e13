"""memory: retained and peak memory per step of the fix against its baseline, each over the steps in a child of its
own (harness/measure/footprint.py); reproduce judges a `Growth` symptom the same way, on `buggy`."""

from __future__ import annotations

import dataclasses
import functools
import secrets
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cases import load_case
from harness.measure import footprint as memory_source
from harness.measure import memory_verdict
from harness.phases.common import (
    FIXED,
    MEMORY_BASELINE,
    MEMORY_FIX,
    RunSpec,
    abnormal,
    case_function,
    compiled_for,
    confinement,
    containment,
    record_of,
    speed_config,
)
from harness.process.isolate import run_isolated
from harness.process.outcome import ChildResult, Failure
from harness.process.submitted import SUBMITTED_KEY
from harness.records import PhaseRecord
from harness.statuses import Memory, Reproduce
from harness.symptoms import symptom_on


def memory(case: ModuleType, spec: RunSpec) -> PhaseRecord:
    """The fix's memory over `steps` steps against `memory_baseline`'s, judged against `memory.budget.<device>`."""
    cfg = spec.case_cfg
    reason = OmegaConf.select(cfg, "memory.not_applicable")
    if reason:
        return PhaseRecord("memory", Memory.NOT_APPLICABLE, True, str(reason), {"device": spec.device}, 0.0, "")
    return memory_judged("memory", FIXED, case, cfg, spec)


def reproduce_growth(case: ModuleType, cfg: DictConfig, spec: RunSpec) -> PhaseRecord:
    """A failure that is memory growing step after step (`Growth`): `buggy`'s retained memory per step, measured;
    reproduced when the slope's lower bound is at least `at_least` x the baseline's peak per step."""
    symptom = symptom_on(case.symptoms[spec.device], torch.__version__)
    measured = measure_pair("reproduce", "buggy", cfg, spec)
    if isinstance(measured, PhaseRecord):
        return measured
    buggy, baseline, figures, seconds, output = measured
    verdict = memory_verdict.judge_memory(buggy, baseline, None)
    figures.update(verdict.figures(), at_least=symptom.at_least, oom=symptom.oom)
    said = memory_verdict.describe(buggy, baseline)
    if verdict.growth_fraction_low >= symptom.at_least:
        return PhaseRecord("reproduce", Reproduce.REPRODUCED, True, f"memory grows: {said}", figures, seconds, output)
    return PhaseRecord(
        "reproduce",
        Reproduce.NOT_REPRODUCED,
        False,
        f"growth {verdict.growth_fraction_low:.3f} (lower bound) of the baseline's peak per step < {symptom.at_least}: {said}",
        figures,
        seconds,
        output,
    )


def memory_budget(cfg: DictConfig, device: str) -> dict[str, float] | None:
    budget = OmegaConf.select(cfg, f"memory.budget.{device}")
    return None if budget is None else {key: float(value) for key, value in budget.items() if value is not None}


_BASELINES: dict[str, Any] = {}  # the baseline's measurement, per config, within one run of the harness

GRADED_EXTRA_STEPS = 3  # a graded fix runs `memory.steps` plus 0 to this many steps, drawn: a case whose inputs run out
# (an epoch's end, where a DataLoader's workers are replaced) must fit warmup + steps + this many calls before it


def memory_judged(phase: str, candidate: str, case: ModuleType, cfg: DictConfig, spec: RunSpec) -> PhaseRecord:
    measured = measure_pair(phase, candidate, cfg, spec)
    if isinstance(measured, PhaseRecord):
        return measured
    fix_memory, baseline, figures, seconds, output = measured
    budget = memory_budget(cfg, spec.device)
    verdict = memory_verdict.judge_memory(fix_memory, baseline, budget)
    figures.update(verdict.figures(), budget=budget)
    said = memory_verdict.describe(fix_memory, baseline)
    message = {
        Memory.MEASURED: f"{said}; no memory budget on {spec.device}",
        Memory.WITHIN_BUDGET: f"{said}; within budget {budget}",
        Memory.OVER_BUDGET: f"{said}; over budget: {'; '.join(verdict.reasons)}",
        Memory.INCONCLUSIVE: f"{said}; {'; '.join(verdict.reasons)}",
    }[verdict.status]
    return PhaseRecord(phase, verdict.status, Memory(verdict.status).ok, message, figures, seconds, output)


def measure_pair(phase: str, candidate: str, cfg: DictConfig, spec: RunSpec) -> tuple | PhaseRecord:
    """`candidate` and the baseline, each over the steps in a child of its own; a PhaseRecord where one broke."""
    steps = _memory_steps(cfg, spec)
    result = _measure(candidate, cfg, spec, steps)
    if result.status != "returned" or result.value is not None or result.talk is None:
        return _memory_abnormal(phase, result)
    graded = spec.graded
    if graded:  # the model solution, in a child that never imports the submission (as speed's grading)
        base = _measure(
            FIXED,
            OmegaConf.create({k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != SUBMITTED_KEY}),
            spec,
            steps,
        )
    else:
        key = f"{spec.device}:{steps}:{spec.memory}:{OmegaConf.to_yaml(cfg)}"
        if key not in _BASELINES:
            _BASELINES[key] = _measure(MEMORY_BASELINE, cfg, spec, steps)
        base = _BASELINES[key]
    if base.status != "returned" or base.value is not None or base.talk is None:
        broke = _memory_abnormal(phase, base)
        return dataclasses.replace(broke, status=Memory.ERROR, ok=False, message=f"the memory baseline's child: {broke.message}")
    level = spec.memory.level
    fix_memory = memory_source.step_memory(result.talk, spec.device, level)
    baseline = memory_source.step_memory(base.talk, spec.device, level)
    figures: dict[str, Any] = {
        "steps": steps,
        "warmup": spec.memory.warmup,
        "device": spec.device,
        "baseline_function": FIXED if graded else MEMORY_BASELINE,
        "source": memory_source.source_name(spec.device),
        "method": memory_source.METHOD,
    }
    figures.update(fix_memory.figures())
    figures["baseline"] = baseline.figures()
    if spec.device == "cpu" and not result.talk["hwm_reset"]:
        figures["peak_caveat"] = "the high-water mark could not be reset: peaks are since the child started"
    figures.update(containment(result))
    return fix_memory, baseline, figures, round(result.seconds + base.seconds, 4), result.output


def _memory_steps(cfg: DictConfig, spec: RunSpec) -> int:
    steps = int(OmegaConf.select(cfg, "memory.steps") or spec.memory.steps)
    if spec.graded:  # a submitted fix cannot know which call is the last one measured
        steps += secrets.randbelow(GRADED_EXTRA_STEPS + 1)
    return steps


def _measure(candidate: str, cfg: DictConfig, spec: RunSpec, steps: int) -> ChildResult:
    confined = confinement(spec) if candidate == FIXED else None
    talk = functools.partial(_drive_memory, device=spec.device)
    return run_isolated(
        _memory_in_child,
        candidate,
        cfg,
        spec.device,
        steps,
        spec.memory.warmup,
        timeout_s=spec.timeout_s,
        confined=confined,
        talk=talk,
    )


def _drive_memory(connection, pid: int, deadline: float, *, device: str) -> dict[str, Any]:
    return memory_source.drive_steps(connection, pid, deadline, device)


def _memory_in_child(candidate: str, cfg: DictConfig, device: str, steps: int, warmup: int, *, connection) -> Failure | None:
    """Serve the parent's memory steps (harness/measure/footprint.py) for `candidate`: FIXED (the fix under test), "buggy",
    MEMORY_BASELINE (default `speed_baseline`) or a memory control; None when every step ran."""
    if device == "cpu":
        memory_source.pin_cpu_allocator()
        torch.set_num_threads(1)
    case = load_case(cfg.name)
    if candidate == MEMORY_BASELINE:
        function = getattr(case, MEMORY_BASELINE, case.speed_baseline)
    elif candidate.startswith(MEMORY_FIX):
        function = case.memory_fixes[candidate.removeprefix(MEMORY_FIX)]
    elif candidate == "buggy":
        function = case.buggy
    else:
        function = case_function(case, candidate, cfg)
    inputs = case.make_inputs(memory_config(cfg, device), device)
    try:
        memory_source.serve_steps(connection, compiled_for(function, case, cfg), inputs, device, steps, warmup)
    except Exception as error:  # noqa: BLE001
        return Failure.from_exception(error)
    return None


def memory_config(cfg: DictConfig, device: str) -> DictConfig:
    """The config memory inputs are made from: the speed inputs (`speed_config`: the same functions are compared),
    then `memory.inputs`."""
    return OmegaConf.merge(speed_config(cfg, device), OmegaConf.select(cfg, "memory.inputs") or {})


def _memory_abnormal(phase: str, result: ChildResult) -> PhaseRecord:
    if result.status == "returned" and result.value is not None:
        return record_of(phase, Memory.RAISED, False, result.value.headline, result, {"raised_at": result.value.where})
    if result.status == "returned":
        return record_of(phase, Memory.CRASHED, False, "the memory child stopped answering the parent", result)
    return abnormal(phase, result)
