"""Time a candidate against a baseline, and estimate their ratio with a confidence interval.

One process takes interleaved pairs of samples (`paired_samples`); the speed phase runs several
such processes, because a process's memory layout and allocator state can bias all of its pairs
the same way. `estimate_ratio` pools them: each process contributes the median of its paired
log-ratios, and the interval is Student's t over those per-process medians, so the spread between
processes, not only within one, sets its width.
"""

from __future__ import annotations

import ctypes
import gc
import math
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from harness.statuses import Speed

MIN_SAMPLE_S = 0.02  # a sample loops the function until it lasts at least this long
FRESH_PAGES_PER_S = 12_800  # minor page faults per second of a CPU sample (256 in a 20 ms one): the heap grew during it.
# A fault cost 3.5 us on the 2-core machine: at this rate, 4.5% of the sample's time
MAX_RETAKES = 8  # pairs retaken per process; past that, fresh pages are taken as part of the functions' cost
METHOD = "Student t over per-process medians of paired log-ratios"


def steady_cpu_allocator() -> bool:
    """Pin glibc's allocator for CPU timing: large blocks from the heap, freed memory kept.

    By default glibc's mmap threshold moves with the process's history, so whether each call's
    large output lands on fresh pages (a page fault per 4 KiB) differs from one process to the next
    and can fall on either side of a comparison: ratios of the same code swung from 1.03x to 1.23x.
    Pinned, both sides allocate as before but neither pays for fresh pages. False where this is not
    glibc. Call it in the timing process only, before timing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class PairedSamples:
    """One process's samples: seconds per call, candidate and baseline taken back to back."""

    candidate_s: list[float]
    baseline_s: list[float]
    calls_per_sample: int
    retaken: int = 0  # pairs taken again because the heap grew during one of their samples
    others: dict[str, list[float]] = field(default_factory=dict)  # sides timed beside each pair (the grader's pristine baseline)

    @property
    def log_ratios(self) -> list[float]:
        return [math.log(c / b) for c, b in zip(self.candidate_s, self.baseline_s)]


@dataclass(frozen=True)
class RatioEstimate:
    ratio: float  # candidate / baseline: the geometric mean over processes of each one's median paired ratio
    ratio_low: float
    ratio_high: float
    level: float
    samples: int  # pairs over all processes
    processes: int
    candidate_s: float  # median seconds per call, all processes pooled
    baseline_s: float
    process_ratios: tuple[float, ...]  # each process's median paired ratio

    def figures(self) -> dict[str, Any]:
        return {
            "ratio": self.ratio,
            "ratio_low": self.ratio_low,
            "ratio_high": self.ratio_high,
            "level": self.level,
            "method": METHOD,
            "samples": self.samples,
            "processes": self.processes,
            "candidate_s": self.candidate_s,
            "baseline_s": self.baseline_s,
            "process_ratios": [round(r, 4) for r in self.process_ratios],
        }


Block = Callable[[str, int, bool], tuple[float, int]]  # (side, calls, timed) -> (seconds per call, minor faults)


def paired_samples(
    candidate: Callable[[Any], Any],
    baseline: Callable[[Any], Any],
    inputs: Any,
    *,
    device: str,
    warmup: int,
    pairs: int,
    min_s: float = 0.0,
    max_retakes: int = MAX_RETAKES,
) -> PairedSamples:
    """`sample_pairs` in this process, timed by `perf_counter` (CUDA: events); the speed phase times its
    children from the parent instead (harness/measure/clock.py)."""
    functions = {"candidate": candidate, "baseline": baseline}

    def block(side: str, calls: int, timed: bool) -> tuple[float, int]:
        faults = _minor_faults()
        seconds = _sample(functions[side], inputs, device, calls)
        return seconds, _minor_faults() - faults

    collecting = gc.isenabled()
    gc.disable()  # as timeit does: a full collection lands on whichever sample happens to trigger it
    try:
        return sample_pairs(block, device=device, warmup=warmup, pairs=pairs, min_s=min_s, max_retakes=max_retakes)
    finally:
        if collecting:
            gc.enable()


