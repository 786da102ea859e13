import torch

from harness.timing import time_pair


def test_time_pair_reports_medians_and_the_paired_ratio():
    x = torch.randn(64, 64)
    figures = time_pair(lambda t: t @ t, lambda t: t + t, x, device="cpu", warmup=1, repeats=3)
    assert figures["candidate_s"] > 0 and figures["baseline_s"] > 0 and figures["ratio"] > 0
    assert figures["repeats"] == 3 and figures["calls_per_sample"] >= 1
