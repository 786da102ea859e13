"""Grading a fix written by someone else: accepted, rejected by which check, and attacks on the grader.

The fixes are in tests/fixes/. Each test copies its file into tmp_path (some attacks leave files beside
themselves) and grades one function through `run_case`, in the harness's isolated children as from
the command line, with only the phases it needs; the command line itself is tested at the end.
"""

import copy
import inspect
import io
import json
import shutil
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from harness.cases import ROOT, Growth, Slow, Symptom, case_names, load_case, symptom_on
from harness.grading import grade
from harness.measure.compare import flatten_tensors, named_tensors
from harness.phases import speed_config
from harness.process.submitted import file_sha256
from harness.records import load_record
from harness.run import ConfigError, run_case, validate
from tests.conftest import cases_failing_in_value, compose_config, failure_on_cpu_is

FIXES = ROOT / "tests" / "fixes"
FAST = ("speed.process_s=0.1", "speed.warmup=0")


def graded(tmp_path, environment, case, fixes_file, function, phases, *overrides):
    """Grade `function` of a copy of tests/fixes/`fixes_file`: (verdict, record, record path, the copy)."""
    copy = tmp_path / fixes_file
    if not copy.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXES / fixes_file, copy)
    cfg = compose_config(
        f"case={case}", "device=cpu", f"phases=[{','.join(phases)}]", f"fix={copy}:{function}", "timeout_s=120", *FAST, *overrides
    )
    record, path = run_case(cfg, "cpu", tmp_path / "run", environment)
    return grade.verdict(record), record, path, copy


def phase(record, name):
    return next(p for p in record.phases if p.phase == name)


def first_failure(verdict):
    return verdict.line.removeprefix("rejected by ").split(": ")[0]


# -- accepted, rejected ---------------------------------------------------------------------------


def test_an_alternative_correct_fix_is_accepted_and_the_record_names_it(tmp_path, environment):
    phases = ["reproduce", "fix", "correct", "bad_fixes", "slow_fixes", "memory_fixes"]  # the case's controls are left out of a grade
    verdict, record, path, copy = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "by_searchsorted", phases)
    assert verdict.accepted, verdict.line
    assert [p.status for p in record.phases] == ["reproduced", "passed", "passed", "passed", "passed"]
    assert record.phases[-1].phase == "integrity" and record.phases[-1].figures["sources"] > 30
    assert phase(record, "correct").figures["seed"] == record.config["case"]["seed"]  # the published inputs, then private ones
    assert phase(record, "correct:second_inputs").figures["seed"] != record.config["case"]["seed"]
    on_disk = json.loads(path.read_text())
    assert on_disk["graded_fix"] == {"path": str(copy), "function": "by_searchsorted", "sha256": file_sha256(copy)}
    assert on_disk["verdict"].startswith("accepted")
    assert load_record(path).graded_fix.sha256 == file_sha256(copy)


def test_old_records_without_a_graded_fix_still_load():
    old = next((ROOT / "results" / "matrix" / "cpu").glob("*/embedding_oob/*.json"))
    record = load_record(old)
    assert record.graded_fix is None and record.verdict is None and record.phases


def test_a_wrong_fix_is_rejected_by_correctness(tmp_path, environment):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "clamp_to_table", ["fix", "correct"])
    assert not verdict.accepted and first_failure(verdict) == "correct"
    assert phase(record, "correct").status == "mismatch" and "differs from the reference" in verdict.line


def test_a_fix_shown_wrong_is_not_timed_nor_checked_again_and_the_verdict_names_only_what_showed_it(tmp_path, environment):
    verdict, record, _, _ = graded(
        tmp_path, environment, "embedding_oob", "embedding_fixes.py", "clamp_to_table", ["fix", "correct", "speed"]
    )
    speed = phase(record, "speed")
    assert (speed.status, speed.ok, speed.seconds) == ("not_timed", False, 0.0), speed.message
    assert "correct: mismatch" in speed.message and "ratio" not in speed.figures
    assert first_failure(verdict) == "correct" and "speed" not in verdict.line
    assert "correct:second_inputs" not in [p.phase for p in record.phases]  # other inputs would decide nothing more


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_a_slow_fix_is_rejected_by_speed(tmp_path, environment):
    verdict, record, _, _ = graded(
        tmp_path, environment, "embedding_oob", "embedding_fixes.py", "twice_as_slow", ["fix", "correct", "speed"]
    )
    speed = phase(record, "speed")
    assert (speed.status, first_failure(verdict)) == ("over_budget", "speed"), speed.message
    assert speed.figures["ratio"] > speed.figures["budget"] == 1.15


