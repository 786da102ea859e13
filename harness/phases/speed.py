"""speed: the fix under test against a baseline, timed by the parent (harness/measure/clock.py) in several child
processes, the ratio's interval against the budget (harness/measure/timing.py)."""

from __future__ import annotations

import functools
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from harness.cases import load_case
from harness.measure.anomaly import anomaly, baseline_anomaly, clock_figures
from harness.measure.clock import TimedProcess, drive
from harness.measure.timing import RatioEstimate, estimate_ratio, judge
from harness.phases.common import (
    GRADED_PAIRS,
    SPEED_CANDIDATE,
    RunSpec,
    abnormal,
    containment,
    record_of,
)
from harness.phases.timing_processes import apart_timing_process, graded_timing_process, shared_timing_process
from harness.process.outcome import ChildResult
from harness.records import PhaseRecord
from harness.spec import SpeedSettings
from harness.statuses import Speed

GRADE_HARD_LIMIT = 3  # times speed.grade_max_s: a grade's timing ends there, however few processes it measured


def speed(case: ModuleType, spec: RunSpec) -> Iterator[PhaseRecord]:
    """The fix against `speed_baseline`; then, as phase "speed:<name>", each comparison in the yaml's
    `speed.also`: the fix against the case function `baseline` names, on inputs with `inputs` merged over."""
    cfg = spec.case_cfg
    yield time_against("speed", SPEED_CANDIDATE, budget_of(cfg.get("speed"), spec.device), cfg, spec)
    for name, also in (OmegaConf.select(cfg, "speed.also") or {}).items():
        yield time_against(
            f"speed:{name}",
            SPEED_CANDIDATE,
            budget_of(also, spec.device),
            cfg,
            spec,
            baseline=also.baseline,
            inputs=also.get("inputs"),
        )


def budget_of(speed_cfg: DictConfig | None, device: str) -> float | None:
    """`budget.<device>` of a speed section (the case yaml's `speed`, or one of its `speed.also`)."""
    return None if speed_cfg is None else OmegaConf.select(speed_cfg, f"budget.{device}")


def time_against(
    phase: str,
    candidate: str,
    budget: float | None,
    cfg: DictConfig,
    spec: RunSpec,
    *,
    baseline: str = "speed_baseline",
    inputs: Any = None,
    clear_by: float = 1.0,
) -> PhaseRecord:
    """Time `candidate` against `baseline` (harness.phases.speed._time_against). Grading, the timed outputs kept for the
    judge go to a folder of the phase's own; a record that does not hand it on (`checked_dir`: a timing that ended
    early, crashed or raised) leaves nothing of it behind. `clear_by` (a slow control's margin, harness/margins.py):
    an interval over the budget but below `clear_by` x the budget is measured on, while time allows, so that a
    control far over its line is not recorded as just past it because the timing stopped at the first decisive
    interval; it is still `over_budget` when time runs out."""
    graded = spec.graded and candidate == SPEED_CANDIDATE
    check_dir = Path(tempfile.mkdtemp(prefix="harness-checked-")) if graded else None
    handed_on = False
    try:
        record = _time_against(phase, candidate, budget, cfg, spec, baseline, inputs, graded, check_dir, clear_by)
        handed_on = "checked_dir" in record.figures
        return record
    finally:
        if check_dir is not None and not handed_on:
            shutil.rmtree(check_dir, ignore_errors=True)


@dataclass
class _Tally:
    """What the timing processes of one phase gathered, process after process."""

    processes: list[TimedProcess] = field(default_factory=list)
    checked: list[dict[str, Any]] = field(default_factory=list)  # the timed outputs kept for the judge (grading)
    held: dict[str, Any] = field(default_factory=dict)  # what confined children tried or left behind
    compiled: dict[str, list] = field(default_factory=dict)  # per process: compile time of each side, graphs compiled while timed
    changed: dict[str, list[str]] = field(default_factory=dict)  # what the submission's import, then its calls, changed in its process
    compiling_s: float = 0.0  # compiles before each process's clock: reported, and not taken from max_s (a cold one can outlast it)


