"""The speed verdict's statistics: paired samples, the interval over processes, the verdict against a budget."""

import gc
import math
import mmap
import random
import time

import pytest
import torch
from omegaconf import OmegaConf

from harness.measure.timing import MAX_RETAKES, MIN_SAMPLE_S, PairedSamples, estimate_ratio, judge, paired_samples, student_t_quantile
from harness.phases import speed_config


def test_paired_samples_alternate_and_keep_sampling_until_the_time_is_spent():
    x = torch.randn(64, 64)
    samples = paired_samples(lambda t: t @ t, lambda t: t + t, x, device="cpu", warmup=1, pairs=3, min_s=0.05)
    assert len(samples.candidate_s) == len(samples.baseline_s) >= 3
    assert (sum(samples.candidate_s) + sum(samples.baseline_s)) * samples.calls_per_sample >= 0.05
    assert all(s > 0 for s in samples.candidate_s + samples.baseline_s) and samples.calls_per_sample >= 1


def _touching_fresh_pages(on_calls, mib=4, lasting_s=0.0):
    """A function that, on the calls numbered in `on_calls` (from 1), writes `mib` MiB of memory it keeps: fresh pages."""
    kept, calls = [], [0]

    def function(_):
        calls[0] += 1
        if calls[0] in on_calls:
            block = mmap.mmap(-1, mib << 20)  # anonymous pages of its own: fresh, whatever the heap already holds
            block.write(b"x" * (mib << 20))
            kept.append(block)
        time.sleep(lasting_s)

    return function


def _a_sample_long():
    return lambda _: time.sleep(MIN_SAMPLE_S)  # the baseline sets the calls per sample: one


def test_a_pair_whose_sample_took_fresh_pages_is_taken_again():
    # call 1 is the warm-up; calls 2 and 3 fall in the first pair, taken, then retaken once
    samples = paired_samples(_touching_fresh_pages({2, 3}), _a_sample_long(), None, device="cpu", warmup=1, pairs=3)
    assert samples.calls_per_sample == 1
    assert samples.retaken == 2 and len(samples.candidate_s) == 3


def test_a_long_sample_may_take_fresh_pages_in_proportion_to_its_length():
    # 2 MiB (512 pages) in a 20 ms sample is retaken; in a 100 ms one it is under FRESH_PAGES_PER_S
    short = paired_samples(_touching_fresh_pages({2}, mib=2), _a_sample_long(), None, device="cpu", warmup=1, pairs=3)
    long = paired_samples(
        _touching_fresh_pages({2}, mib=2, lasting_s=0.1), lambda _: time.sleep(0.1), None, device="cpu", warmup=1, pairs=3
    )
    assert (short.retaken, long.retaken) == (1, 0)


def test_a_case_whose_cost_is_fresh_pages_keeps_those_samples():
    # speed.max_retakes: 0 (recompile_limit: a compile at every call faults in its pages); the same calls as above, kept
    samples = paired_samples(_touching_fresh_pages({2, 3}), _a_sample_long(), None, device="cpu", warmup=1, pairs=3, max_retakes=0)
    assert samples.retaken == 0 and len(samples.candidate_s) == 3


def test_retakes_are_bounded_when_every_call_takes_fresh_pages():
    samples = paired_samples(_touching_fresh_pages(range(1, 1000)), _a_sample_long(), None, device="cpu", warmup=1, pairs=3)
    assert samples.retaken == MAX_RETAKES and len(samples.candidate_s) == 3


def test_the_garbage_collector_is_off_while_sampling_and_on_again_after():
    seen = []
    paired_samples(lambda _: seen.append(gc.isenabled()), lambda _: None, None, device="cpu", warmup=1, pairs=3)
    assert seen and not any(seen) and gc.isenabled()


def test_speed_inputs_merge_over_the_case_config_then_per_device_then_per_comparison():
    cfg = OmegaConf.create(
        {
            "sizes": {"batch": 2, "width": 8},
            "speed": {"inputs": {"sizes": {"batch": 4}}, "device_inputs": {"cuda": {"sizes": {"width": 64}}}},
        }
    )
    assert dict(speed_config(cfg, "cpu").sizes) == {"batch": 4, "width": 8}
    assert dict(speed_config(cfg, "cuda").sizes) == {"batch": 4, "width": 64}
    assert dict(speed_config(cfg, "cuda", {"sizes": {"batch": 1}}).sizes) == {"batch": 1, "width": 64}


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 5, 2.571), (0.975, 30, 2.042), (0.995, 10, 3.169), (0.05, 3, -2.353)],
)
def test_student_t_quantiles_match_the_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=1e-3)


