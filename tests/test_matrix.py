"""The drift check, the table and the change report over result records: synthetic ones, the committed matrix, and altered copies of it."""

import ast
import json
import shutil
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.cases import ROOT
from harness.matrix import changes, drifts, extrapolations, load_records, main, table

EXPECTATIONS = {
    "autocast_device": [
        {"torch": "<2.4", "devices": ["cpu"], "reproduce": "reproduced", "fix": "passed", "bad_fix:*": "rejected"},
        {"torch": ">=2.4", "devices": ["cpu"], "reproduce": "fixed_upstream", "fix": "passed", "bad_fix:*": "rejected"},
    ]
}


def write_record(folder, torch, reproduce="reproduced", fix="passed", bad_fix="rejected", case="autocast_device", ratio=0.5, interval=None):
    speed = {"ratio": ratio} | ({"ratio_low": interval[0], "ratio_high": interval[1]} if interval else {})
    phases = [
        {
            "phase": "reproduce",
            "status": reproduce,
            "message": reproduce,
            "figures": {"error": "RuntimeError: x"} if reproduce == "reproduced" else {},
        },
        {"phase": "fix", "status": fix, "message": fix, "figures": {}},
        {"phase": "speed", "status": "measured", "message": "", "figures": speed},
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
    [
        ({"fix": "raised"}, "fix: expected passed, got raised"),
        ({"bad_fix": "accepted"}, "bad_fix:last_char: expected rejected, got accepted"),
    ],
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
    assert "| case | compile | torch 2.3.1 | torch 2.4.1 | torch 2.13.0 |" in text
    assert "| `autocast_device` | eager | reproduced, 0.50x, 1/1 bad fixes rejected |" in text
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


# -- a torch newer than any an expectation was established on ------------------------------

ESTABLISHED = {
    "autocast_device": [
        {"torch": "<2.4", "established": ["2.3.1"], "devices": ["cpu"], "reproduce": "reproduced", "fix": "passed"},
        {"torch": ">=2.4", "established": ["2.4.1", "2.13.0"], "devices": ["cpu"], "reproduce": "fixed_upstream", "fix": "passed"},
    ]
}


def _check(records, expectations, tmp_path, capsys):
    path = tmp_path / "expectations.yaml"
    path.write_text(json.dumps(expectations))
    code = main(["check", str(records), "--expectations", str(path)])
    return code, capsys.readouterr().out


def test_a_record_within_the_established_versions_is_not_extrapolated(matrix):
    assert extrapolations(load_records(matrix), ESTABLISHED) == []


def test_a_newer_torch_is_judged_by_the_newest_range_and_the_check_says_it_extrapolated(tmp_path, capsys):
    records = tmp_path / "records"
    write_record(records, "2.16.0+cu130", reproduce="fixed_upstream")
    code, out = _check(records, ESTABLISHED, tmp_path, capsys)
    assert code == 0
    assert (
        "EXTRAPOLATED autocast_device torch 2.16.0 cpu: judged by the entry for torch >=2.4 on cpu, "
        "established on torch 2.4.1, 2.13.0, newer than all of them"
    ) in out
    assert out.splitlines()[-1] == "1 records, 0 drifts from expectations.yaml, 1 judged by extrapolation, 0 inconclusive speed verdicts"


def test_a_behaviour_change_at_a_new_torch_is_a_drift_with_outcomes_error_and_speed_interval(tmp_path, capsys):
    records = tmp_path / "records"
    path = write_record(records, "2.16.0", reproduce="reproduced", interval=(0.45, 0.55))
    data = json.loads(path.read_text())
    data["phases"][0]["message"] = "RuntimeError: User specified an unsupported autocast device_type 'cpu:0'"
    path.write_text(json.dumps(data))
    code, out = _check(records, ESTABLISHED, tmp_path, capsys)
    assert code == 1
    [drift] = [line for line in out.splitlines() if line.startswith("DRIFT")]
    assert drift == (
        "DRIFT autocast_device torch 2.16.0 cpu reproduce: expected fixed_upstream, got reproduced "
        "(RuntimeError: User specified an unsupported autocast device_type 'cpu:0'); speed 0.50x [0.45, 0.55]; "
        "judged by extrapolation from the entry for torch >=2.4 on cpu, established on torch 2.4.1, 2.13.0"
    )


def test_a_nightly_falls_in_the_range_of_the_release_it_leads_to(tmp_path):
    records = tmp_path / "records"
    write_record(records, "2.17.0.dev20260301+cpu", reproduce="fixed_upstream")
    assert drifts(load_records(records), ESTABLISHED) == []
    [line] = extrapolations(load_records(records), ESTABLISHED)
    assert line.startswith("autocast_device torch 2.17.0.dev20260301 cpu: judged by the entry for torch >=2.4")


def test_an_entry_without_established_versions_always_says_it_extrapolates(matrix):
    assert len(extrapolations(load_records(matrix), EXPECTATIONS)) == 3


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_each_entry_lists_exactly_the_committed_versions_it_was_established_on():
    expectations = yaml.safe_load((ROOT / "expectations.yaml").read_text())
    records = load_records(COMMITTED)  # read once: once an entry, they took 16 s of the README's test command
    for case, entries in expectations.items():
        for entry in entries:
            specifier = SpecifierSet(entry["torch"])
            modes = entry.get("compile", ["off"])
            matching = {
                r.torch for r in records if r.case == case and r.device in entry["devices"] and r.compile in modes and r.torch in specifier
            }
            assert sorted(entry["established"], key=Version) == sorted(matching, key=Version), f"{case} {entry['torch']}"


# -- the change report ---------------------------------------------------------------------

AUTOCAST = "autocast_device/autocast_device.cpu.json"


def _changes(old, new, capsys, *options):
    code = main(["changes", str(old), str(new), *options])
    return code, capsys.readouterr().out


def _alter(folder, case, edit):
    path = folder / case / f"{case}.cpu.json"
    data = json.loads(path.read_text())
    edit({phase["phase"]: phase for phase in data["phases"]})
    path.write_text(json.dumps(data))


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_change_report_on_autocast_device_across_torch_2_4(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    for folder, version in ((old, "2.3.1"), (new, "2.4.1")):
        (folder / AUTOCAST).parent.mkdir(parents=True)
        shutil.copy(COMMITTED / "cpu" / f"torch-{version}" / AUTOCAST, folder / AUTOCAST)
    code, out = _changes(old, new, capsys)
    assert code == 1
    assert out.startswith("## What changed from torch 2.3.1 to torch 2.4.1\n")
    assert "### `autocast_device` on cpu, torch 2.3.1 -> 2.4.1" in out
    assert "- `reproduce`: reproduced -> fixed_upstream: `buggy ran without error, as expected on torch 2.4.1" in out
    assert (
        "  - before: `RuntimeError: User specified an unsupported autocast device_type 'cpu:0'`\n  - after: none (no error recorded)" in out
    )
    assert "speed" not in out and "fix`" not in out and "bad_fix" not in out  # 0.509x and 0.512x, every other phase alike


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_no_change_is_exactly_one_line(tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(Path(__file__).parent / "matrix_records" / "torch-2.15.0", copy)
    code, out = _changes(Path(__file__).parent / "matrix_records" / "torch-2.15.0", copy, capsys)
    assert code == 0
    assert out.count("\n") == 1 and out.startswith("no change from torch 2.15.0 (")


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
def test_change_report_names_an_altered_speed_symptom_and_status(tmp_path, capsys):
    old = Path(__file__).parent / "matrix_records" / "torch-2.15.0"
    new = tmp_path / "new"
    shutil.copytree(old, new)
    _alter(new, "class_weight_index", lambda phases: phases["speed"]["figures"].update(ratio=phases["speed"]["figures"]["ratio"] * 1.5))
    _alter(
        new,
        "codebook_oob",
        lambda phases: phases["reproduce"]["figures"].update(
            error="IndexError: index 4097 is out of bounds for dimension 0 with size 4096"
        ),
    )
    _alter(new, "embedding_oob", lambda phases: phases["correct"].update(status="mismatch", message="max abs diff 0.5"))
    code, out = _changes(old, new, capsys)
    assert code == 1
    assert (
        "- speed: 1.48x -> 2.22x (+50%): beyond the 20% threshold used where a record has no interval (status over_budget -> over_budget)"
        in out
    )
    assert (
        "- symptom text:\n  - before: `IndexError: index out of range in self`\n"
        "  - after: `IndexError: index 4097 is out of bounds for dimension 0 with size 4096`"
    ) in out
    assert "### `embedding_oob` on cpu, torch 2.15.0 -> 2.15.0\n\n- `correct`: passed -> mismatch: `max abs diff 0.5`\n" in out
    assert "autocast_device" not in out and "multigpu_segfault" not in out
    assert _changes(old, new, capsys, "--threshold", "0.6")[1].count("- speed") == 0


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="no committed matrix records")
@pytest.mark.parametrize(
    ("old_interval", "new_ratio", "new_interval", "reported"),
    [
        ((0.48, 0.54), 0.70, (0.50, 0.90), None),  # +37% but the intervals overlap: noise
        ((0.50, 0.52), 0.54, (0.53, 0.55), "- speed: 0.51x [0.50, 0.52] -> 0.54x [0.53, 0.55]: the intervals no longer overlap"),
        (None, 0.54, (0.53, 0.55), None),  # the old record has no interval: +6%, under the threshold
        (None, 0.70, (0.69, 0.71), "- speed: 0.51x -> 0.70x [0.69, 0.71] (+38%): beyond the 20% threshold"),
    ],
)
def test_speed_is_compared_by_interval_overlap_where_both_records_have_one(
    tmp_path, capsys, old_interval, new_ratio, new_interval, reported
):
    old, new = tmp_path / "old", tmp_path / "new"
    for folder in (old, new):
        shutil.copytree(
            Path(__file__).parent / "matrix_records" / "torch-2.15.0" / "autocast_device", folder / "autocast_device"
        )  # ratio 0.509
    if old_interval:
        _alter(
            old, "autocast_device", lambda phases: phases["speed"]["figures"].update(ratio_low=old_interval[0], ratio_high=old_interval[1])
        )
    _alter(
        new,
        "autocast_device",
        lambda phases: phases["speed"]["figures"].update(ratio=new_ratio, ratio_low=new_interval[0], ratio_high=new_interval[1]),
    )
    code, out = _changes(old, new, capsys)
    if reported:
        assert code == 1 and reported in out, out
    else:
        assert code == 0 and out.startswith("no change"), out


def test_change_report_names_a_case_missing_from_either_set(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    write_record(old, "2.15.0", case="embedding_oob")
    write_record(new, "2.16.0", case="codebook_oob")
    text = "\n".join(changes(load_records(old), load_records(new)))
    assert "### `embedding_oob` on cpu\n\n- no record in the new set (the old one is from torch 2.15.0)" in text
    assert "### `codebook_oob` on cpu\n\n- no record in the old set (the new one is from torch 2.16.0)" in text


def test_change_report_refuses_a_missing_or_empty_folder(tmp_path, capsys):
    write_record(tmp_path / "old", "2.15.0")
    assert main(["changes", str(tmp_path / "old"), str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["changes", str(tmp_path / "old"), str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"error: {tmp_path / 'missing'} is not a folder of records",
        f"error: no harness records under {tmp_path / 'empty'}",
    ]


# -- the hosted workflow runs what the noxfile defines --------------------------------------


def _noxfile_constant(name):
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == name)


def test_workflow_runs_every_pinned_version_and_latest_and_a_nightly_that_cannot_fail_it():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "matrix.yml").read_text())
    jobs = workflow["jobs"]
    extra = sorted(
        {v for path in (ROOT / "conf" / "case").glob("*.yaml") for v in yaml.safe_load(path.read_text()).get("extra_torch", [])},
        key=Version,
    )
    assert extra == ["1.13.1", "2.0.1"]  # zero_grad_set_to_none's, either side of torch 2.0
    assert jobs["run"]["strategy"]["matrix"]["torch"] == [*_noxfile_constant("TORCH_VERSIONS"), *extra, _noxfile_constant("LATEST")]
    assert jobs["nightly"]["continue-on-error"] is True
    assert "nox -s nightly" in [step.get("run") for step in jobs["nightly"]["steps"]]
    assert set(jobs["check"]["needs"]) == {"run", "nightly"} and jobs["check"]["if"] == "always()"
    steps = {step.get("name"): step for step in jobs["check"]["steps"]}
    assert "python -m harness.matrix changes" in steps["Change reports"]["run"]
    assert steps["Open or update the issue"]["if"] == "github.event_name == 'schedule' && steps.changes.outputs.changed == 'true'"
    assert jobs["check"]["steps"][-1]["name"] == "Check (the gate)"


def _compiled_abort(folder, torch, what, status="aborted"):
    """A compiled record whose reproduce died natively (or raised) with inductor's bounds check."""
    reproduce = {
        "phase": "reproduce",
        "status": status,
        "message": f"SIGABRT under inductor: {what}" if status == "aborted" else what,
        "figures": {
            "error": None if status == "aborted" else what,
            "native_message": ["terminate called after throwing an instance of 'c10::Error'", f"  {what}"] if status == "aborted" else None,
        },
    }
    record = {"case": "embedding_oob", "device": "cpu", "compile": "inductor", "environment": {"torch": torch}, "phases": [reproduce]}
    path = folder / f"torch-{torch}" / "inductor" / "embedding_oob.cpu.inductor.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("older", "newer", "changed"),
    [
        (
            "what():  index out of bounds: 0 <= tmp4 < 1583L",
            "what():  index out of bounds: 0 <= tmp8 < 1583L",
            False,
        ),  # a renamed temporary
        (
            "what():  kernel, main.cpp:29, index out of bounds: 0 <= tmp8 < 1583L",
            "what():  kernel, main.cpp:26, index out of bounds: 0 <= tmp3 < 1583L",
            False,
        ),
        (
            "what():  index out of bounds: 0 <= tmp8 < 1583L",
            "what():  kernel, main.cpp:29, index out of bounds: 0 <= tmp8 < 1583L",
            False,
        ),  # the generated kernel's location, printed from torch 2.9
        (
            'File "threading.py"  what():  , line index out of bounds: 0 <= tmp8 < 1583L',
            "what():  index out of bounds: 0 <= tmp4 < 1583L",
            False,
        ),  # faulthandler's line written into the middle
        (
            "what():  index out of bounds: 0 <= tmp8 < 1583L",
            "what():  index out of bounds: 0 <= tmp8 < 4096L",
            True,
        ),  # another bound: another table
        ("what():  index out of bounds: 0 <= tmp8 < 1583L", "what():  unsupported dtype Long", True),
    ],
)
def test_generated_names_and_locations_are_no_change_in_the_table_or_the_report(tmp_path, capsys, older, newer, changed):
    _compiled_abort(tmp_path / "old", "2.9.1", older)
    _compiled_abort(tmp_path / "new", "2.11.0", newer)
    shutil.copytree(tmp_path / "new" / "torch-2.11.0", tmp_path / "old" / "torch-2.11.0")
    listed = table(load_records(tmp_path / "old")).split("Where behaviour changed between adjacent versions")[1]
    assert ("- `embedding_oob` under inductor, torch 2.9.1 -> 2.11.0" in listed) == changed, listed
    code, out = _changes(tmp_path / "old" / "torch-2.9.1", tmp_path / "new", capsys)
    assert (code, "symptom text" in out) == ((1, True) if changed else (0, False)), out


def test_a_new_outcome_with_the_same_text_is_a_change(tmp_path, capsys):
    _compiled_abort(tmp_path / "old", "2.4.1", "index out of bounds: 0 <= tmp7 < 4096L")
    _compiled_abort(tmp_path / "new", "2.6.0", "RuntimeError: index out of bounds: 0 <= tmp7 < 4096L", status="raised")
    code, out = _changes(tmp_path / "old", tmp_path / "new", capsys)
    assert code == 1 and "- `reproduce`: aborted -> raised" in out, out


def test_a_fix_over_its_memory_budget_shows_in_the_table(tmp_path):
    for version, memory in (("2.6.0", "over_budget"), ("2.9.1", "within_budget")):
        phases = [
            {"phase": "reproduce", "status": "reproduced", "message": "", "figures": {}},
            {"phase": "memory", "status": memory, "message": memory, "figures": {}},
        ]
        record = {"case": "graph_kept_alive", "device": "cpu", "compile": "inductor", "environment": {"torch": version}, "phases": phases}
        (tmp_path / version).mkdir()
        (tmp_path / version / "graph_kept_alive.cpu.inductor.json").write_text(json.dumps(record))
    row = next(line for line in table(load_records(tmp_path)).splitlines() if line.startswith("| `graph_kept_alive`"))
    assert row == "| `graph_kept_alive` | inductor | reproduced, **memory over budget** | reproduced |"


def test_a_record_in_a_newer_format_is_refused_by_name_and_one_without_a_format_is_read(matrix, capsys):
    from harness.recordset import RECORD_FORMAT

    assert len(load_records(matrix)) == 3  # written without format_version, as every record before it existed
    path = write_record(matrix, "2.15.0+cpu")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"format_version": RECORD_FORMAT + 1}))
    assert main(["check", str(matrix)]) == 2
    said = capsys.readouterr().err
    assert str(path) in said and f"record format {RECORD_FORMAT + 1}" in said


def test_a_written_record_carries_its_format_and_is_read_back(tmp_path):
    from harness.records import CaseRecord, load_record
    from harness.records import write_record as write_case_record
    from harness.recordset import RECORD_FORMAT

    path = tmp_path / "r.json"
    write_case_record(
        CaseRecord(case="embedding_oob", title="t", device="cpu", started_at="now", environment={"torch": "2.13.0"}, config={}), path
    )
    assert json.loads(path.read_text())["format_version"] == RECORD_FORMAT
    assert load_record(path).format_version == RECORD_FORMAT