def _time_against(
    phase: str,
    candidate: str,
    budget: float | None,
    cfg: DictConfig,
    spec: RunSpec,
    baseline: str,
    inputs: Any,
    graded: bool,
    check_dir: Path | None,
    clear_by: float,
) -> PhaseRecord:
    """Time `candidate` against `baseline` (case functions by name), one timing process after another.

    Each timing process serves `pairs` interleaved pairs on inputs of its own, timed by this process
    (harness/measure/clock.py); after each (from `min_processes` on; in a grade from `grade_decides_after`, since a
    case's own minimum may serve its slow controls' margins) the ratio's interval is compared with the
    budget: decisive, it stops; straddling it, another process runs, until `max_s` or `max_processes`,
    then the verdict is inconclusive. With no budget on this device, that first number is measured and reported.

    Timing a submitted fix (grading), a timing process is three children of the fork server, their blocks
    taken in turn: the submission's (confined, harness/process/confine.py), the model solution's (`fixed`), and a
    pristine copy of the model solution's; the last two never import the submitted file, so nothing it does
    to its own process reaches what it is compared with, and the baseline's time against its pristine copy's
    shows a leak. Each warms up on inputs from one private seed and is timed on inputs from another, made
    after the warm-up; the submission runs more pairs than a case's own timing, a number it cannot know;
    outputs of its timed calls picked at random go to the judge (figures["checked_outputs"], judged by
    harness/grading/judge.py); what the parent saw beside the samples (a clock that disagrees, CPU used beside or
    after the calls, a cache answering repeated inputs, a baseline slowed or disturbed) is a verdict of its
    own; and an interval that still straddles the budget after `grade_max_s` is `undecided`, a rejection.
    """
    timing = spec.speed
    first_verdict_after = timing.grade_decides_after if graded else timing.min_processes
    started = time.monotonic()
    tally = _Tally()
    while True:
        seeds = _private_seeds() if graded else None
        talk = _talk(spec, graded, _process_dir(check_dir, len(tally.processes)))
        results = _timing_process(talk, candidate, baseline, inputs, cfg, spec, seeds)
        result = results["candidate"]
        broken = _broken(phase, results)
        if broken is not None:
            return broken
        timed = result.talk
        _gather(tally, results, timed, seeds)
        if timed.disturbed:  # reniced, pinned: its samples are worth nothing, and the grade ends here
            return _disturbed(phase, timed.disturbed, result, tally, spec.device, started)
        if len(tally.processes) < first_verdict_after:
            continue
        estimate = estimate_ratio([p.samples for p in tally.processes], timing.level)
        out_of_time = _out_of_time(len(tally.processes), time.monotonic() - started - tally.compiling_s, timing, graded)
        verdict = _verdict(estimate, budget, clear_by, out_of_time, graded)
        if verdict is not None:
            break
    figures = _figures(estimate, budget, tally, result.value[0]["cpu_threads"], started)
    interval, message = _message(verdict, estimate, budget, spec.device, figures)
    ok = verdict.ok  # inconclusive (a case's own timing) is no failure, but reports show it apart
    if graded:
        verdict, ok, message = _graded_findings(verdict, ok, message, interval, figures, tally, check_dir, cfg, spec.device)
    return PhaseRecord(phase, verdict, ok, message, figures, round(time.monotonic() - started, 4), result.output)


def traced_every_call(figures: dict[str, Any], side: str = "baseline") -> tuple[int, int] | None:
    """(frames traced, calls) of `side` over a compiled timing's processes where dynamo traced at least one frame on
    every one of that side's calls in each process (its compiled code never settled: the time is the tracer's);
    None where it settled, or nothing was counted (eager)."""
    counted = [process[side] for process in figures.get("traced_while_timed", []) if side in (process or {})]
    if not counted or any(tally["calls"] == 0 or tally["traced"] < tally["calls"] for tally in counted):
        return None
    return sum(tally["traced"] for tally in counted), sum(tally["calls"] for tally in counted)


def retraced_note(figures: dict[str, Any]) -> str:
    """The message's note on a compiled baseline traced again on every call, or ''."""
    traced = traced_every_call(figures)
    if traced is None:
        return ""
    return (
        f"; compiled, the baseline was traced again on every call ({traced[0]} frames in its {traced[1]} calls after the compile): "
        "its time is mostly dynamo's, not its kernels'"
    )


def _out_of_time(processes: int, seconds: float, timing: SpeedSettings, graded: bool) -> bool:
    """Whether an interval still straddling the budget is the verdict now. A case's own timing stops at `max_s` or
    `max_processes`. A grade stops at `grade_max_s` only once `grade_min_processes` processes were measured: Student's
    t over a few process medians is wide on a noisy machine (a correct fix at 1.05x [0.93, 1.18] against 1.15x, 5
    processes of 13 s in 64 s on CI's 2 cores: a standard deviation of 9.5% between process ratios, where this quiet
    machine's three had 1.3%), and a case whose calls are long fits few; 3x `grade_max_s` bounds it."""
    if not graded:
        return processes >= timing.max_processes or seconds >= timing.max_s
    return seconds >= GRADE_HARD_LIMIT * timing.grade_max_s or (seconds >= timing.grade_max_s and processes >= timing.grade_min_processes)


