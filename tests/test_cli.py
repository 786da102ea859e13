"""The command line, end to end, in a subprocess: what a user types and what they get back."""

import json
import subprocess
import sys

import pytest

from harness.cases import ROOT, case_names
from harness.cli import EXIT_CHECK_FAILED, EXIT_NO_DEVICE, EXIT_OK, EXIT_USAGE
from tests.conftest import CUDA_AVAILABLE

QUICK_PHASES = "phases=[reproduce,fix,correct,bad_fixes]"


def harness(*args, tmp_path):
    command = [sys.executable, "-m", "harness", *args, f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/multirun"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_a_case_prints_symptom_cause_fix_and_evidence_and_writes_its_record(tmp_path):
    run = harness("case=embedding_oob", "device=cpu", QUICK_PHASES, tmp_path=tmp_path)
    assert run.returncode == EXIT_OK, run.stdout + run.stderr
    for text in ("Symptom on CUDA", "Seen here", "IndexError: index out of range in self", "Cause:", "Fix:", "bad_fix:clamp_indices"):
        assert text in run.stdout
    record = json.loads((tmp_path / "run" / "embedding_oob.cpu.json").read_text())
    assert record["ok"] and [phase["status"] for phase in record["phases"]][:3] == ["reproduced", "passed", "passed"]


@pytest.mark.untimed
@pytest.mark.slow  # a harness run on a patched case: 5 s
def test_a_failure_that_no_longer_reproduces_exits_non_zero(tmp_path):
    # Without the special id the head happens to pick, the stream decodes fine: the case says so and fails.
    run = harness("case=codebook_oob", "device=cpu", "phases=[reproduce]", "case.special_picks=[]", tmp_path=tmp_path)
    assert run.returncode == EXIT_CHECK_FAILED, run.stdout + run.stderr
    assert "not_reproduced" in run.stdout


@pytest.mark.skipif(CUDA_AVAILABLE, reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_one_clear_line(tmp_path):
    run = harness("case=embedding_oob", "device=cuda", tmp_path=tmp_path)
    assert run.returncode == EXIT_NO_DEVICE
    assert run.stderr.strip().count("\n") == 0 and "Traceback" not in run.stderr
    assert run.stderr.startswith("error: device=cuda requested, but no CUDA device is available")


@pytest.mark.parametrize("case_args", [[], ["case=nope"]], ids=["no case", "unknown case"])
def test_a_missing_or_unknown_case_lists_the_cases(tmp_path, case_args):
    run = harness(*case_args, tmp_path=tmp_path)
    assert run.returncode == EXIT_USAGE
    for name in case_names():
        assert name in run.stderr + run.stdout


def test_help_without_a_case_gives_the_usage_not_a_traceback(tmp_path):
    run = harness("--help", tmp_path=tmp_path)
    assert run.returncode == EXIT_OK and "Traceback" not in run.stderr
    assert run.stdout.startswith("usage: python -m harness case=<name>") and all(name in run.stdout for name in case_names())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("case.sizes.batch=-1", "sizes must be positive integers"),
        ("phases=[reproduce,nope]", "unknown phase nope"),
        ("device=tpu", "choose one of auto, cpu, cuda"),
        ("timeout_s=0", "must be positive"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(tmp_path, override, message):
    run = harness("case=embedding_oob", override, tmp_path=tmp_path)
    assert run.returncode == EXIT_USAGE
    assert message in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "run" / "embedding_oob.cpu.json").exists()


@pytest.mark.untimed
@pytest.mark.slow  # every case's reproduce phase in one sweep: 10 to 20 s (tests/test_launchers.py's sweeps stay in the plain run)
def test_multirun_runs_every_case(tmp_path):
    run = harness("-m", "case=glob(*)", "device=cpu", "phases=[reproduce]", tmp_path=tmp_path)
    assert run.returncode == EXIT_OK, run.stdout + run.stderr
    records = sorted(path.name for path in (tmp_path / "multirun").glob("*/*.cpu.json"))
    assert records == sorted(f"{name}.cpu.json" for name in case_names())
