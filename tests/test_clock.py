"""What the parent sees beside the samples (harness/measure/clock.py), judged on made-up timings."""

import importlib
import json
import os
import subprocess
import sys
import tempfile

import pytest

from harness.cases import ROOT
from harness.measure.anomaly import anomaly, clock_figures
from harness.measure.clock import BlockTiming, TimedProcess, drive, serve
from harness.measure.timing import PairedSamples
from harness.process.submitted import Submission
from harness.process.tree import tree_cpu_s
from harness.spec import RunSpec


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


def test_a_child_kept_waiting_on_a_loaded_machine_is_not_tampering():
    # backward_twice's alternative at load 6-9: the child's clock saw 74% of the parent's time, all of the time it was on a CPU
    assert anomaly([process(child_share=0.74, cpu_share=0.72), process(child_share=0.74, cpu_share=0.72)], "cpu") is None
    assert anomaly([process(child_share=0.74, cpu_share=0.72)], "cuda")[0] == "clock_tampered"  # CUDA: the parent's time, as before


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


def test_a_first_call_slower_on_inputs_that_never_repeat_is_no_cache():
    """A case whose calls advance the state in their inputs (`carries_state`) never times the same inputs twice: its fix's
    slow first call on fresh inputs is work done once per inputs (recompile_limit compiles the new session's block)."""
    once_per_inputs = (0.3, 0.08, 0.08, 0.08, 0.08, 0.08)
    assert anomaly([process(candidate=once_per_inputs), process(candidate=once_per_inputs)], "cpu", inputs_repeat=False) is None


# -- grading: the baseline in children of its own, beside a pristine copy ------------------------------


def graded_process(baseline=(0.1,) * 6, pristine=(0.1,) * 6, baseline_share=0.99, disturbed=None):
    blocks = []
    for b, p in zip(baseline, pristine):
        blocks.append(BlockTiming("candidate", 1, 0.1, 0.099, 0.099))
        blocks.append(BlockTiming("baseline", 1, b, b * 0.99, b * baseline_share))
        blocks.append(BlockTiming("pristine", 1, p, p * 0.99, p * 0.99))
    return TimedProcess(
        PairedSamples([0.1] * len(baseline), list(baseline), 1, others={"pristine": list(pristine)}), blocks, 0.0, disturbed
    )


def test_an_honest_grade_shows_nothing_and_records_the_baseline_against_its_pristine_copy():
    honest = [graded_process(baseline=(0.1, 0.11, 0.1, 0.09, 0.1, 0.1)), graded_process()]
    assert anomaly(honest, "cpu") is None
    figures = clock_figures(honest)
    assert 0.9 < figures["baseline_vs_pristine"]["ratio"] < 1.1 and figures["cpu_share"]["baseline"] > 0.9


def test_a_baseline_slower_than_its_pristine_copy_is_a_finding():
    slowed = [graded_process(baseline=(0.2, 0.21, 0.19, 0.2, 0.2, 0.2)), graded_process(baseline=(0.19, 0.2, 0.2, 0.21, 0.2, 0.2))]
    status, message = anomaly(slowed, "cpu")
    assert status == "baseline_slowed" and "pristine copy" in message


def test_a_baseline_kept_off_the_cpu_or_reniced_is_disturbed():
    assert anomaly([graded_process(baseline_share=0.3), graded_process(baseline_share=0.3)], "cpu")[0] == "baseline_disturbed"
    said = "the baseline child's scheduling changed while it was timed: CPUs [0, 1] -> [0]"
    assert anomaly([graded_process(disturbed=said), graded_process()], "cpu") == (
        "baseline_disturbed",
        f"{said}: another process of the user changed it (the submission's is the only one running code nobody reviewed)",
    )