def _process_dir(check_dir: Path | None, index: int) -> Path | None:
    """Where one timing process keeps the outputs it sends to the judge (grading only)."""
    if check_dir is None:
        return None
    process_dir = check_dir / str(index)
    process_dir.mkdir()
    return process_dir


def _timing_process(talk, candidate: str, baseline: str, inputs: Any, cfg: DictConfig, spec: RunSpec, seeds: dict[str, int] | None):
    """One timing process's children, each side's `ChildResult`: a grade's three (`seeds` drawn), or a case's own."""
    if seeds is not None:
        return graded_timing_process(talk, baseline, inputs, cfg, spec, seeds)
    if OmegaConf.select(cfg, "speed.apart"):
        return apart_timing_process(talk, candidate, baseline, inputs, cfg, spec)
    return shared_timing_process(talk, candidate, baseline, inputs, cfg, spec)


def _disturbed(phase: str, disturbed: str, result: ChildResult, tally: _Tally, device: str, started: float) -> PhaseRecord:
    figures = {"baseline_disturbed": disturbed, **containment(result), **tally.changed}
    message = baseline_anomaly(tally.processes, device)[1]
    return PhaseRecord(phase, Speed.BASELINE_DISTURBED, False, message, figures, round(time.monotonic() - started, 4), result.output)


def _private_seeds() -> dict[str, int]:
    return {"warmup": secrets.randbelow(1 << 31), "settle": secrets.randbelow(1 << 31), "timed": secrets.randbelow(1 << 31)}


def _talk(spec: RunSpec, graded: bool, check_dir: Path | None) -> Callable:
    """How the parent drives one timing process (harness/measure/clock.py); a grade's warm-up and pairs vary a little,
    numbers the submission cannot know, and its first call is never a timed one."""
    timing = spec.speed
    return functools.partial(
        drive,
        device=spec.device,
        warmup=max(timing.warmup, 1) + secrets.randbelow(2) if graded else timing.warmup,
        pairs=max(timing.pairs, GRADED_PAIRS) + secrets.randbelow(3) if graded else timing.pairs,
        min_s=timing.process_s,
        fresh_inputs=graded,
        check_dir=check_dir,
        max_retakes=timing.max_retakes,
    )


def _broken(phase: str, results: dict[str, ChildResult]) -> PhaseRecord | None:
    """The record of a timing process that gave no samples: the candidate's child crashed, raised or stopped
    answering, or one of the model solution's own children failed (then the failure is the case's)."""
    result = results["candidate"]
    if result.status != "returned":
        return abnormal(phase, result)
    failure = result.value[1]
    if failure is not None:
        return record_of(phase, Speed.RAISED, False, failure.headline, result)
    for side in ("baseline", "pristine"):
        if side in results and (results[side].status != "returned" or results[side].value[1] is not None):
            broke = results[side]
            said = broke.summary if broke.status != "returned" else f"raised {broke.value[1].headline}"
            return record_of(phase, Speed.ERROR, False, f"the model solution's timing child ({side}) {said}", broke)
    if result.talk is None:
        return record_of(phase, Speed.CRASHED, False, "the timing child stopped answering the parent's requests", result)
    return None


def _gather(tally: _Tally, results: dict[str, ChildResult], timed: TimedProcess, seeds: dict[str, int] | None) -> None:
    """One timing process's figures added to the tally."""
    value = results["candidate"].value[0]
    for told in [value] + [results[side].value[0] for side in ("baseline",) if side in results]:
        for key in ("compile_s", "recompiled_on_new_inputs", "recompiled_while_timed", "traced_while_timed"):
            if key in told:
                tally.compiled.setdefault(key, []).append(told[key])
    children = {id(child): child for child in results.values()}.values()  # one child may serve several sides
    tally.compiling_s += sum(sum(child.value[0].get("compile_s", {}).values()) for child in children)
    for key in ("changed_on_import", "changed_by_its_calls"):
        for line in value.get(key, []):
            if line not in tally.changed.setdefault(key, []):
                tally.changed[key].append(line)
    tally.processes.append(timed)
    if timed.disturbed:
        return
    for key, said in containment(results["candidate"]).items():
        tally.held[key] = tally.held.get(key, []) + said if isinstance(said, list) else said
    tally.checked += [
        {"process": len(tally.processes) - 1, "block": index, "seed": seeds["timed"], "path": block.checked, "step": block.checked_step}
        for index, block in enumerate(timed.blocks)
        if block.checked
    ]


