"""The drift check and the table over result records (synthetic records here; the committed matrix in test_committed_matrix)."""

import json
import shutil

import pytest

from harness.cases import ROOT
from harness.matrix import drifts, load_records, main, table

EXPECTATIONS = {
    "autocast_device": [
        {"torch": "<2.4", "devices": ["cpu"], "reproduce": "reproduced", "fix": "passed", "bad_fix:*": "rejected"},
        {"torch": ">=2.4", "devices": ["cpu"], "reproduce": "fixed_upstream", "fix": "passed", "bad_fix:*": "rejected"},
    ]
}


def write_record(folder, torch, reproduce="reproduced", fix="passed", bad_fix="rejected", case="autocast_device", ratio=0.5):
    phases = [
        {"phase": "reproduce", "status": reproduce, "message": reproduce, "figures": {"error": "RuntimeError: x"} if reproduce == "reproduced" else {}},
        {"phase": "fix", "status": fix, "message": fix, "figures": {}},
        {"phase": "speed", "status": "measured", "message": "", "figures": {"ratio": ratio}},
        {"phase": "bad_fix:last_char", "status": bad_fix, "message": bad_fix, "figures": {}},
    ]
    record = {"case": case, "device": "cpu", "environment": {"torch": torch}, "phases": phases}
    path = folder / f"torch-{torch}" / f"{case}.cpu.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


@pytest.fixture
def matrix(tmp_path):
    write_record(tmp_path, "2.3.1+cu121", reproduce="reproduced")
    write_record(tmp_path, "2.4.1+cu121", reproduce="fixed_upstream")
    write_record(tmp_path, "2.13.0+cpu", reproduce="fixed_upstream")
    return tmp_path


def test_records_that_meet_their_expectations_have_no_drift(matrix):
    assert drifts(load_records(matrix), EXPECTATIONS) == []


def test_a_failure_that_started_reproducing_again_is_named(matrix):
    write_record(matrix, "2.5.1", reproduce="reproduced")
    [drift] = drifts(load_records(matrix), EXPECTATIONS)
    assert drift.startswith("autocast_device torch 2.5.1 cpu reproduce: expected fixed_upstream, got reproduced")


@pytest.mark.parametrize(
    ("change", "named"),
    [({"fix": "raised"}, "fix: expected passed, got raised"), ({"bad_fix": "accepted"}, "bad_fix:last_char: expected rejected, got accepted")],
)
def test_a_fix_that_stopped_holding_is_named(tmp_path, change, named):
    write_record(tmp_path, "2.6.0", reproduce="fixed_upstream", **change)
    [drift] = drifts(load_records(tmp_path), EXPECTATIONS)
    assert drift.startswith(f"autocast_device torch 2.6.0 cpu {named}")


def test_a_record_without_an_expectation_is_a_drift(tmp_path):
    write_record(tmp_path, "2.4.1", case="new_case")
    [drift] = drifts(load_records(tmp_path), EXPECTATIONS)
    assert "new_case torch 2.4.1 cpu: no expectation covers this record" in drift


def test_check_command_exit_status(matrix, tmp_path, capsys):
    expectations = tmp_path / "expectations.yaml"
    expectations.write_text(json.dumps(EXPECTATIONS))  # JSON is YAML
    assert main(["check", str(matrix), "--expectations", str(expectations)]) == 0
    record = matrix / "torch-2.13.0+cpu" / "autocast_device.cpu.json"
    altered = json.loads(record.read_text())
    altered["phases"][0]["status"] = "not_reproduced"
    record.write_text(json.dumps(altered))
    assert main(["check", str(matrix), "--expectations", str(expectations)]) == 1
    assert "DRIFT autocast_device torch 2.13.0 cpu reproduce: expected fixed_upstream, got not_reproduced" in capsys.readouterr().out


def test_table_shows_each_version_and_where_behaviour_changed(matrix):
    text = table(load_records(matrix))
    assert "| case | torch 2.3.1 | torch 2.4.1 | torch 2.13.0 |" in text
    assert "| `autocast_device` | reproduced, 0.50x, 1/1 bad fixes rejected |" in text
    assert "- `autocast_device`, torch 2.3.1 -> 2.4.1: reproduced (RuntimeError: x) -> fixed_upstream" in text


def test_bad_arguments_are_refused(tmp_path):
    assert main(["check", str(tmp_path / "missing")]) == 2
    assert main(["table", str(tmp_path)]) == 2


COMMITTED = ROOT / "results" / "matrix"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_committed_matrix_matches_expectations_and_the_doc(capsys):
    assert main(["check", str(COMMITTED)]) == 0
    capsys.readouterr()
    assert main(["table", str(COMMITTED)]) == 0
    assert capsys.readouterr().out == (ROOT / "docs" / "matrix.md").read_text(), "regenerate docs/matrix.md"


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_altering_a_committed_record_is_caught(tmp_path):
    copy = tmp_path / "matrix"
    shutil.copytree(COMMITTED, copy)
    record = next(copy.rglob("embedding_oob.cpu.json"))
    data = json.loads(record.read_text())
    next(phase for phase in data["phases"] if phase["phase"] == "correct")["status"] = "mismatch"
    record.write_text(json.dumps(data))
    assert main(["check", str(copy)]) == 1