def with_workers(candidate_cores=0.99, model_cores=2.6, outside=0.0, model_outside=0.0):
    """A grade whose model solution keeps worker processes busy beside its calls (a DataLoader's) and defers work past them."""
    blocks = []
    for _ in range(6):
        blocks.append(BlockTiming("candidate", 2, 0.1, 0.099, 0.1 * candidate_cores))
        blocks.append(BlockTiming("baseline", 2, 0.1, 0.099, 0.1 * model_cores))
        blocks.append(BlockTiming("pristine", 2, 0.1, 0.099, 0.1 * model_cores))
    return TimedProcess(PairedSamples([0.1] * 6, [0.1] * 6, 2, others={"pristine": [0.1] * 6}), blocks, outside, None, model_outside)


def test_cores_and_deferred_work_the_model_solution_uses_itself_are_allowed_and_no_more():
    # the model solution's DataLoader workers: 2.6 cores a block, 0.05 s of prefetch after each of its 12 calls
    assert anomaly([with_workers(candidate_cores=2.6, outside=0.6, model_outside=0.6)] * 2, "cpu") is None
    assert anomaly([with_workers(candidate_cores=3.8)] * 2, "cpu") is None  # within the margin (1.5x)
    status, message = anomaly([with_workers(candidate_cores=4.5)] * 2, "cpu")
    assert status == "work_beside_the_clock" and "4.50 cores" in message and "at most 2.60 cores" in message
    status, message = anomaly([with_workers(candidate_cores=2.6, outside=1.5, model_outside=0.6)] * 2, "cpu")
    assert status == "work_beside_the_clock" and "deferred work allows 1800 ms" in message
    figures = clock_figures([with_workers(model_outside=0.6)] * 2)
    assert figures["baseline_cores"] == 2.6 and figures["baseline_outside_cpu_s"] == 1.2


def test_a_single_threaded_model_solution_allows_no_extra_core_and_its_noise_no_deferred_work():
    status, message = anomaly([with_workers(candidate_cores=1.4, model_cores=0.99)] * 2, "cpu")  # 1.25 as ever, not 1.5x the model's 0.99
    assert status == "work_beside_the_clock" and "CPU timing is single-threaded" in message
    # the model's own 10 ms between blocks (under the floor) allows nothing: 0.2 s deferred is past 0.02 + 0.1 x 1.2 s
    assert (
        anomaly([with_workers(candidate_cores=0.99, model_cores=0.99, outside=0.2, model_outside=0.01)] * 2, "cpu")[0]
        == "work_beside_the_clock"
    )


def test_the_settings_an_import_changes_are_named():
    import sys

    import torch

    from harness.process.submitted import changes, namespace_ids, process_settings

    before, ids = process_settings(), namespace_ids(sys.modules[__name__])
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = not previous
    try:
        said = changes(before, process_settings(), ids, namespace_ids(sys.modules[__name__]))
    finally:
        torch.backends.mkldnn.enabled = previous
    assert said == [f"torch.backends.mkldnn.enabled {previous!r} -> {not previous!r}"]


