"""Every case, every phase, on CPU: the failure reproduces, the fix holds, bad fixes are rejected.

Per case, the README's test command runs the phases that judge correctness (reproduce, fix, correct, the bad fixes:
seconds a case); the timed and measured ones (speed, the slow fixes, memory and its controls) run end to end under
`-m slow`, in CI, so the corpus can grow without the plain test run growing with it by a full run a case."""

import json

import pytest

from harness.cases import case_names
from harness.phases import CLEAN_RUN, FAILURE_REPRODUCED
from harness.run import run_case
from harness.triage import triage
from tests.conftest import compose_config, names_its_failure, record_log, reproduce_params

CONTROLS = "phases=[slow_fixes]"  # timed: the machine to themselves
MEMORY = "phases=[memory,memory_fixes]"  # measured in bytes, never in time: with the slow tests that time nothing


@pytest.fixture(scope="module", params=reproduce_params())
def cpu_record(request, correctness_records):
    """Each case's correctness phases on CPU (shared with test_triage: tests/conftest.py); a case whose failure is time
    under -m slow: every phase of it compiles (the compiler's behaviour is its failure), 39 s cold for recompile_limit."""
    return correctness_records(request.param)


# The fix's own timing is not judged here (a timing must not fail a test on a slow machine; the matrix's records judge
# it): two processes of two pairs show that it measures a ratio, beside the other slow tests that time nothing. The
# controls are judged, and time as a run does, one test at a time.
UNJUDGED_SPEED = ("speed.pairs=2", "++case.speed.min_processes=2", "++case.speed.max_processes=2")
SHARED_SPEED = ("speed.process_s=0.2", "speed.warmup=1")


@pytest.fixture(scope="module", params=case_names())
def speed_cpu_record(request, environment, tmp_path_factory):
    """Each case's speed phase on CPU, unjudged (slow tests that time nothing). The phases that judge correctness are
    `cpu_record`'s, in the README's test command; the controls are `controls_cpu_record`'s; memory `memory_cpu_record`'s."""
    folder = tmp_path_factory.mktemp(request.param + "-speed")
    cfg = compose_config(f"case={request.param}", "device=cpu", *SHARED_SPEED, "phases=[speed]", *UNJUDGED_SPEED)
    return run_case(cfg, "cpu", folder, environment)


@pytest.fixture(scope="module", params=case_names())
def controls_cpu_record(request, environment, tmp_path_factory):
    """Each case's slow controls on CPU, timed as a run times them (slow tests, one at a time)."""
    folder = tmp_path_factory.mktemp(request.param + "-controls")
    cfg = compose_config(f"case={request.param}", "device=cpu", *SHARED_SPEED, CONTROLS, "speed.max_s=30")
    return run_case(cfg, "cpu", folder, environment)


@pytest.fixture(scope="module", params=case_names())
def memory_cpu_record(request, environment, tmp_path_factory):
    """Each case's memory phase and memory controls on CPU (slow tests that time nothing): what they judge is bytes
    kept and peaked per step, which another process's load does not change. In CI's timed run they took 114 s."""
    folder = tmp_path_factory.mktemp(request.param + "-memory")
    return run_case(compose_config(f"case={request.param}", "device=cpu", MEMORY), "cpu", folder, environment)


def _phase(record, name):
    return next(phase for phase in record.phases if phase.phase == name)


@pytest.mark.parametrize("name", reproduce_params())  # a failure that is time: its reproduce is a timing, under -m slow
def test_the_failure_reproduces_with_the_cpu_symptom(correctness_records, name):
    # ok encodes the expectation: reproduced, or fixed_upstream on a torch the case records as having fixed it.
    record, _ = correctness_records(name, with_timed_reproduce=True)
    reproduce = _phase(record, "reproduce")
    assert reproduce.ok and reproduce.status in FAILURE_REPRODUCED | CLEAN_RUN, reproduce.message


def test_the_fix_runs_and_matches_the_reference(cpu_record):
    record, _ = cpu_record
    assert _phase(record, "fix").status == "passed", _phase(record, "fix").message
    assert _phase(record, "correct").status == "passed", _phase(record, "correct").message


@pytest.mark.parametrize("name", reproduce_params())  # a failure that is time: its reproduce is a timing, under -m slow
def test_a_fresh_reproduce_record_triages_to_its_own_case(correctness_records, name):
    """Here, not in test_triage: the record is this module's (one worker makes it, `--dist loadscope`)."""
    record = json.loads(json.dumps(correctness_records(name, with_timed_reproduce=True)[0].to_json(), default=str))
    record["phases"] = [phase for phase in record["phases"] if phase["phase"] == "reproduce"]  # the record a user would paste
    reproduce = record["phases"][0]
    verdict = triage(record_log(record))
    if names_its_failure(reproduce):
        assert verdict.case == name, [(c.case, c.score, c.why) for c in verdict.candidates]
    else:
        assert reproduce["status"] in ("fixed_upstream", "clean_before", "wrong_result") and verdict.case is None, reproduce["message"]


