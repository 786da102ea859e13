"""Time a candidate against a baseline on one device, interleaved, median of repeats."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

MIN_SAMPLE_S = 0.02  # a sample loops the function until it lasts at least this long


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
    """Median seconds per call of each, and their ratio (candidate / baseline).

    Candidate and baseline alternate which runs first in each repeat, so drift
    in clock speed or cache state falls on both. On CUDA each sample is bounded
    by events and synchronised; on CPU by `perf_counter`.
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
    candidate_median = statistics.median(candidate_s)
    baseline_median = statistics.median(baseline_s)
    return {
        "candidate_s": candidate_median,
        "baseline_s": baseline_median,
        "ratio": candidate_median / baseline_median,
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