def test_a_graded_timing_that_ends_early_leaves_no_folder_of_checked_outputs(tmp_path, monkeypatch):
    """The folder of timed outputs kept for the judge goes with a timing that raised or ended before handing it on."""
    speed = importlib.import_module("harness.phases.speed")  # the package's `speed` is the phase function
    folders = []

    def folder(prefix):
        folders.append(tmp_path / f"{prefix}{len(folders)}")
        folders[-1].mkdir()
        return str(folders[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: folder(prefix))
    graded = RunSpec(case="embedding_oob", device="cpu", timeout_s=1.0, submission=Submission("/nowhere.py", "fix", "0" * 64))
    ended = [RuntimeError("the timing child crashed"), speed.PhaseRecord("speed", "crashed", False, "", {}, 0.0, "")]

    def ends_early(*args):
        outcome = ended.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(speed, "_time_against", ends_early)
    with pytest.raises(RuntimeError):
        speed.time_against("speed", speed.SPEED_CANDIDATE, 1.5, None, graded)
    assert speed.time_against("speed", speed.SPEED_CANDIDATE, 1.5, None, graded).status == "crashed"
    assert len(folders) == 2 and not any(path.exists() for path in folders)


@pytest.mark.parametrize("apart", [False, True])
def test_a_case_timed_apart_has_each_side_in_a_process_of_its_own_driven_at_once(apart, monkeypatch, tmp_path, environment):
    """`speed.apart` (recompile_limit's yaml): the fix and its baseline each in a child of its own, both alive while the
    parent takes their blocks in turn; a case's own timing otherwise serves both sides from one child."""
    from harness.run import run_case
    from tests.conftest import compose_config

    speed = importlib.import_module("harness.phases.speed")
    driven = []

    def watched_drive(children, deadline, **settings):
        pids = {side: pid for side, (_, pid) in children.items()}
        driven.append((pids, {pid: _alive(pid) for pid in pids.values()}))
        return drive(children, deadline, **settings)

    monkeypatch.setattr(speed, "drive", watched_drive)
    overrides = ["speed.process_s=0.05", "speed.pairs=2", "speed.max_processes=2", "case.speed.budget.cpu=100"]
    record, _ = run_case(
        compose_config("case=embedding_oob", "device=cpu", "phases=[speed]", *overrides, f"+case.speed.apart={apart}"),
        "cpu",
        tmp_path,
        environment,
    )
    assert record.phases[0].status == "within_budget", record.phases[0].message
    assert len(driven) == record.phases[0].figures["processes"] >= 2
    for pids, alive in driven:
        assert set(pids) == {"candidate", "baseline"} and all(alive.values())
        assert (pids["candidate"] != pids["baseline"]) == apart
    assert len({pids["candidate"] for pids, _ in driven}) == len(driven)  # a fresh child per timing process, either way


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("lows", "max_processes", "processes"), [((1.2, 1.2, 1.6, 1.6), 6, 4), ((1.2, 1.2, 1.2), 4, 4), ((1.6,), 4, 2)])
def test_a_slow_control_just_over_its_budget_is_measured_on_until_it_clears_its_margin(
    lows, max_processes, processes, monkeypatch, tmp_path, environment
):
    """A control's timing does not stop at the first interval over the budget: it goes on while the low end is below
    the margin (harness/margins.py's SLOW x the budget), and is still flagged, thin, when the processes run out."""
    from harness.measure.timing import RatioEstimate
    from harness.run import run_case
    from tests.conftest import compose_config

    speed = importlib.import_module("harness.phases.speed")

    def made_up(samples, level):  # the budget is 1.0: the low end after each real timing process from the second (min_processes), in turn
        low = lows[len(samples) - 2]
        return RatioEstimate(low * 1.1, low, low * 1.2, level, 2 * len(samples), len(samples), 1e-3, 1e-3, ())

    monkeypatch.setattr(speed, "estimate_ratio", made_up)
    overrides = ["speed.process_s=0.05", "speed.pairs=2", f"speed.max_processes={max_processes}", "case.speed.budget.cpu=1.0"]
    record, _ = run_case(
        compose_config("case=embedding_oob", "device=cpu", "phases=[slow_fixes]", *overrides), "cpu", tmp_path, environment
    )
    assert record.phases and all(c.status == "flagged" and c.figures["processes"] == processes for c in record.phases), [
        (c.status, c.figures.get("processes")) for c in record.phases
    ]


@pytest.mark.untimed
@pytest.mark.slow  # two graded runs of the harness: 10 s
def test_a_grade_decides_after_its_own_minimum_of_processes_and_a_case_s_own_timing_after_the_case_s(monkeypatch, tmp_path, environment):
    """A case's `speed.min_processes` may be there for its slow controls' margins; a grade's first verdict comes from
    `speed.grade_decides_after` processes (harness/phases/speed.py), whatever the case asks of its own timing. A case
    yaml may raise it: the settings a run is given (`speed_settings`) take the yaml's over conf/config.yaml's."""
    from harness.measure.timing import RatioEstimate
    from harness.run import run_case, speed_settings
    from tests.conftest import compose_config

    speed = importlib.import_module("harness.phases.speed")
    monkeypatch.setattr(  # decisive from the first interval: within the budget of 1.15x
        speed,
        "estimate_ratio",
        lambda samples, level: RatioEstimate(1.0, 0.99, 1.01, level, 2 * len(samples), len(samples), 1e-3, 1e-3, ()),
    )
    fix = f"fix={ROOT / 'tests' / 'fixes' / 'alternatives' / 'embedding_oob.py'}:embedding_oob"
    asked = ("case=embedding_oob", "device=cpu", "phases=[speed]", "speed.process_s=0.05", "++case.speed.min_processes=4")
    for overrides, processes in (((), 4), ((fix,), 2)):
        record, _ = run_case(compose_config(*asked, *overrides), "cpu", tmp_path / str(processes), environment)
        assert (record.phases[0].status, record.phases[0].figures["processes"]) == ("within_budget", processes), record.phases[0].message
    assert speed_settings(compose_config(*asked)).grade_decides_after == 2
    assert speed_settings(compose_config(*asked, "++case.speed.grade_decides_after=3")).grade_decides_after == 3


