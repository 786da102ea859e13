import torch

from harness.timing import time_pair


def test_time_pair_reports_medians_and_the_paired_ratio():
    x = torch.randn(64, 64)
    figures = time_pair(lambda t: t @ t, lambda t: t + t, x, device="cpu", warmup=1, repeats=3)
    assert figures["candidate_s"] > 0 and figures["baseline_s"] > 0 and figures["ratio"] > 0
    assert figures["repeats"] == 3 and figures["calls_per_sample"] >= 1


def test_the_cpu_allocator_is_pinned_for_timing_in_a_child():
    from harness.isolate import run_isolated
    from harness.timing import steady_cpu_allocator

    result = run_isolated(steady_cpu_allocator, timeout_s=60)  # in a child: the test process keeps its allocator
    assert result.status == "returned" and result.value is True  # glibc here; False elsewhere, and timing goes on