@pytest.fixture(scope="module")
def searchsorted_speed(environment, tmp_path_factory):
    """One speed grade of an alternative as fast as `fixed`, shared by the tests that read different things of it."""
    return graded(
        tmp_path_factory.mktemp("searchsorted_speed"), environment, "embedding_oob", "embedding_fixes.py", "by_searchsorted", ["speed"]
    )


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_speed_times_the_submitted_fix_against_the_model_solution(searchsorted_speed):
    # by_searchsorted does what `fixed` does: the ratio is near 1, not the guard-vs-no-guard ratio of the case's own speed phase
    _, record, _, _ = searchsorted_speed
    assert 0.4 < phase(record, "speed").figures["ratio"] < 2.5


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_a_grade_that_cannot_tell_is_rejected_as_undecided_never_accepted(tmp_path, environment):
    # a fix as fast as the model solution against a budget of 1.0x: the interval straddles it, and the grading limit is short
    verdict, record, _, _ = graded(
        tmp_path,
        environment,
        "embedding_oob",
        "embedding_fixes.py",
        "by_searchsorted",
        ["speed"],
        "case.speed.budget.cpu=1.0",
        "speed.grade_max_s=0.01",
        "speed.grade_min_processes=2",
    )
    speed = phase(record, "speed")
    assert speed.status == "undecided" and not speed.ok and not verdict.accepted, verdict.line
    assert verdict.line.startswith("rejected by speed: undecided: ") and "speed.grade_max_s" in verdict.line


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_the_model_solution_is_timed_apart_and_beside_a_pristine_copy(searchsorted_speed):
    _, record, _, _ = searchsorted_speed
    figures = phase(record, "speed").figures
    assert figures["baseline_vs_pristine"]["ratio_low"] <= 1.25 and set(figures["cpu_share"]) == {"candidate", "baseline", "pristine"}
    assert "changed_on_import" not in figures and not figures.get("changed_by_its_calls")


# -- attacks --------------------------------------------------------------------------------------


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_a_remembered_result_fails_the_check_of_the_timed_calls(tmp_path, environment):
    # it computes once per process, on the warm-up inputs, and returns that for the timed inputs too
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "remembers_its_result", ["speed"])
    speed = phase(record, "speed")
    assert speed.status == "timed_output_wrong" and not verdict.accepted, speed.message
    assert speed.figures["timed_outputs_wrong"] == speed.figures["timed_outputs_checked"] > 0


def test_a_result_saved_for_replay_is_refused_and_named(tmp_path, environment):
    verdict, record, _, copy = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "replays_from_disk", ["correct"])
    assert not copy.with_suffix(".saved.pt").exists()  # the graded process may write only beneath its scratch directory
    assert (
        phase(record, "correct").status == "raised" and "Permission denied" in phase(record, "correct").message
    )  # torch.save writes from C++
    assert (
        first_failure(verdict) == "correct"
        and "writes outside its scratch directory, and signals to processes not its own, are refused while grading" in verdict.line
    ), verdict.line


def test_patching_the_comparison_in_its_own_process_changes_nothing(tmp_path, environment):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "patches_the_comparison", ["correct"])
    assert phase(record, "correct").status == "mismatch", phase(record, "correct").message
    assert not verdict.accepted


def test_a_fix_that_changes_its_inputs_in_place_is_caught(tmp_path, environment):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "zeroes_its_inputs", ["correct"])
    correct = phase(record, "correct")
    assert correct.status == "changed_inputs" and correct.figures["changed"] == ["inputs.features"], correct.message


@pytest.mark.parametrize(
    ("function", "evidence"),
    [
        ("in_float64", "dtype float64, the reference float32"),
        ("as_a_list", "returned list, not tensors"),
        ("returns_nothing", "returned NoneType"),
    ],
)
def test_an_output_of_the_wrong_kind_is_caught(tmp_path, environment, function, evidence):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", function, ["correct"])
    assert phase(record, "correct").status == "wrong_output" and evidence in verdict.line, verdict.line


def test_an_output_that_aliases_an_input_is_caught(tmp_path, environment):
    verdict, record, _, _ = graded(
        tmp_path, environment, "class_weight_index", "class_weight_fixes.py", "returns_a_view_of_its_input", ["correct"]
    )
    correct = phase(record, "correct")
    assert correct.status == "aliases_input" and correct.figures["aliased"] == "inputs.pred", correct.message


def test_a_fix_that_changes_a_module_it_was_given_is_caught(tmp_path, environment):
    verdict, record, _, _ = graded(
        tmp_path, environment, "class_weight_index", "class_weight_fixes.py", "retunes_the_loss_module", ["correct"]
    )
    correct = phase(record, "correct")
    assert correct.status == "changed_inputs" and correct.figures["changed"] == ["inputs.loss.loss_weight"], correct.message