@pytest.mark.untimed
@pytest.mark.slow
def test_the_speed_phase_measures_a_ratio(speed_cpu_record):
    # The budget is judged by the harness run, not here: a timing must not fail a test on a slow machine.
    record, _ = speed_cpu_record
    speed = _phase(record, "speed")
    assert speed.status in ("within_budget", "over_budget", "inconclusive", "measured"), speed.message
    figures = speed.figures
    assert 0 < figures["ratio_low"] <= figures["ratio"] <= figures["ratio_high"], speed.message
    assert figures["processes"] >= 2 and figures["samples"] >= 2 * figures["processes"] and figures["level"] == 0.95
    assert figures["cpu_threads"] == 1, record.case


@pytest.mark.slow
def test_every_slow_fix_is_a_correct_fix_that_the_speed_verdict_flags(controls_cpu_record):
    record, _ = controls_cpu_record
    slow_fixes = [phase for phase in record.phases if phase.phase.startswith("slow_fix:")]
    for phase in slow_fixes:
        assert "broken" not in phase.message, f"{phase.phase}: {phase.message}"  # the control itself must be correct
        assert (phase.status, phase.ok) in (("flagged", True), ("no_budget", True)), f"{phase.phase}: {phase.message}"


def test_the_speed_verdict_can_go_either_way(environment, tmp_path):
    """The same measurement against a budget far above and far below the ratio: within, then over."""
    verdicts = []
    for budget in (100.0, 0.01):
        cfg = compose_config("case=embedding_oob", "device=cpu", "phases=[speed]", "speed.process_s=0.1", f"case.speed.budget.cpu={budget}")
        record, _ = run_case(cfg, "cpu", tmp_path / str(budget), environment)
        verdicts.append((record.phases[0].status, record.phases[0].ok))
    assert verdicts == [("within_budget", True), ("over_budget", False)]


def test_a_slow_fix_under_a_generous_budget_is_missed(environment, tmp_path):
    """The control's own check can fail: with room for anything, the slow fix is not flagged, and that is a failure."""
    overrides = ("speed.process_s=0.1", "case.speed.budget.cpu=100")
    record, _ = run_case(
        compose_config("case=embedding_oob", "device=cpu", "phases=[slow_fixes]", *overrides), "cpu", tmp_path, environment
    )
    assert [(phase.status, phase.ok) for phase in record.phases] == [("missed", False)] * len(record.phases) and record.phases


def test_an_interval_that_straddles_the_budget_is_inconclusive_not_a_pass(environment, tmp_path):
    """Two processes at a 99.9999% level: an interval hundreds of times wider than the budget's distance from 1."""
    overrides = ("speed.process_s=0.05", "speed.pairs=2", "speed.max_processes=2", "speed.level=0.999999", "case.speed.budget.cpu=1.0")
    record, _ = run_case(compose_config("case=embedding_oob", "device=cpu", "phases=[speed]", *overrides), "cpu", tmp_path, environment)
    speed = record.phases[0]
    assert (speed.status, speed.ok) == ("inconclusive", True), speed.message
    assert speed.figures["ratio_low"] <= 1.0 <= speed.figures["ratio_high"] and speed.figures["processes"] == 2


def test_every_bad_fix_is_rejected_and_the_report_says_how(cpu_record):
    record, _ = cpu_record
    bad_fixes = [phase for phase in record.phases if phase.phase.startswith("bad_fix:")]
    assert bad_fixes
    for phase in bad_fixes:
        assert (phase.status, phase.ok) == ("rejected", True), f"{phase.phase}: {phase.message}"
        assert phase.figures["how"] in ("raised", "crashed", "differs")


def test_the_record_on_disk_is_complete(cpu_record):
    record, path = cpu_record
    on_disk = json.loads(path.read_text())
    assert on_disk["case"] == record.case and on_disk["device"] == "cpu"
    assert on_disk["finished_at"] is not None
    assert [phase["phase"] for phase in on_disk["phases"]] == [phase.phase for phase in record.phases]
    assert on_disk["environment"]["torch"] and on_disk["environment"]["python"]


@pytest.mark.untimed
@pytest.mark.slow
def test_the_memory_phase_measures_the_fix_or_says_why_not(memory_cpu_record):
    record, _ = memory_cpu_record
    memory = _phase(record, "memory")
    assert memory.status in ("within_budget", "inconclusive", "measured", "not_applicable"), memory.message
    if memory.status != "not_applicable":
        baseline = memory.figures["baseline"]
        assert memory.figures["max_peak"] >= 0 and baseline["max_peak"] >= 0, memory.message
        # something measured: a peak in the process, or its workers' series (a loader's own process, which only
        # receives batches, may stay under the high-water mark its warm-up set: peak 0 B)
        assert baseline["max_peak"] > 0 or baseline.get("workers", {}).get("count"), memory.message
    for phase in record.phases:
        if phase.phase.startswith("memory_fix:"):
            assert (phase.status, phase.ok) in (("flagged", True), ("no_budget", True)), f"{phase.phase}: {phase.message}"
