"""The memory source's exactness on known allocation patterns, the slope's interval, the verdict, and the memory
phase on a case (harness/measure/footprint.py, harness/phases/). Everything runs on CPU; the CUDA source is tested in
tests/test_cuda.py's way: skipped without a device."""

import functools
import math

import pytest

from harness.cases import Growth
from harness.measure import footprint as memory
from harness.measure import memory_verdict
from harness.process.isolate import run_isolated
from harness.run import run_case
from tests.conftest import compose_config, requires_cuda

MIB = 1 << 20
STEPS = 8


def measured(pattern: str, steps: int = STEPS, warmup: int = 1) -> memory.StepMemory:
    from tests.memory_children import measure_in_child

    result = run_isolated(measure_in_child, pattern, steps, warmup, timeout_s=120, talk=functools.partial(memory.drive_steps, device="cpu"))
    assert result.status == "returned" and result.talk is not None, result.summary + result.output
    assert result.talk["hwm_reset"], "the parent could not reset the child's high-water mark"
    return memory.step_memory(result.talk, "cpu", 0.95)


@pytest.mark.skipif(memory.malloc_in_use() is None, reason="glibc's mallinfo2 is missing (not glibc, or glibc < 2.33)")
def test_a_step_that_keeps_one_mib_more_reads_one_mib_per_step_in_both_cpu_series():
    kept = measured("keeps_one_mib")
    malloc = memory.fit_slope(kept.retained, 0.95)  # `retained` is malloc's series where glibc's is there
    assert 0.99 * MIB <= malloc.low <= malloc.high <= 1.02 * MIB, kept.figures()
    assert 0.95 * MIB <= kept.growth.per_step <= 1.1 * MIB  # whichever series grew faster
    rss = memory.fit_slope(kept.rss_retained, 0.95)
    assert 0.95 * MIB <= rss.per_step <= 1.1 * MIB, kept.figures()
    assert kept.max_peak >= STEPS * MIB  # the peak is above the level before the first step: retained state counts


def test_a_step_that_allocates_64_mib_and_frees_it_peaks_at_64_mib_and_keeps_nothing():
    transient = measured("allocates_and_frees_64_mib")
    assert all(63.5 * MIB <= peak <= 66 * MIB for peak in transient.peak), (
        transient.peak
    )  # every step (the mark is reset before each); read 63.89 MiB: pages freed in the step
    assert abs(transient.growth.per_step) < 64 << 10 and transient.growth.high < 64 << 10, transient.figures()
    assert max(transient.retained) < 1 * MIB


@pytest.mark.parametrize("pattern", ["keeps_one_mib_in_numpy", "keeps_one_mib_by_ctypes_malloc", "keeps_one_mib_in_mmap"])
def test_memory_kept_outside_torch_is_seen(pattern):
    kept = measured(pattern)
    assert 0.95 * MIB <= kept.growth.per_step <= 1.1 * MIB, kept.figures()
    if pattern == "keeps_one_mib_in_mmap":  # malloc never sees a mapping made by mmap itself: the resident set does
        assert kept.growth_series == "rss"


def test_a_worker_process_that_keeps_one_mib_a_step_is_measured_in_the_worker():
    grows, flat = measured("worker_keeps_one_mib"), measured("worker_keeps_nothing")
    assert grows.workers["count"] == [1] * STEPS and grows.growth_series == "workers_pss", grows.figures()
    assert 0.95 * MIB <= grows.fits["workers_pss"].per_step <= 1.1 * MIB, grows.figures()
    assert 0.95 * MIB <= memory.fit_slope(grows.workers["uss"], 0.95).per_step <= 1.1 * MIB, grows.figures()
    assert abs(flat.fits["workers_pss"].per_step) < 0.05 * MIB, flat.figures()
    assert memory.fit_slope(grows.retained, 0.95).high < 0.05 * MIB  # the child itself keeps nothing: the main process alone would miss it
    verdict = memory_verdict.judge_memory(grows, flat, {"growth": 0.1})
    assert verdict.status == "over_budget" and verdict.series == "workers_pss", verdict