def test_the_correct_class_weight_fix_is_accepted(tmp_path, environment):
    verdict, _, _, _ = graded(tmp_path, environment, "class_weight_index", "class_weight_fixes.py", "weighted_mean", ["fix", "correct"])
    assert verdict.accepted, verdict.line


@pytest.mark.parametrize(
    ("function", "status", "evidence"),
    [
        ("segfaults", "crashed", "killed by SIGSEGV"),
        ("exits_quietly", "crashed", "exited with code 0"),
        ("calls_sys_exit", "raised", "SystemExit"),
    ],
)
def test_a_crash_is_a_verdict(tmp_path, environment, function, status, evidence):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", function, ["fix", "correct"])
    assert (phase(record, "fix").status, first_failure(verdict)) == (status, "fix")
    assert evidence in verdict.line and phase(record, "correct").status == status


def test_a_hang_is_a_timeout(tmp_path, environment):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "hangs", ["fix"], "timeout_s=3")
    assert phase(record, "fix").status == "timeout" and verdict.line.startswith("rejected by fix: timeout")


def test_a_malicious_pickle_from_the_graded_process_is_not_unpickled(tmp_path, environment):
    verdict, record, _, copy = graded(
        tmp_path, environment, "embedding_oob", "embedding_fixes.py", "sends_a_malicious_pickle", ["fix", "correct"]
    )
    assert not copy.with_suffix(".pwned").exists()
    assert not verdict.accepted
    assert "not plain data" in phase(record, "correct").message, phase(record, "correct").message


def test_what_the_buggy_code_s_classes_call_is_not_the_model_solution():
    """A fix may reuse what the buggy code reaches through the classes it uses (a Dataset's __getitem__ and its helpers),
    and only what the solution alone reaches is behind the tripwires."""
    from harness.cases import reachable
    from harness.process.submitted import solution_functions

    module = load_case("dataloader_worker_killed")
    names = lambda functions: {function.__name__ for function in functions}  # noqa: E731
    buggy_direct, buggy_classes = names(reachable(module, [module.buggy])), names(reachable(module, [module.buggy], through_classes=True))
    assert {"frame_tensors", "__getitem__"} <= buggy_classes - buggy_direct  # reached only through the Dataset class
    assert names(solution_functions(module)) == {"fixed", "reference"}


@pytest.mark.parametrize("function", ["calls_the_case_fixed", "calls_the_case_reference", "swallows_the_tripwire"])
def test_calling_the_case_s_own_solution_is_caught(tmp_path, environment, function):
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", function, ["fix"])
    assert phase(record, "fix").status == "raised" and "ModelSolutionCalled" in verdict.line, verdict.line


def test_submitting_the_model_solution_itself_is_caught(tmp_path, environment):
    # codebook_oob's fixed calls no helper the bug lacks: the tripwire on `fixed` itself catches it
    verdict, record, _, _ = graded(tmp_path, environment, "codebook_oob", "codebook_fixes.py", "fix", ["fix"])
    assert "ModelSolutionCalled" in verdict.line, verdict.line


@pytest.mark.slow  # a speed grade (three timing children per process), as the exploit suite's speed attacks: 7 to 25 s
def test_the_speed_baseline_still_runs_the_model_solution_behind_the_tripwires(searchsorted_speed):
    # embedding_oob's fixed calls encode_emotion, tripwired in the graded process: outside the submitted call it must run
    _, record, _, _ = searchsorted_speed
    assert phase(record, "speed").status == "within_budget", phase(record, "speed").message


# -- the judge, on its own ------------------------------------------------------------------------


def _sent(output, inputs):
    buffer = io.BytesIO()
    torch.save({"output": output, "inputs": grade.snapshot(inputs)}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_where_the_model_solution_misses_the_reference_too_the_output_is_judged_against_it():
    want, solution = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.5])  # the model solution misses the reference
    status, _, figures = grade.judge([torch.tensor([1.0, 2.5])], want, {}, {}, atol=1e-3, rtol=0, model_solution=lambda: solution)
    assert status == "passed" and figures["judged_against"] == "model_solution"
    assert figures["reference_excess"] == figures["model_solution_excess"] == pytest.approx(500.0)
    status, _, figures = grade.judge([torch.tensor([1.0, 3.0])], want, {}, {}, atol=1e-3, rtol=0, model_solution=lambda: solution)
    assert status == "mismatch" and "judged_against" not in figures and figures["model_solution_excess"] == pytest.approx(500.0)
    status, _, figures = grade.judge([torch.tensor([1.0, 2.5])], want, {}, {}, atol=1e-3, rtol=0, model_solution=lambda: want.clone())
    assert status == "mismatch" and figures["model_solution_used"] == 0.0  # inputs that decide: the reference judges
    asked = []
    grade.judge([want.clone()], want, {}, {}, atol=1e-3, rtol=0, model_solution=lambda: asked.append(1))
    assert asked == []  # run only where the output misses