def _verdict(estimate: RatioEstimate, budget: float | None, clear_by: float, out_of_time: bool, graded: bool) -> Speed | None:
    """The verdict on the interval so far, or None to measure on: an interval over the budget but not yet past it
    by `clear_by` is measured on while time allows; one straddling it at the end is inconclusive (undecided, graded)."""
    verdict = judge(estimate, budget) if budget is not None else Speed.MEASURED
    if verdict == Speed.OVER_BUDGET and estimate.ratio_low < clear_by * budget:
        verdict = None
    if verdict is None and out_of_time:
        verdict = judge(estimate, budget) or (Speed.UNDECIDED if graded else Speed.INCONCLUSIVE)
    return verdict


def _figures(estimate: RatioEstimate, budget: float | None, tally: _Tally, cpu_threads: Any, started: float) -> dict[str, Any]:
    samples = tally.processes[-1].samples
    figures = {**estimate.figures(), "budget": budget, "calls_per_sample": samples.calls_per_sample, "cpu_threads": cpu_threads}
    figures["retaken_pairs"] = sum(p.samples.retaken for p in tally.processes)
    figures.update(tally.compiled)
    figures["seconds"] = round(time.monotonic() - started, 2)
    figures.update(clock_figures(tally.processes))
    return figures


def _message(verdict: Speed, estimate: RatioEstimate, budget: float | None, device: str, figures: dict[str, Any]) -> tuple[str, str]:
    """The interval in words, and the verdict's message (with a compiled baseline that never settled, a note of it)."""
    seconds = figures["seconds"]
    interval = f"{estimate.ratio:.3f}x [{estimate.ratio_low:.3f}, {estimate.ratio_high:.3f}] ({estimate.level:.0%}, {estimate.samples} pairs in {estimate.processes} processes)"
    times = f"{estimate.candidate_s * 1e3:.3f} ms vs {estimate.baseline_s * 1e3:.3f} ms"
    message = {
        Speed.MEASURED: f"{interval}, {times}; no budget on {device}",
        Speed.WITHIN_BUDGET: f"{interval}, {times}; within budget {budget}x",
        Speed.OVER_BUDGET: f"{interval}, {times}; over budget {budget}x",
        Speed.INCONCLUSIVE: f"{interval}, {times}; the interval still straddles the budget {budget}x after {seconds} s",
        Speed.UNDECIDED: (
            f"{interval}, {times}; the interval still straddles the budget {budget}x after {seconds} s: the grader could not tell, "
            "and a grade must be decisive; grade it again on a quieter machine, or give it longer (speed.grade_max_s)"
        ),
    }[verdict]
    return interval, message + retraced_note(figures)


def _graded_findings(
    verdict: Speed,
    ok: bool,
    message: str,
    interval: str,
    figures: dict[str, Any],
    tally: _Tally,
    check_dir: Path | None,
    cfg: DictConfig,
    device: str,
) -> tuple[Speed, bool, str]:
    """A grade's figures (the outputs kept for the judge, what its children tried), and what the parent saw beside
    the samples, which overrides the interval's verdict."""
    figures.update(
        checked_outputs=tally.checked,
        checked_dir=str(check_dir),
        timed_blocks=sum(1 for p in tally.processes for b in p.blocks if b.side == "candidate"),
    )
    figures.update(tally.held)
    figures.update(tally.changed)
    # A case whose calls advance the state in their inputs (`carries_state`) never times the same inputs twice: a slow
    # first call on fresh inputs is work done once per inputs (recompile_limit compiles the new session's block, and a
    # correct fix may pay more there than the model), not a cache; a cache answering anyway answers stale (the judge sees).
    seen = anomaly(tally.processes, device, inputs_repeat=not getattr(load_case(cfg.name), "carries_state", False))
    if seen is not None:
        verdict, ok, message = seen[0], False, f"{seen[1]} ({interval})"
    lines = tally.changed.get("changed_on_import", []) + tally.changed.get("changed_by_its_calls", [])
    if lines:
        message += (
            f"; in its own process it changed {'; '.join(lines[:8])}"
            + (f" and {len(lines) - 8} more" if len(lines) > 8 else "")
            + " (the model solution, timed apart, was not affected)"
        )
    return verdict, ok, message
