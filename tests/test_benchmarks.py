"""Benchmarks (pytest-benchmark). Goals are ratios measured in one run, never absolute times."""

import statistics
import subprocess
import sys
import time

from harness.process.isolate import run_isolated

ISOLATION_GOAL = 20  # an isolated phase must cost at least 20x less than a fresh interpreter importing torch


def _nothing():
    return None


def test_isolated_phase_overhead_against_a_fresh_interpreter(benchmark):
    fresh_starts = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        fresh_starts.append(time.perf_counter() - started)
    result = benchmark.pedantic(run_isolated, args=(_nothing,), kwargs={"timeout_s": 30}, rounds=30, iterations=1, warmup_rounds=2)
    assert result.status == "returned"
    isolated_s = benchmark.stats.stats.median if benchmark.stats else run_isolated(_nothing, timeout_s=30).seconds
    ratio = statistics.median(fresh_starts) / isolated_s
    benchmark.extra_info.update(fresh_interpreter_s=statistics.median(fresh_starts), isolated_phase_s=isolated_s, ratio=ratio)
    print(
        f"\nisolated phase {isolated_s * 1e3:.1f} ms vs fresh interpreter {statistics.median(fresh_starts):.2f} s: {ratio:.0f}x (goal {ISOLATION_GOAL}x)"
    )
    assert ratio >= ISOLATION_GOAL