@pytest.mark.slow  # two grades of fix and correct, about 15 s each
@pytest.mark.untimed
def test_on_inputs_where_the_model_solution_misses_its_reference_a_right_fix_passes_and_a_wrong_one_does_not(tmp_path, environment):
    """attention_fully_masked_rows at seed 1001: one ReLU of the first encoder block flips in float32 where the float64
    reference's does not (`python -m harness.seed_sweep`: 35x the tolerance, the only one of seeds 1000-1099)."""
    seed = ("case.seed=1001",)
    fix = "alternatives/attention_fully_masked_rows.py"
    verdict, record, _, _ = graded(
        tmp_path / "right", environment, "attention_fully_masked_rows", fix, "attention_fully_masked_rows", ["fix", "correct"], *seed
    )
    assert verdict.accepted, verdict.line
    judged = phase(record, "correct")
    assert judged.figures["judged_against"] == "model_solution" and judged.figures["reference_excess"] > 10, judged.figures
    assert "misses the reference on these inputs as well" in judged.message
    upstream = "upstream/attention_fully_masked_rows.py"
    verdict, record, _, _ = graded(
        tmp_path / "wrong", environment, "attention_fully_masked_rows", upstream, "pyg_pr_7902_nan_to_num", ["fix", "correct"], *seed
    )
    assert verdict.line.startswith("rejected by correct: mismatch: "), verdict.line
    assert "judged_against" not in phase(record, "correct").figures


@pytest.mark.slow  # the reference and the model solution of two timed outputs, in this process: about 10 s
@pytest.mark.untimed
def test_a_timed_output_on_inputs_the_model_solution_misses_is_judged_against_it(tmp_path):
    from harness.grading.judge import _judge_timed_in_child

    case = load_case("attention_fully_masked_rows")
    cfg = OmegaConf.merge(compose_config("case=attention_fully_masked_rows").case, {"seed": 0})
    right = case.fixed(case.make_inputs(OmegaConf.merge(cfg, {"seed": 1001}), "cpu"))
    torch.save(flatten_tensors(right), tmp_path / "right.pt")
    torch.save([t * 1.01 if t.is_floating_point() else t for t in flatten_tensors(right)], tmp_path / "wrong.pt")
    kept = [{"seed": 1001, "process": 0, "block": 0, "path": str(tmp_path / "right.pt")}]
    assert _judge_timed_in_child(cfg, "cpu", None, kept, 1) == (0, "")
    wrong_kept = [{**kept[0], "path": str(tmp_path / "wrong.pt")}]
    count, message = _judge_timed_in_child(cfg, "cpu", None, wrong_kept, 1)
    assert count == 1 and "mismatch" in message, message
    # an output holding a None (a gradient never computed) is kept flattened: the reference is flattened alike
    case = load_case("batchnorm_single_sample")
    cfg = OmegaConf.merge(compose_config("case=batchnorm_single_sample").case, {"seed": 0})
    right = case.fixed(case.make_inputs(OmegaConf.merge(speed_config(cfg, "cpu"), {"seed": 1001}), "cpu"))
    assert any(tensor is None for _, tensor in named_tensors(right))
    torch.save(flatten_tensors(right), tmp_path / "with_none.pt")
    assert _judge_timed_in_child(cfg, "cpu", None, [{**kept[0], "path": str(tmp_path / "with_none.pt")}], 1) == (0, "")
    # a stateful case: the checked call is the third on its process's inputs; the judge replays the two before it
    case = load_case("backward_twice")
    cfg = OmegaConf.merge(compose_config("case=backward_twice").case, {"seed": 0})
    state = case.make_inputs(OmegaConf.merge(speed_config(cfg, "cpu"), {"seed": 1001}), "cpu")
    case.fixed(state), case.fixed(state)
    third = flatten_tensors(case.fixed(state))
    torch.save(third, tmp_path / "third.pt")
    torch.save([t * 1.01 if t.is_floating_point() else t for t in third], tmp_path / "third_wrong.pt")
    at_step = {**kept[0], "step": 2}
    assert _judge_timed_in_child(cfg, "cpu", None, [{**at_step, "path": str(tmp_path / "third.pt")}], 1) == (0, "")
    count, message = _judge_timed_in_child(cfg, "cpu", None, [{**at_step, "path": str(tmp_path / "third_wrong.pt")}], 1)
    assert count == 1 and "mismatch" in message, message


