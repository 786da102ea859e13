"""Time a candidate against a baseline on one device, interleaved, median of repeats."""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any, Callable

import torch

MIN_SAMPLE_S = 0.02  # a sample loops the function until it lasts at least this long


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


def time_pair(
    candidate: Callable[[Any], Any],
    baseline: Callable[[Any], Any],
    inputs: Any,
    *,
    device: str,
    warmup: int,
    repeats: int,
) -> dict[str, float]:
    """Median seconds per call of each, and the median of the paired ratios (candidate / baseline).

    Each repeat times the candidate and the baseline back to back, alternating
    which goes first, and the ratio is taken within the pair: load from other
    processes, clock drift and cache state fall on both sides of each ratio. On
    CUDA each sample is bounded by events and synchronised; on CPU by `perf_counter`.
    """
    for _ in range(warmup):
        candidate(inputs)
        baseline(inputs)
    synchronize(device)
    calls = max(1, _calls_per_sample(baseline, inputs, device))
    candidate_s: list[float] = []
    baseline_s: list[float] = []
    for repeat in range(repeats):
        order = [(candidate, candidate_s), (baseline, baseline_s)]
        for function, samples in order if repeat % 2 == 0 else reversed(order):
            samples.append(_sample(function, inputs, device, calls))
    return {
        "candidate_s": statistics.median(candidate_s),
        "baseline_s": statistics.median(baseline_s),
        "ratio": statistics.median(c / b for c, b in zip(candidate_s, baseline_s)),
        "calls_per_sample": calls,
        "repeats": repeats,
    }


def _calls_per_sample(function: Callable[[Any], Any], inputs: Any, device: str) -> int:
    one_call_s = _sample(function, inputs, device, 1)
    return int(MIN_SAMPLE_S / one_call_s) + 1 if one_call_s > 0 else 1


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
