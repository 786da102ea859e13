"""Every case, every phase, on CPU: the failure reproduces, the fix holds, bad fixes are rejected."""

import json

import pytest

from harness.cases import case_names
from harness.run import run_case
from tests.conftest import compose_config


@pytest.fixture(scope="module", params=case_names())
def cpu_record(request, environment, tmp_path_factory):
    cfg = compose_config(f"case={request.param}", "device=cpu", "speed.repeats=5", "speed.warmup=1")
    record, path = run_case(cfg, "cpu", tmp_path_factory.mktemp(request.param), environment)
    return record, path


def _phase(record, name):
    return next(phase for phase in record.phases if phase.phase == name)


def test_the_failure_reproduces_with_the_cpu_symptom(cpu_record):
    # ok encodes the expectation: reproduced, or fixed_upstream on a torch the case records as having fixed it.
    record, _ = cpu_record
    reproduce = _phase(record, "reproduce")
    assert reproduce.ok and reproduce.status in ("reproduced", "fixed_upstream"), reproduce.message


def test_the_fix_runs_and_matches_the_reference(cpu_record):
    record, _ = cpu_record
    assert _phase(record, "fix").status == "passed", _phase(record, "fix").message
    assert _phase(record, "correct").status == "passed", _phase(record, "correct").message


def test_the_speed_phase_measures_a_ratio(cpu_record):
    # The budget is judged by the harness run, not here: a timing must not fail a test on a slow machine.
    record, _ = cpu_record
    speed = _phase(record, "speed")
    assert speed.status in ("within_budget", "over_budget", "measured"), speed.message
    assert speed.figures["ratio"] > 0 and speed.figures["cpu_threads"] == 1, record.case


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