def test_the_judge_sees_a_changed_parameter_buffer_or_attribute_of_a_module():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in grade.snapshot((module,)).items()}
    want = [torch.ones(2)]
    for change, path in [
        (lambda m: m[0].weight.data.add_(1), "inputs[0].0.weight"),
        (lambda m: m[1].running_mean.fill_(3), "inputs[0].1.running_mean"),
        (lambda m: m.eval(), "inputs[0].training"),
    ]:
        changed = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        changed.load_state_dict(module.state_dict())
        change(changed)
        sent = _sent([torch.ones(2)], (changed,))
        status, message, _ = grade.judge(sent["output"], want, sent["inputs"], pristine, atol=0, rtol=0)
        assert status == "changed_inputs" and path in message, (path, message)


def test_the_judge_sees_a_renamed_key_a_state_dicts_metadata_and_an_emptied_or_filled_container():
    """A key renamed in place (torch's consume_prefix_in_state_dict_if_present on the caller's dict), a state dict's
    `_metadata` renamed through a shallow copy that shares it, and what goes into or out of an empty container."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    def inputs():
        torch.manual_seed(0)
        state_dict = nn.DataParallel(nn.Linear(2, 2)).state_dict()  # keys `module.weight`, `module.bias`; `_metadata`
        return {"state_dict": state_dict, "names": [], "options": {}, "extra": {"kept": {}}}

    def on_a_shallow_copy(x):
        consume_prefix_in_state_dict_if_present(copy.copy(x["state_dict"]), "module.")

    def moved(x):
        x["extra"]["moved"] = x["extra"].pop("kept")

    pristine = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in grade.snapshot(inputs()).items()}
    unchanged = _sent([torch.ones(2)], inputs())
    assert grade.judge(unchanged["output"], [torch.ones(2)], unchanged["inputs"], pristine, atol=0, rtol=0)[0] == "passed"
    for change, path in [
        (lambda x: consume_prefix_in_state_dict_if_present(x["state_dict"], "module."), "inputs['state_dict']['module.weight']"),
        (on_a_shallow_copy, "inputs['state_dict']._metadata['module']"),
        (lambda x: x["names"].append("seen"), "inputs['names']"),
        (lambda x: x["options"].update(cache=1), "inputs['options']"),
        (moved, "inputs['extra']['kept']"),
    ]:
        x = inputs()
        change(x)
        sent = _sent([torch.ones(2)], x)
        status, message, figures = grade.judge(sent["output"], [torch.ones(2)], sent["inputs"], pristine, atol=0, rtol=0)
        assert status == "changed_inputs" and any(changed.startswith(path) for changed in figures["changed"]), (
            path,
            figures.get("changed"),
        )


def test_storage_shared_with_an_input_survives_the_trip_between_processes():
    features = torch.arange(6.0)
    sent = _sent([features[2:4]], {"features": features})
    status, _, figures = grade.judge(sent["output"], [torch.tensor([2.0, 3.0])], sent["inputs"], sent["inputs"], atol=0, rtol=0)
    assert (status, figures["aliased"]) == ("aliases_input", "inputs['features']")
    unshared = _sent([features[2:4].clone()], {"features": features})
    assert (
        grade.judge(unshared["output"], [torch.tensor([2.0, 3.0])], unshared["inputs"], unshared["inputs"], atol=0, rtol=0)[0] == "passed"
    )


# -- exercises and hints --------------------------------------------------------------------------


RUN_EACH_AS_MAIN = """
import contextlib, io, json, runpy, sys, traceback
ran = {}
for path in sys.argv[1:]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        ran[path] = [0, out.getvalue()]
    except BaseException:
        ran[path] = [1, out.getvalue() + traceback.format_exc()]
