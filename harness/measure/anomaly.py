"""What the parent saw beside the samples while it timed (harness/measure/clock.py), judged: a clock that
disagrees with the parent's, more than one core at work, work that escaped the clock, a baseline reached
from outside, a cache that answered repeated inputs.
"""

from __future__ import annotations

import math
from typing import Any

from harness.measure.clock import TimedProcess
from harness.measure.timing import PairedSamples, estimate_ratio
from harness.statuses import Speed

CLOCK_SLACK_S = 0.002  # per block: the pipe's round trip and a wake-up on a loaded machine
CLOCK_AGREEMENT = 0.9  # the child's clock must account for this share of the parent's, for the candidate's blocks
# (on CPU, of the time the child was on a CPU within each block: a loaded machine keeps a child waiting between
# the request and its own clock's start, and that wait is the parent's alone; a patched clock shows on a quiet one)
EXTRA_CORES = 1.25  # CPU time / wall time of a block past which more than one core worked (CPU timing is single-threaded)
OUTSIDE_SHARE = 0.1  # CPU while the clock was stopped, as a share of the candidate's timed time, past which work escaped it
OUTSIDE_FLOOR_S = 0.02
MODEL_MARGIN = 1.5  # a submission may work beside its calls as much as the model solution did in the same grade, times this
BASELINE_SLOWER = 1.25  # the baseline's time over its pristine copy's, beyond which (the interval's lower end) something reached it
STARVED_SHARE = 0.6  # the baseline's CPU share of its blocks' time, over the candidate's, below which it was kept off the CPU
REPEAT_GAIN = 2.0  # first timed candidate block / later ones, over the baseline's same ratio, past which a cache answered
# (1.7 was seen once from an honest fix; a cache that computes at most twice as long as it answers evades this, and gains less than 2x)


def clock_figures(processes: list[TimedProcess]) -> dict[str, Any]:
    """What the parent measured beside the samples, per timing process, for the record."""
    figures: dict[str, Any] = {"clock": "parent (each block timed from request to answer; the child's own clock cross-checked)"}
    for side in ("candidate", "baseline"):
        blocks = [b for p in processes for b in p.blocks if b.side == side]
        figures[f"{side}_parent_s"] = round(sum(b.parent_s for b in blocks), 6)
        figures[f"{side}_child_s"] = round(sum(b.child_s for b in blocks), 6)
        figures[f"{side}_cpu_s"] = round(sum(b.cpu_s for b in blocks), 6)
    figures["outside_cpu_s"] = round(sum(p.outside_cpu_s for p in processes), 6)
    figures.update(
        baseline_outside_cpu_s=round(sum(p.model_outside_cpu_s for p in processes), 6), baseline_cores=round(_model_cores(processes), 3)
    )
    gains = [g for g in (_repeat_gain(p) for p in processes) if g is not None]
    if gains:
        figures["repeat_gain"] = round(_geometric_mean(gains), 4)
    if all(p.samples.others.get("pristine") for p in processes) and processes:
        figures["baseline_vs_pristine"] = _baseline_vs_pristine(processes)
        figures["cpu_share"] = {side: round(_cpu_share(processes, side), 3) for side in ("candidate", "baseline", "pristine")}
    return figures


def _baseline_vs_pristine(processes: list[TimedProcess]) -> dict[str, Any]:
    """The baseline's time over its pristine copy's (children alike, timed in turn in the same processes)."""
    estimate = estimate_ratio([PairedSamples(p.samples.baseline_s, p.samples.others["pristine"], 1) for p in processes], 0.95)
    return {
        "ratio": round(estimate.ratio, 4),
        "ratio_low": round(estimate.ratio_low, 4),
        "ratio_high": round(estimate.ratio_high, 4),
        "pristine_s": estimate.baseline_s,
    }


