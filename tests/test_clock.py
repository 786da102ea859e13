"""What the parent sees beside the samples (harness/clock.py), judged on made-up timings."""

from harness.clock import BlockTiming, TimedProcess, anomaly
from harness.timing import PairedSamples


def process(candidate=(0.1,) * 6, baseline=(0.1,) * 6, child_share=0.99, cpu_share=0.99, outside=0.0):
    blocks = []
    for c, b in zip(candidate, baseline):
        blocks.append(BlockTiming("candidate", 1, c, c * child_share, c * cpu_share))
        blocks.append(BlockTiming("baseline", 1, b, b * 0.99, b * 0.99))
    return TimedProcess(PairedSamples(list(candidate), list(baseline), 1), blocks, outside)


def test_an_honest_run_shows_nothing():
    assert anomaly([process(), process()], "cpu") is None


def test_a_child_clock_that_lags_the_parent_s_is_tampering():
    status, message = anomaly([process(child_share=0.2), process(child_share=0.2)], "cpu")
    assert status == "clock_tampered" and "20%" in message


def test_a_child_clock_that_runs_ahead_is_tampering():
    assert anomaly([process(child_share=1.5)], "cpu")[0] == "clock_tampered"


def test_more_than_one_core_during_a_block_is_work_beside_the_clock():
    assert anomaly([process(cpu_share=1.9), process()], "cpu")[0] == "work_beside_the_clock"
    assert anomaly([process(cpu_share=1.9), process()], "cuda") is None  # CUDA: the runtime's own threads; not judged


def test_cpu_used_while_the_child_should_wait_is_work_beside_the_clock():
    assert anomaly([process(outside=0.4), process()], "cpu")[0] == "work_beside_the_clock"
    assert anomaly([process(outside=0.01), process()], "cpu") is None


def test_a_cache_shows_in_every_process_noise_in_one():
    cached = (0.3, 0.08, 0.08, 0.08, 0.08, 0.08)
    assert anomaly([process(candidate=cached), process(candidate=cached)], "cpu")[0] == "faster_on_repeated_inputs"
    assert anomaly([process(candidate=cached), process()], "cpu") is None