print(json.dumps(ran))
"""


@pytest.fixture(scope="module")
def starters(tmp_path_factory) -> dict[str, tuple[object, int, str]]:
    """Every case's starter, written to a folder of its own and run as `__main__` in one fresh interpreter outside the
    project (not one each: an interpreter's start, torch imported, is most of a starter's run): name -> (path, exit, output)."""
    folder = tmp_path_factory.mktemp("starters")
    paths = {name: grade.write_exercise(name, str(folder / name)) for name in case_names()}
    ran = subprocess.run(
        [sys.executable, "-c", RUN_EACH_AS_MAIN, *map(str, paths.values())], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stderr
    results = json.loads(ran.stdout.splitlines()[-1])
    return {name: (path, *results[str(path)]) for name, path in paths.items()}


def test_every_starter_runs_on_its_own_and_says_how_to_grade_it(starters):
    for name, (starter, exit_code, output) in starters.items():
        text = starter.read_text()
        assert f"python -m harness case={name} fix={starter}:fix" in text and "\nFix:" not in text and "def fix(" in text, name
        assert exit_code == 0 and "grade this file with" in output, output


@pytest.mark.parametrize("name", cases_failing_in_value())  # a failure that is time or memory: the starters graded below (-m slow)
def test_the_unchanged_starter_is_rejected_with_the_case_s_failure(tmp_path, environment, starters, name):
    starter = starters[name][0]
    cfg = compose_config(f"case={name}", "device=cpu", "phases=[fix,correct]", f"fix={starter}:fix", "timeout_s=120")
    record, _ = run_case(cfg, "cpu", tmp_path / "run", environment)
    verdict = grade.verdict(record)
    assert not verdict.accepted
    symptom = symptom_on(load_case(name).symptoms["cpu"], torch.__version__)
    if symptom.expected_on(torch.__version__) and isinstance(symptom, Symptom):
        assert verdict.line.startswith("rejected by fix: raised") and "the case's own symptom" in verdict.line, verdict.line
    else:  # the buggy code runs: a failure that raises nothing (a wrong result), or on a torch where it returns (autocast_device from 2.4)
        assert verdict.line.startswith("rejected by correct: mismatch"), verdict.line


# Right in value, timed or stepped: these starters reach a measurement, and each is graded in the one phase its failure
# is (a bench's whole grade of the three took 192 s of CI's timed run, two of them timing a speed phase that judged
# nothing asserted here); memory is judged in bytes, with the slow tests that time nothing.
def graded_starter(tmp_path, environment, name: str, phase: str):
    """The unchanged starter of `name` (the buggy code as `fix`), graded in `phase` alone: (that phase's record, the verdict)."""
    starter = grade.write_exercise(name, str(tmp_path / "starter"))
    cfg = compose_config(f"case={name}", "device=cpu", f"phases=[{phase}]", f"fix={starter}:fix", "timeout_s=300")
    record, _ = run_case(cfg, "cpu", tmp_path / "run", environment)
    return next(each for each in record.phases if each.phase == phase), grade.verdict(record)


@pytest.mark.slow  # a speed grade, one at a time: recompile_limit's compiles in each timing child
@pytest.mark.parametrize("name", [name for name in case_names() if failure_on_cpu_is(name, Slow)])
def test_an_unchanged_starter_whose_failure_is_time_is_rejected_by_the_speed_verdict_as_its_own_symptom(tmp_path, environment, name):
    speed, verdict = graded_starter(tmp_path, environment, name, "speed")
    assert speed.status == "over_budget" and not verdict.accepted, speed.message
    assert verdict.line.startswith("rejected by speed: over_budget") and "the case's own symptom, slow" in verdict.line, verdict.line


@pytest.mark.untimed
@pytest.mark.slow  # a memory grade: steps measured in bytes, which another process's load does not change
@pytest.mark.parametrize("name", [name for name in case_names() if failure_on_cpu_is(name, Growth)])
def test_an_unchanged_starter_whose_failure_is_memory_kept_is_rejected_by_the_memory_verdict(tmp_path, environment, name):
    memory, verdict = graded_starter(tmp_path, environment, name, "memory")
    assert memory.status == "over_budget" and not verdict.accepted, memory.message
    assert verdict.line.startswith("rejected by memory: over_budget"), verdict.line


def test_an_exercise_never_overwrites_a_starter(tmp_path):
    grade.write_exercise("embedding_oob", str(tmp_path))
    with pytest.raises(FileExistsError):
        grade.write_exercise("embedding_oob", str(tmp_path))


@pytest.mark.parametrize("name", case_names())
def test_every_case_has_three_hints_that_do_not_give_the_code_away(name):
    cfg = compose_config(f"case={name}")
    hints = list(cfg.case.hints)
    assert len(hints) == grade.HINT_STEPS
    assert hints[0].startswith("Where to look") and hints[-1].startswith("What the fix does")
    case = load_case(name)
    for line in inspect.getsource(case.fixed).splitlines()[1:]:
        assert line.strip() not in " ".join(hints), line


# -- bad usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{dir}/nope.py:fix", "no such file"),
        ("{fixes}:no_such_function", "no function 'no_such_function'"),
        ("{fixes}:not_a_function", "'not_a_function' is a int, not a function"),
        ("{fixes}", "expected <file.py>:<function>"),
        ("{broken}:fix", "broken.py:3: SyntaxError"),
        ("{failing}:fix", "failing.py:2: importing it raised ModuleNotFoundError"),
    ],
)
def test_bad_usage_is_refused_before_anything_runs(tmp_path, spec, message):
    shutil.copy(FIXES / "embedding_fixes.py", tmp_path / "embedding_fixes.py")
    (tmp_path / "broken.py").write_text("import torch\n\ndef fix(x) return x\n")
    (tmp_path / "failing.py").write_text("import torch\nimport no_such_module_anywhere\n\ndef fix(x):\n    return x\n")
    spec = spec.format(dir=tmp_path, fixes=tmp_path / "embedding_fixes.py", broken=tmp_path / "broken.py", failing=tmp_path / "failing.py")
    with pytest.raises(ConfigError) as refused:
        validate(compose_config("case=embedding_oob", f"fix={spec}"))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def harness(*args, tmp_path):
    command = [sys.executable, "-m", "harness", *args, f"hydra.run.dir={tmp_path}/run", f"hydra.sweep.dir={tmp_path}/multirun"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_command_line_exits_2_on_bad_usage_with_one_line(tmp_path):
    (tmp_path / "broken.py").write_text("def fix(x):\n    return (x\n")
    for args, message in [
        ([f"fix={tmp_path}/broken.py:fix"], f"{tmp_path}/broken.py:2: SyntaxError"),
        (["hint=4"], "hint=4: choose a step from 1 to 3"),
    ]:
        run = harness("case=embedding_oob", *args, tmp_path=tmp_path)
        assert run.returncode == 2 and run.stderr.strip().count("\n") == 0 and "Traceback" not in run.stderr, run.stderr
        assert message in run.stderr


def test_the_command_line_grades_says_so_first_and_ends_with_the_verdict(tmp_path):
    shutil.copy(FIXES / "embedding_fixes.py", tmp_path / "embedding_fixes.py")
    run = harness(
        "case=embedding_oob",
        "device=cpu",
        "phases=[fix,correct]",
        f"fix={tmp_path}/embedding_fixes.py:prints_a_fake_verdict",
        tmp_path=tmp_path,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 1, run.stdout + run.stderr
    assert lines[0].startswith("grading a submitted fix: ") and lines[-1].startswith("rejected by correct: mismatch")
    assert "\nFix:" not in run.stdout  # the model solution is shown only after a pass
    run = harness(
        "case=embedding_oob", "device=cpu", "phases=[fix]", f"fix={tmp_path}/embedding_fixes.py:by_searchsorted", tmp_path=tmp_path
    )
    assert run.returncode == 0 and run.stdout.strip().splitlines()[-1].startswith("accepted: fix, integrity passed"), (
        run.stdout + run.stderr
    )
    assert "--- cases/embedding_oob.py: fixed" in run.stdout


def test_hint_and_exercise_from_the_command_line(tmp_path):
    run = harness("case=codebook_oob", "hint=1", tmp_path=tmp_path)
    assert run.returncode == 0 and run.stdout.startswith("hint 1 of 3 for codebook_oob: Where to look")
    run = harness("case=codebook_oob", f"exercise={tmp_path}/ex", tmp_path=tmp_path)
    assert run.returncode == 0 and (tmp_path / "ex" / "fix_codebook_oob.py").exists()
    assert f"fix={tmp_path}/ex/fix_codebook_oob.py:fix" in run.stdout


@pytest.mark.slow  # compiles every rank's model in a private, cold kernel cache: about 50 s
def test_a_correct_fix_whose_ranks_compile_is_accepted_under_inductor(tmp_path, environment):
    # multigpu_segfault's ranks compile their DDP model themselves: in a graded run they must compile beneath the
    # graded child's scratch folder (they wrote /tmp/torchinductor_<user>, refused, and a correct fix was rejected).
    verdict, record, _, _ = graded(
        tmp_path, environment, "multigpu_segfault", "alternatives/multigpu_segfault.py", "multigpu_segfault", ["fix"], "compile=inductor"
    )
    assert verdict.accepted, verdict.line
    assert phase(record, "integrity").status == "passed"


def test_grading_keeps_only_the_speed_comparisons_that_apply_to_a_submitted_fix():
    # ddp_unused_parameters times one in-process step against another baseline; a graded fix is a whole launch
    from omegaconf import OmegaConf

    from harness.process.submitted import Submission

    case_cfg = OmegaConf.create(
        {
            "speed": {
                "budget": {"cpu": 1.25},
                "grade_budget": {"cpu": 1.5},
                "also": {
                    "same_calls": {"baseline": "upstream", "budget": {"cpu": 1.0}},
                    "one_step": {"baseline": "a_step", "budget": {"cpu": 1.0}, "graded": False},
                },
            }
        }
    )
    graded = grade.graded_config(case_cfg, Submission("/tmp/fix.py", "fix", "0" * 64))
    assert list(graded.speed.also) == ["same_calls"] and graded.speed.budget.cpu == 1.5
    assert list(case_cfg.speed.also) == ["same_calls", "one_step"]  # the case's own run keeps both


@pytest.mark.untimed
@pytest.mark.slow  # two harness runs, one of them losing its fork server: 9 s
def test_a_file_whose_import_kills_its_parent_is_rejected_with_exit_1_never_bad_usage(tmp_path):
    (tmp_path / "kills.py").write_text("import os\nimport signal\n\nos.kill(os.getppid(), signal.SIGKILL)\n\n\ndef fix(x):\n    return x\n")
    # the same verdict every time: graded 10 times for issue 25; tests/test_isolate.py repeats the fork server's loss itself
    run = harness("case=embedding_oob", "device=cpu", "phases=[fix,correct]", f"fix={tmp_path}/kills.py:fix", tmp_path=tmp_path)
    verdict = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 1, run.stdout + run.stderr
    assert verdict.startswith(
        "rejected by integrity: signalled_outside_sandbox: the submission tried to signal a process outside its own (refused): SIGKILL to pid"
    ), verdict
    (tmp_path / "missing.py").write_text("import os\n\n\ndef fix(x):\n    return x\n")
    run = harness("case=embedding_oob", "device=cpu", f"fix={tmp_path}/missing.py:no_such_function", tmp_path=tmp_path)
    assert run.returncode == 2 and "no function 'no_such_function'" in run.stderr, run.stderr  # exit 2 stays for what does not exist


def test_where_a_case_sets_a_memory_budget_the_fix_is_judged_on_memory_too(tmp_path, environment):
    budget = "+case.memory={steps: 8, budget: {cpu: {growth: 0.05, peak: 1.5}}}"  # as a case with a memory budget's yaml
    verdict, record, _, _ = graded(tmp_path, environment, "embedding_oob", "embedding_fixes.py", "by_searchsorted", ["memory"], budget)
    assert verdict.accepted and verdict.line.startswith("accepted: memory, integrity passed"), verdict.line
    memory = phase(record, "memory")
    assert memory.figures["baseline_function"] == "fixed" and memory.figures["steps"] in range(8, 12)  # 0-3 more, drawn privately
    assert memory.figures["confinement"]  # measured in the confined child


def test_a_speed_comparison_that_ran_in_a_grade_counts_in_its_verdict():
    from harness.records import CaseRecord, PhaseRecord

    phases = [
        PhaseRecord(name, status, status in ("passed", "within_budget"), status)
        for name, status in (
            ("fix", "passed"),
            ("correct", "passed"),
            ("speed", "within_budget"),
            ("speed:against_upstream", "undecided"),
            ("integrity", "passed"),
        )
    ]
    verdict = grade.verdict(CaseRecord("class_weight_index", "", "cpu", "", {}, {}, phases))
    assert not verdict.accepted and verdict.line.startswith("rejected by speed:against_upstream: undecided"), verdict.line


def test_a_fix_wrong_at_the_object_s_edge_is_rejected_by_correct_not_by_speed(tmp_path, environment):
    """Issue 36: labels from a thresholded bicubic resize passed `correct` in 6 grades of 7 when the case compared its
    loss alone (2.4e-5 relative, inside the tolerance). The class map is now an output, compared exactly."""
    verdict, record, _, _ = graded(
        tmp_path, environment, "target_out_of_bounds", "target_fixes.py", "thresholded_bicubic", ["fix", "correct"]
    )
    correct = phase(record, "correct")
    assert correct.status == "mismatch" and correct.figures["mismatched_integers"] > 0, correct.message
    labels = next(d for d in correct.figures["differing"] if d["output"] == "output['labels']")  # named as the reference names it
    assert labels["mismatched"] > 0 and labels["of"] == correct.figures["integers"], correct.figures["differing"]
    assert verdict.line.startswith("rejected by correct"), verdict.line


def test_a_restore_keeps_what_it_overwrote_or_removed(tmp_path, monkeypatch):
    """The integrity check puts the sources back as they were; a change it undoes may be a person's edit made while
    the grade ran (a merge, a new case), so what it found is kept beside the record, never lost."""
    from harness.grading import integrity as module
    from harness.records import CaseRecord

    root = tmp_path / "project"
    (root / "cases").mkdir(parents=True)
    (root / "cases" / "kept.py").write_text("before")
    monkeypatch.setattr(module, "ROOT", root)
    before = module.project_sources()
    (root / "cases" / "kept.py").write_text("edited meanwhile")
    (root / "cases" / "new.py").write_text("added meanwhile")
    record = CaseRecord("embedding_oob", "", "cpu", "", {}, {})
    checked = module.integrity(before, record, tmp_path / "displaced")
    assert checked.status == "tampered" and f"kept in {tmp_path / 'displaced'}" in checked.message
    assert (root / "cases" / "kept.py").read_text() == "before" and not (root / "cases" / "new.py").exists()
    assert (tmp_path / "displaced" / "cases" / "kept.py").read_text() == "edited meanwhile"
    assert (tmp_path / "displaced" / "cases" / "new.py").read_text() == "added meanwhile"
