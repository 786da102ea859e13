"""The memory phase's verdict: a fix's memory per step (harness/measure/footprint.py) against its baseline's and
the case's budget, growth judged in whichever series the fix outgrows its baseline most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.measure.footprint import Slope, StepMemory
from harness.statuses import Memory

MIN_UNIT = 1 << 20  # the least a growth or peak budget is a fraction of: below it a step's memory is the interpreter's
# and the allocator's own (resident pages move 4 KiB at a time, Python's object arenas 256 KiB-1 MiB); a tiny RNN step peaked at 40 KiB


@dataclass(frozen=True)
class MemoryVerdict:
    status: Memory  # within_budget | over_budget | inconclusive | measured ("" while judged)
    excess: Slope  # the fix's growth per step beyond the baseline's, in the series where it is largest
    series: str
    unit: int  # bytes the fractions are of: the baseline's highest peak, at least MIN_UNIT
    peak_ratio: float  # the fix's highest peak / unit
    reasons: tuple[str, ...]

    @property
    def growth_fraction(self) -> float:
        return self.excess.per_step / self.unit

    @property
    def growth_fraction_low(self) -> float:
        return self.excess.low / self.unit

    @property
    def growth_fraction_high(self) -> float:
        return self.excess.high / self.unit

    def figures(self) -> dict[str, Any]:
        return {
            "excess_growth": self.excess.per_step,
            "excess_growth_low": self.excess.low,
            "excess_growth_high": self.excess.high,
            "excess_series": self.series,
            "unit": self.unit,
            "growth_fraction": self.growth_fraction,
            "growth_fraction_low": self.growth_fraction_low,
            "growth_fraction_high": self.growth_fraction_high,
            "peak_ratio": self.peak_ratio,
        }


def excess_growth(fix: StepMemory, baseline: StepMemory) -> tuple[str, Slope]:
    """The fix's slope minus the baseline's, per series both have, with the two intervals' half-widths combined
    (independent runs: root of the sum of squares); the series where the excess's upper bound is largest."""
    found = {}
    for name in fix.fits.keys() & baseline.fits.keys():
        mine, theirs = fix.fits[name], baseline.fits[name]
        half = math.hypot(mine.high - mine.per_step, theirs.high - theirs.per_step)
        centre = mine.per_step - theirs.per_step
        found[name] = Slope(centre, centre - half, centre + half, mine.level)
    name = max(found, key=lambda key: (found[key].high, key == "malloc"))
    return name, found[name]


def judge_memory(fix: StepMemory, baseline: StepMemory, budget: dict[str, float] | None) -> MemoryVerdict:
    """The fix against the baseline and a budget {growth, peak} (either may be absent).

    growth: the fix's retained growth per step beyond the baseline's (a log both keep is no leak of the fix), as
    a fraction of the unit (the baseline's highest peak, at least MIN_UNIT); peak: the fix's highest peak over
    the unit. within_budget when every bound is within, over_budget when one is surely over, inconclusive while
    the growth's interval straddles its budget."""
    unit = max(baseline.max_peak, MIN_UNIT)
    series, excess = excess_growth(fix, baseline)
    peak_ratio = max(fix.max_peak, 0) / unit
    if not budget:
        return MemoryVerdict(Memory.MEASURED, excess, series, unit, peak_ratio, ())
    verdict = MemoryVerdict("", excess, series, unit, peak_ratio, ())
    low, centre, high = verdict.growth_fraction_low, verdict.growth_fraction, verdict.growth_fraction_high
    over, undecided = [], []
    if budget.get("growth") is not None:
        said = f"grows {_bytes(excess.per_step)}/step [{_bytes(excess.low)}, {_bytes(excess.high)}] beyond the baseline ({series}), {centre:.3f} [{low:.3f}, {high:.3f}] of {_bytes(unit)}"
        if low > budget["growth"]:
            over.append(f"{said} > {budget['growth']}")
        elif high > budget["growth"]:
            undecided.append(f"{said} straddles {budget['growth']}")
    if budget.get("peak") is not None and peak_ratio > budget["peak"]:
        over.append(
            f"peak {_bytes(fix.max_peak)} is {peak_ratio:.2f}x {_bytes(unit)} (the baseline's {_bytes(baseline.max_peak)}) > {budget['peak']}x"
        )
    status = Memory.OVER_BUDGET if over else Memory.INCONCLUSIVE if undecided else Memory.WITHIN_BUDGET
    return MemoryVerdict(status, excess, series, unit, peak_ratio, tuple(over + undecided))


def describe(fix: StepMemory, baseline: StepMemory) -> str:
    g = fix.growth
    return (
        f"retained {_bytes(g.per_step)}/step [{_bytes(g.low)}, {_bytes(g.high)}] ({g.level:.0%}, {len(fix.retained)} steps, {fix.growth_series}), "
        f"peak {_bytes(fix.max_peak)}; baseline {_bytes(baseline.growth.per_step)}/step, peak {_bytes(baseline.max_peak)}"
    )


def _bytes(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"