def test_a_worker_s_share_of_the_page_cache_of_a_file_it_maps_is_kept_apart_from_its_growth():
    """File-backed pages a worker maps are page cache every process mapping the file shares (libtorch's, on a loaded
    machine, moved a worker's PSS by MiBs as other processes came and went): figures, not the judged series."""
    mapped = measured("worker_maps_one_mib_of_a_file")
    assert 0.95 * MIB <= memory.fit_slope(mapped.workers["pss_file"], 0.95).per_step <= 1.1 * MIB, mapped.figures()
    assert abs(mapped.fits["workers_pss"].per_step) < 0.05 * MIB, mapped.figures()


def test_the_verdict_flags_a_step_that_keeps_its_graph_and_passes_a_flat_one():
    baseline = measured("training_step")
    flat = measured("training_step")
    growing = measured("training_step_keeping_the_graph")
    budget = {"growth": 0.02, "peak": 1.5}
    assert memory_verdict.judge_memory(flat, baseline, budget).status == "within_budget", memory_verdict.describe(flat, baseline)
    verdict = memory_verdict.judge_memory(growing, baseline, budget)
    assert verdict.status == "over_budget" and verdict.growth_fraction_low > 0.02, memory_verdict.describe(growing, baseline)
    assert memory_verdict.judge_memory(growing, baseline, None).status == "measured"  # no budget: figures only


def test_growth_is_reproduced_from_the_slope_s_lower_bound():
    baseline = measured("training_step")
    growing = measured("training_step_keeping_the_graph")
    symptom = Growth(at_least=0.2, oom="CUDA out of memory")  # this step keeps 0.30 of its peak per step
    assert memory_verdict.judge_memory(growing, baseline, None).growth_fraction_low >= symptom.at_least
    assert memory_verdict.judge_memory(baseline, baseline, None).growth_fraction_high < symptom.at_least
    assert symptom.expected_on("2.13.0") and not Growth(0.5, fixed_in="2.4.0").expected_on("2.13.0")


def test_the_slope_s_interval_is_exact_on_a_line_and_covers_the_truth_on_noise():
    line = memory.fit_slope([100.0 * i + 7 for i in range(10)], 0.95)
    assert line.per_step == pytest.approx(100.0) and line.high - line.low == pytest.approx(0.0, abs=1e-6)
    noisy = memory.fit_slope([100.0 * i + (37 if i % 2 else -37) for i in range(10)], 0.95)
    assert noisy.low < 100.0 < noisy.high and noisy.high - noisy.low > 1.0
    assert math.isnan(memory.fit_slope([1.0, 2.0], 0.95).per_step)  # two points: no interval


def _steps(slope: memory.Slope, peak: int = 2 * MIB) -> memory.StepMemory:
    return memory.StepMemory("cpu", [0] * 8, [peak] * 8, [0] * 8, {"malloc": slope, "rss": memory.Slope(0.0, 0.0, 0.0, 0.95)})


def test_growth_is_judged_beyond_the_baseline_s_and_its_interval_decides():
    flat = _steps(memory.Slope(0.0, 0.0, 0.0, 0.95))
    straddling = _steps(memory.Slope(0.02 * MIB, -0.01 * MIB, 0.05 * MIB, 0.95))
    assert memory_verdict.judge_memory(straddling, flat, {"growth": 0.02}).status == "inconclusive"
    assert memory_verdict.judge_memory(flat, flat, {"growth": 0.02, "peak": 1.5}).status == "within_budget"
    high = _steps(memory.Slope(0.0, 0.0, 0.0, 0.95), peak=4 * MIB)
    assert memory_verdict.judge_memory(high, flat, {"peak": 1.5}).status == "over_budget"
    logging = _steps(memory.Slope(0.1 * MIB, 0.1 * MIB, 0.1 * MIB, 0.95))  # both keep a log: no growth of the fix's own
    verdict = memory_verdict.judge_memory(logging, logging, {"growth": 0.02})
    assert verdict.status == "within_budget" and verdict.growth_fraction == 0.0
    assert memory_verdict.judge_memory(logging, flat, {"growth": 0.02}).status == "over_budget"  # 0.05 of the 2 MiB peak


def test_a_tiny_step_is_judged_against_at_least_one_mib():
    tiny = _steps(memory.Slope(1500.0, 1200.0, 1900.0, 0.95), peak=40 << 10)  # a small RNN: pages and arenas, not tensors
    flat = _steps(memory.Slope(0.0, 0.0, 0.0, 0.95), peak=40 << 10)
    verdict = memory_verdict.judge_memory(tiny, flat, {"growth": 0.02, "peak": 1.5})
    assert verdict.unit == memory_verdict.MIN_UNIT and verdict.status == "within_budget", verdict