def _cpu_share(processes: list[TimedProcess], side: str) -> float:
    shares = sorted(b.cpu_s / b.parent_s for p in processes for b in p.blocks if b.side == side and b.parent_s > 0)
    return shares[len(shares) // 2] if shares else 1.0


def anomaly(processes: list[TimedProcess], device: str, inputs_repeat: bool = True) -> tuple[Speed, str] | None:
    """(status, message) for the first thing the parent saw that the samples alone would hide, or None; no cache check unless inputs_repeat."""
    for process in processes:
        for b in process.blocks:
            if b.child_s > b.parent_s + CLOCK_SLACK_S:
                return (
                    Speed.CLOCK_TAMPERED,
                    f"the child's clock read {b.child_s * 1e3:.2f} ms for a {b.side} block the parent timed at {b.parent_s * 1e3:.2f} ms: its clock runs ahead",
                )
    candidate = [b for p in processes for b in p.blocks if b.side == "candidate"]
    parent_s, child_s = sum(b.parent_s for b in candidate), sum(b.child_s for b in candidate)
    on_cpu_s = sum(min(b.parent_s, b.cpu_s) for b in candidate) if device == "cpu" else parent_s
    if child_s < CLOCK_AGREEMENT * on_cpu_s - CLOCK_SLACK_S * len(candidate):
        return Speed.CLOCK_TAMPERED, (
            f"the child's clock saw {child_s * 1e3:.1f} ms of the candidate's calls, the parent's {parent_s * 1e3:.1f} ms, "
            f"of which the child was on a CPU {on_cpu_s * 1e3:.1f} ms ({child_s / on_cpu_s:.0%} of that): something in the graded process "
            "changed its clock; the parent's figures decided"
        )
    if device != "cpu":
        return None
    model_cores = _model_cores(processes)
    cores = MODEL_MARGIN * model_cores if model_cores > EXTRA_CORES else EXTRA_CORES  # only where the model itself is past the line
    for b in candidate:
        if b.cpu_s > cores * b.parent_s + CLOCK_SLACK_S:
            allowed = (
                f"the model solution's own blocks used at most {model_cores:.2f} cores"
                if model_cores > EXTRA_CORES
                else "CPU timing is single-threaded"
            )
            return Speed.WORK_BESIDE_THE_CLOCK, (
                f"a candidate block used {b.cpu_s * 1e3:.1f} ms of CPU in {b.parent_s * 1e3:.1f} ms ({b.cpu_s / b.parent_s:.2f} cores), "
                f"while {allowed} (a thread or a process of the submission ran beside the timed call)"
            )
    outside = sum(p.outside_cpu_s for p in processes)
    model_deferred_s = MODEL_MARGIN * _model_outside_per_call(processes) * sum(b.calls for b in candidate)
    if outside > OUTSIDE_FLOOR_S + OUTSIDE_SHARE * parent_s + model_deferred_s:
        beside = f", and the model solution's own deferred work allows {model_deferred_s * 1e3:.0f} ms" if model_deferred_s else ""
        return Speed.WORK_BESIDE_THE_CLOCK, (
            f"the graded process used {outside * 1e3:.0f} ms of CPU while the clock was stopped, against {parent_s * 1e3:.0f} ms "
            f"of timed candidate calls{beside}: work deferred past the end of a call (a thread, a signal handler, a process) escapes the clock"
        )
    gains = [g for g in (_repeat_gain(p) for p in processes) if g is not None]
    if inputs_repeat and len(gains) >= 2 and min(gains) > REPEAT_GAIN:  # a cache shows in every process; noise, in one
        return Speed.FASTER_ON_REPEATED_INPUTS, (
            f"in every timing process its first timed call on new inputs took at least {min(gains):.1f}x as long as its later calls on the same inputs, "
            "relative to the model solution's: it answers repeated inputs from a cache (keyed on identity or content), not by computing"
        )
    return baseline_anomaly(processes, device)


def baseline_anomaly(processes: list[TimedProcess], device: str) -> tuple[Speed, str] | None:
    """Grading only (the baseline in children of its own, beside a pristine copy): the model solution reached from outside."""
    disturbed = next((p.disturbed for p in processes if p.disturbed), None)
    if not disturbed and (not processes or not all(p.samples.others.get("pristine") for p in processes)):
        return None
    if disturbed:
        return (
            Speed.BASELINE_DISTURBED,
            f"{disturbed}: another process of the user changed it (the submission's is the only one running code nobody reviewed)",
        )
    if device == "cpu":
        candidate, baseline = _cpu_share(processes, "candidate"), _cpu_share(processes, "baseline")
        if baseline < STARVED_SHARE * candidate:
            return Speed.BASELINE_DISTURBED, (
                f"the model solution's child was on a CPU for {baseline:.0%} of its blocks' time, the submission's for {candidate:.0%}: "
                "it was kept off the CPU (stopped, or crowded out) while it was timed"
            )
    slower = _baseline_vs_pristine(processes)
    if slower["ratio_low"] > BASELINE_SLOWER:
        return Speed.BASELINE_SLOWED, (
            f"the model solution took {slower['ratio']:.2f}x [{slower['ratio_low']:.2f}, {slower['ratio_high']:.2f}] the time of a pristine copy of itself "
            "timed in turn with it: something reached the baseline, so the ratio is not trusted"
        )
    return None


def _model_cores(processes: list[TimedProcess]) -> float:
    """The most cores a timed block of the model solution kept busy (a DataLoader's workers), where it has children of its own (grading)."""
    shares = [b.cpu_s / b.parent_s for p in processes for b in p.blocks if b.side in ("baseline", "pristine") and b.parent_s > 0]
    return max(shares, default=0.0) if processes and all(p.samples.others.get("pristine") for p in processes) else 0.0


def _model_outside_per_call(processes: list[TimedProcess]) -> float:
    """The model solution's CPU while its child should idle (a DataLoader's prefetch) per call; 0 where it is not past the line itself."""
    blocks = [b for p in processes for b in p.blocks if b.side == "baseline"]
    outside, calls = sum(p.model_outside_cpu_s for p in processes), sum(b.calls for b in blocks)
    return outside / calls if calls and outside > OUTSIDE_FLOOR_S + OUTSIDE_SHARE * sum(b.parent_s for b in blocks) else 0.0


def _repeat_gain(process: TimedProcess) -> float | None:
    """(candidate's first timed block / the median of its later ones) / (the same for the baseline)."""
    sides = {side: [b.parent_s / b.calls for b in process.blocks if b.side == side] for side in ("candidate", "baseline")}
    if any(len(times) < 3 for times in sides.values()):
        return None
    ratio = {side: times[0] / sorted(times[1:])[len(times[1:]) // 2] for side, times in sides.items()}
    return ratio["candidate"] / ratio["baseline"]


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