def sample_pairs(
    block: Block,
    *,
    device: str,
    warmup: int,
    pairs: int,
    min_s: float = 0.0,
    before_timing: Callable[[], None] | None = None,
    others: tuple[str, ...] = (),
    max_retakes: int = MAX_RETAKES,
) -> PairedSamples:
    """At least `pairs` samples of each side, back to back, alternating which goes first, and more until
    the samples have taken `min_s` seconds. `block(side, calls, timed)` runs `calls` calls of one side and
    says how long each took and how many minor page faults the block caused. `others`: more sides sampled
    with each pair, the order of all of them rotated from one pair to the next (the grader times a pristine
    copy of the baseline so, harness/phases/).

    Load from other processes, clock drift and cache state fall on both sides of each pair. A sample is
    as many calls as last MIN_SAMPLE_S, counted by calling the baseline that long (one call's time alone
    swung 5x). `before_timing` runs after the warm-up and the count (the grader makes fresh inputs there).

    On CPU a pair is taken again (up to `max_retakes` times, MAX_RETAKES unless the case says otherwise: 0 where
    fresh pages are the cost being timed, a compile at every call) when one of its samples faulted in fresh
    pages, more than FRESH_PAGES_PER_S for its length: the same share of any sample's time, 256 pages
    in 20 ms, 1,472 in 115 ms. With the allocator pinned (`steady_cpu_allocator`) a call reuses freed
    heap memory, but now and then glibc splits a large free block for a small request, and the next
    large request grows the heap instead: a sample that touches 150 MB of fresh pages takes twice as
    long, on whichever side it falls. Such samples made up a third of class_weight_index's pairs here.

    The garbage collector should be off while sampling, as in `timeit`: with mmseg, hydra and torch
    loaded, a full collection took 0.17-0.20 s and tripled the sample it fell in.
    """
    sides = ("candidate", "baseline", *others)
    for _ in range(warmup):
        for side in sides:
            block(side, 1, False)
    calls, counted_s = 0, 0.0
    while counted_s < MIN_SAMPLE_S:
        counted_s += block("baseline", 1, False)[0]
        calls += 1
    if before_timing is not None:
        before_timing()
    taken_s: dict[str, list[float]] = {side: [] for side in sides}
    retaken = 0
    while len(taken_s["candidate"]) < pairs or sum(taken_s["candidate"]) + sum(taken_s["baseline"]) < min_s / calls:
        turn = len(taken_s["candidate"]) % len(sides)
        order = sides[turn:] + sides[:turn] if others else sides[:: 1 if turn == 0 else -1]
        taken = {side: block(side, calls, True) for side in order}
        fresh = any(faults > FRESH_PAGES_PER_S * seconds * calls for seconds, faults in taken.values())
        if device == "cpu" and fresh and retaken < max_retakes:
            retaken += 1
            continue
        for side in sides:
            taken_s[side].append(taken[side][0])
    return PairedSamples(taken_s["candidate"], taken_s["baseline"], calls, retaken, {side: taken_s[side] for side in others})


def estimate_ratio(processes: list[PairedSamples], level: float) -> RatioEstimate:
    """The ratio and its `level` confidence interval; a single process gives an interval of (0, inf)."""
    medians = [statistics.median(p.log_ratios) for p in processes]
    centre = statistics.fmean(medians)
    if len(medians) > 1:
        half_width = student_t_quantile(0.5 + level / 2, len(medians) - 1) * statistics.stdev(medians) / math.sqrt(len(medians))
        low, high = math.exp(centre - half_width), math.exp(centre + half_width)
    else:
        low, high = 0.0, math.inf
    return RatioEstimate(
        ratio=math.exp(centre),
        ratio_low=low,
        ratio_high=high,
        level=level,
        samples=sum(len(p.candidate_s) for p in processes),
        processes=len(processes),
        candidate_s=statistics.median(s for p in processes for s in p.candidate_s),
        baseline_s=statistics.median(s for p in processes for s in p.baseline_s),
        process_ratios=tuple(math.exp(m) for m in medians),
    )


def judge(estimate: RatioEstimate, budget: float) -> Speed | None:
    """within_budget or over_budget once the interval is on one side of the budget; None while it straddles it."""
    if estimate.ratio_high <= budget:
        return Speed.WITHIN_BUDGET
    if estimate.ratio_low > budget:
        return Speed.OVER_BUDGET
    return None


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (bisection on its CDF)."""
    low, high = -1e3, 1e3
    for _ in range(200):
        middle = (low + high) / 2
        if _student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _student_t_cdf(t: float, df: int) -> float:
    tail = 0.5 * _regularized_incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


def _regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) by its continued fraction (Lentz's method), as in Numerical Recipes' betai."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)
    if x > (a + 1) / (a + b + 2):
        return 1 - _regularized_incomplete_beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _sample(function: Callable[[Any], Any], inputs: Any, device: str, calls: int) -> float:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            function(inputs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / calls
    started = time.perf_counter()
    for _ in range(calls):
        function(inputs)
    return (time.perf_counter() - started) / calls