# -- the phase, on a case ------------------------------------------------------------------------------------


def test_without_a_budget_the_memory_phase_gives_figures_only(tmp_path, environment):
    record, _ = run_case(compose_config("case=embedding_oob", "device=cpu", "phases=[memory,memory_fixes]"), "cpu", tmp_path, environment)
    (phase,) = record.phases  # embedding_oob has no memory controls
    assert (phase.phase, phase.status, phase.ok) == ("memory", "measured", True), phase.message
    figures = phase.figures
    assert figures["budget"] is None and figures["steps"] == 4 and len(figures["peak"]) == 4
    assert figures["baseline"]["max_peak"] > 0 and figures["peak_ratio"] > 0
    assert "mallinfo2" in figures["source"]


def test_with_a_budget_the_fix_is_judged(tmp_path, environment):
    budget = "+case.memory={steps: 6, budget: {cpu: {growth: 0.05, peak: 10.0}}}"
    record, _ = run_case(compose_config("case=embedding_oob", "device=cpu", "phases=[memory]", budget), "cpu", tmp_path, environment)
    (phase,) = record.phases
    assert (phase.status, phase.ok) == ("within_budget", True), phase.message
    assert phase.figures["budget"] == {"growth": 0.05, "peak": 10.0} and phase.figures["steps"] == 6


def test_a_launcher_case_says_why_its_memory_is_not_measured(tmp_path, environment):
    record, _ = run_case(compose_config("case=multigpu_segfault", "device=cpu", "phases=[memory]"), "cpu", tmp_path, environment)
    (phase,) = record.phases
    assert (phase.status, phase.ok) == ("not_applicable", True) and "launch" in phase.message


@requires_cuda
@pytest.mark.cuda
def test_on_cuda_the_allocator_sees_one_mib_per_step():  # pragma: no cover - needs a GPU
    from tests.memory_children import measure_on_cuda_in_child

    result = run_isolated(measure_on_cuda_in_child, STEPS, timeout_s=120, talk=functools.partial(memory.drive_steps, device="cuda"))
    kept = memory.step_memory(result.talk, "cuda", 0.95)
    assert kept.growth.per_step == pytest.approx(MIB, rel=0.01) and kept.max_peak >= STEPS * MIB


def test_a_memory_budget_needs_memory_controls(tmp_path, monkeypatch):
    import types

    from harness import cases

    (tmp_path / "fake.yaml").write_text("memory:\n  budget: {cpu: {growth: 0.02}, cuda: null}\n")
    monkeypatch.setattr(cases, "CASE_CONFIG_DIR", tmp_path)
    case = types.ModuleType("cases.fake")
    assert any("sets a memory budget (cpu) but `memory_fixes` is empty" in problem for problem in cases.contract_problems(case))
    case.memory_fixes = {"keeps_the_graph": lambda inputs: None}
    assert not any("memory" in problem for problem in cases.contract_problems(case))


def test_a_case_with_a_memory_budget_gets_a_memory_figure_beside_the_speed_figure(tmp_path, environment):
    from harness.matrix import load_records
    from harness.teach import Sources, _figures_section, case_figures

    budget = "+case.memory={steps: 4, budget: {cpu: {growth: 0.05}}}"
    record, path = run_case(compose_config("case=embedding_oob", "device=cpu", "phases=[memory]", budget), "cpu", tmp_path, environment)
    records = load_records(tmp_path)
    config = {**record.config["case"]}
    files = case_figures("embedding_oob", Sources(config, records, grading_landed=True, any_hints=True))
    assert files["embedding_oob.memory.png"].startswith(b"\x89PNG")
    section = "\n".join(_figures_section("embedding_oob", Sources(config, records, True, True), list(files)))
    assert "embedding_oob.memory.png" in section and "| fixed |" in section and "| baseline |" in section
    del config["memory"]  # no memory budget: no memory figure (the pages of cases without one stay as they are)
    assert "embedding_oob.memory.png" not in case_figures("embedding_oob", Sources(config, records, True, True))