@pytest.mark.parametrize(
    ("processes", "seconds", "graded", "stops"),
    [
        (12, 5.0, False, True),  # a case's own timing: max_processes
        (3, 20.0, False, True),  # ... or max_s
        (3, 19.0, False, False),
        (5, 64.0, True, False),  # a grade past grade_max_s with few processes measures on
        (10, 60.0, True, True),  # ... until grade_min_processes
        (4, 180.0, True, True),  # ... or three times grade_max_s
        (40, 59.0, True, False),  # many processes alone never end it
    ],
)
def test_a_grade_is_undecided_only_after_enough_processes_or_three_times_its_limit(processes, seconds, graded, stops):
    from harness.spec import SpeedSettings

    speed = importlib.import_module("harness.phases.speed")
    assert (
        speed._out_of_time(processes, seconds, SpeedSettings(max_processes=12, max_s=20, grade_max_s=60, grade_min_processes=10), graded)
        is stops
    )


def test_a_block_s_cpu_holds_the_children_that_ended_inside_it():
    """A DataLoader's workers of one pass, or a process a submission starts and waits for, end inside the block:
    their CPU is the block's (the model solution's reaped workers once read as a baseline kept off the CPU)."""
    before = tree_cpu_s(os.getpid())
    busy = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end:\n    pass"
    subprocess.run([sys.executable, "-c", busy], check=True)
    assert tree_cpu_s(os.getpid()) - before >= 0.35


class _Requests:
    """A timing child's end of the pipe, fed the parent's requests in turn."""

    def __init__(self, *requests):
        self.requests, self.answers = [json.dumps(r).encode() for r in (*requests, {"op": "stop"})], []

    def recv_bytes(self):
        return self.requests.pop(0)

    def send_bytes(self, data):
        self.answers.append(data)


def test_a_compiled_side_traced_again_on_every_call_is_counted_and_a_settled_one_is_not():
    import torch
    import torch._dynamo

    from harness.compiled import frames_traced
    from harness.phases.speed import retraced_note, traced_every_call

    torch._dynamo.reset()
    step = {"n": 0}

    def moving(x):  # a guard on a Python int that every call changes: dynamo traces the frame again each time
        step["n"] += 1
        return x * step["n"]

    functions = {"candidate": torch.compile(lambda x: x * 2, backend="eager"), "baseline": torch.compile(moving, backend="eager")}
    x = torch.ones(3)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        for function in functions.values():
            function(x)
    served = {}
    run = {"op": "run", "calls": 3}
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # no int made dynamic after a recompile
        serve(
            _Requests({**run, "side": "candidate"}, {**run, "side": "baseline"}), functions, x, "cpu", traces=frames_traced, served=served
        )
    assert served["candidate"] == {"calls": 3, "traced": 0}
    assert served["baseline"]["calls"] == 3 and served["baseline"]["traced"] >= 3
    figures = {"traced_while_timed": [served, served]}
    assert traced_every_call(figures) == (2 * served["baseline"]["traced"], 6) and traced_every_call(figures, "candidate") is None
    assert "traced again on every call" in retraced_note(figures) and retraced_note({}) == ""
    torch._dynamo.reset()