def _process(ratio, noise, pairs=10, rng=None):
    rng = rng or random.Random(0)
    baseline = [1e-3 * (1 + 0.05 * rng.random()) for _ in range(pairs)]
    return PairedSamples([b * ratio * math.exp(rng.gauss(0, noise)) for b in baseline], baseline, 1)


def test_the_95_percent_interval_covers_the_true_ratio_about_95_percent_of_the_time():
    rng = random.Random(1)
    trials = [estimate_ratio([_process(1.1, 0.05, rng=rng) for _ in range(3)], level=0.95) for _ in range(400)]
    covered = sum(e.ratio_low <= 1.1 <= e.ratio_high for e in trials) / len(trials)
    assert 0.9 <= covered <= 0.99, covered


def test_the_interval_narrows_with_more_processes():
    rng = random.Random(1)

    def mean_width(processes):
        estimates = [estimate_ratio([_process(1.1, 0.05, rng=rng) for _ in range(processes)], level=0.95) for _ in range(100)]
        return sum(e.ratio_high - e.ratio_low for e in estimates) / len(estimates)

    assert mean_width(12) < mean_width(3) / 2
    many = estimate_ratio([_process(1.1, 0.05, rng=rng) for _ in range(12)], level=0.95)
    assert (many.samples, many.processes, many.level) == (120, 12, 0.95)


def test_a_bias_shared_by_all_pairs_of_a_process_widens_the_interval():
    """Pairs of one process agree closely, processes disagree: the interval must follow the processes."""
    rng = random.Random(2)
    biased = [_process(ratio, 0.001, rng=rng) for ratio in (0.95, 1.05, 1.0, 1.1)]
    estimate = estimate_ratio(biased, level=0.95)
    assert estimate.ratio_low < 0.97 and estimate.ratio_high > 1.07


def test_one_process_decides_nothing():
    estimate = estimate_ratio([_process(3.0, 0.01)], level=0.95)
    assert (estimate.ratio_low, estimate.ratio_high) == (0.0, math.inf)
    assert judge(estimate, budget=1.05) is None


def test_the_verdict_is_decisive_only_when_the_interval_is_on_one_side_of_the_budget():
    rng = random.Random(3)
    clearly_slower = estimate_ratio([_process(2.0, 0.02, rng=rng) for _ in range(3)], level=0.95)
    clearly_within = estimate_ratio([_process(0.9, 0.02, rng=rng) for _ in range(3)], level=0.95)
    at_the_budget = estimate_ratio([_process(1.05, 0.05, rng=rng) for _ in range(3)], level=0.95)
    assert judge(clearly_slower, budget=1.05) == "over_budget"
    assert judge(clearly_within, budget=1.05) == "within_budget"
    assert judge(at_the_budget, budget=1.05) is None


def test_the_cpu_allocator_is_pinned_for_timing_in_a_child():
    from harness.measure.timing import steady_cpu_allocator
    from harness.process.isolate import run_isolated

    result = run_isolated(steady_cpu_allocator, timeout_s=60)  # in a child: the test process keeps its allocator
    assert result.status == "returned" and result.value is True  # glibc here; False elsewhere, and timing goes on


@pytest.mark.untimed
@pytest.mark.slow  # a tool's smoke test, two cases profiled end to end: 8 s of the README's command
def test_the_cuda_profile_of_the_fixes_runs_end_to_end_on_cpu(tmp_path):
    """tools/cuda_profile_fixes.py is run on a lent GPU with minutes to spare: its smoke test runs here, on CPU."""
    import json
    import subprocess
    import sys

    out = tmp_path / "profile.json"
    done = subprocess.run(
        [
            sys.executable,
            "tools/cuda_profile_fixes.py",
            "--device",
            "cpu",
            "--rounds",
            "3",
            "--out",
            str(out),
            "embedding_oob",
            "autocast_device",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [case["case"] for case in report["cases"]] == ["embedding_oob", "autocast_device"]
    for case in report["cases"]:
        assert "error" not in case, case
        assert all(ratio > 0 for ratio in case["ratios"].values())
