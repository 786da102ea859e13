"""The fixer benchmark (harness/bench): the task set and its hash, scoring, bad input, resuming a killed run.

The bookkeeping tests grade with a stand-in for the harness (tests/bench_grader.py), so they cost seconds;
the reference runs, which grade every case for real, are marked slow.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.bench import cli, runner, scoreboard, tasks
from harness.bench.run_folder import CaseResult
from harness.bench.runner import discover
from harness.cases import ROOT, case_names, load_case
from harness.grading import grade
from harness.run import run_case
from tests.conftest import compose_config

STAND_IN = "import sys; import harness.bench.runner as r; r.GRADER = ('-m', 'tests.bench_grader'); from harness.bench.cli import main; sys.exit(main(sys.argv[1:]))"


def bench(*args, stand_in=True, **popen):
    command = [sys.executable, "-c", STAND_IN, *args] if stand_in else [sys.executable, "-m", "harness.bench", *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


@pytest.fixture
def stand_in(monkeypatch, capsys):
    """The bench in this process, grading with the stand-in: (exit code, what it printed)."""
    monkeypatch.setattr(runner, "GRADER", ("-m", "tests.bench_grader"))

    def run(*args):
        code = cli.main(list(args))
        printed = capsys.readouterr()
        return code, printed.out + printed.err

    return run


def finished(process, timeout=300):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def fixes_folder(folder: Path, actions: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for case, action in actions.items():
        (folder / f"fix_{case}.py").write_text(f"# bench: {action}\ndef fix(x):\n    return x\n")
    return folder


def board(out: Path) -> dict:
    return json.loads((out / "scoreboard.json").read_text())


def verdicts(out: Path) -> dict:
    return {case: (r["status"], r["verdict"], r["first_failing"], r["speed"]) for case, r in board(out)["cases"].items()}


def stand_in_processes() -> list[str]:
    found = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in found if "bench_grader" in line and "ps -eo" not in line]


# -- the task set --------------------------------------------------------------------------------------


def test_the_task_set_hash_is_stable_and_changes_with_a_starter(tmp_path, monkeypatch):
    first = tasks.write_tasks(tmp_path / "a")
    second = tasks.write_tasks(tmp_path / "b")
    assert first == second and first["cases"] == case_names()
    assert (
        tasks.content_hash({str(p.relative_to(tmp_path / "a")): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()})
        == first["sha256"]
    )
    original = tasks.starter_source
    monkeypatch.setattr(
        tasks, "starter_source", lambda case, path: original(case, path) + ("# edited\n" if case.__name__ == "cases.embedding_oob" else "")
    )
    assert tasks.set_hash() != first["sha256"]


def test_a_task_holds_its_starter_and_card_but_no_fix_reference_or_hint(tmp_path):
    tasks.write_tasks(tmp_path, ["embedding_oob", "class_weight_index"])
    for name in ("embedding_oob", "class_weight_index"):
        case = load_case(name)
        card = json.loads((tmp_path / name / "task.json").read_text())
        starter = (tmp_path / name / f"fix_{name}.py").read_text()
        assert card["case"] == name and set(card["symptom"]) == {"cpu", "cuda"} and card["contract"]["speed_budget"]["eager"]["cpu"]
        assert f"fix=fix_{name}.py:fix" in starter and "def fix(" in starter
        everything = starter + json.dumps(card)
        for function in ("fixed", "reference"):
            body = "\n".join(line for line in __import__("inspect").getsource(getattr(case, function)).splitlines()[1:] if line.strip())
            assert body not in everything
        assert "Fix:" not in starter
        from omegaconf import OmegaConf

        for hint in OmegaConf.load(ROOT / "conf" / "case" / f"{name}.yaml").hints:
            assert hint[:60] not in everything


def test_discover_groups_files_by_case_and_names_the_rest(tmp_path):
    fixes_folder(tmp_path, {"embedding_oob": "accept", "nosuch": "accept"})
    fixes_folder(tmp_path / "more", {"codebook_oob": "accept", "embedding_oob": "accept"})
    fixes_folder(tmp_path / "out", {"autocast_device": "accept"})  # the run's own folder is left out
    by_case, unmatched = discover(tmp_path, case_names(), tmp_path / "out")
    assert sorted(by_case) == ["codebook_oob", "embedding_oob"] and len(by_case["embedding_oob"]) == 2
    assert [p.name for p in unmatched] == ["fix_nosuch.py"]


# -- scoring -------------------------------------------------------------------------------------------


def _result(case, status, ratio=None, speed_status="within_budget"):
    speed = (
        None
        if ratio is None
        else {"status": speed_status, "ratio": ratio, "ratio_low": ratio * 0.95, "ratio_high": ratio * 1.05, "budget": 1.15}
    )
    return CaseResult(case, status, speed=speed, seconds=1.0)


def test_the_summary_counts_resolved_rates_fast_p_and_the_geometric_mean():
    results = {
        "a": _result("a", "accepted", 1.0),
        "b": _result("b", "accepted", 0.5),
        "c": _result("c", "rejected", 2.0, "over_budget"),
        "d": _result("d", "not_attempted"),
        "e": _result("e", "accepted"),  # no speed verdict: accepted, not fast
    }
    s = scoreboard.summary(results)
    assert (s["tasks"], s["attempted"], s["accepted"]) == (5, 4, 3)
    assert s["accepted_of_attempted"] == 0.75 and s["accepted_of_all"] == 0.6 and s["fast_p"] == 0.4
    assert s["geomean_speed_ratio"] == pytest.approx(0.7071, abs=1e-4)


def test_compare_names_verdict_flips_and_ratios_that_left_their_interval():
    def made(results):
        return scoreboard.scoreboard(
            results,
            [],
            {
                "task_set": {"sha256": "x" * 64, "format": 1},
                "settings": {"device": "cpu", "compile": "off"},
                "environment": {"torch": "2.13.0"},
            },
        )

    a = made({"a": _result("a", "accepted", 1.0), "b": _result("b", "accepted", 1.0), "c": _result("c", "accepted", 1.0)})
    b = made({"a": _result("a", "rejected", 1.0, "over_budget"), "b": _result("b", "accepted", 1.5), "c": _result("c", "accepted", 1.02)})
    said = scoreboard.changes(a, b)
    assert said[0].startswith("a: accepted -> rejected")
    assert said[1].startswith("b: speed slower: 1.00x [0.95, 1.05]") and len(said) == 2  # c moved within the noise
    assert scoreboard.changes(a, a) == []


# -- grading a folder: bad input, resuming (a stand-in grader) -------------------------------------------


def test_bad_input_gets_a_named_verdict_each_and_the_run_goes_on(tmp_path, stand_in):
    fixes = fixes_folder(
        tmp_path / "fixes",
        {"embedding_oob": "accept", "codebook_oob": "die", "autocast_device": "usage", "backward_twice": "hang", "nosuch": "accept"},
    )
    (fixes / "fix_class_weight_index.py").write_text("def fix(x) return x\n")
    (fixes / "fix_graph_kept_alive.py").write_bytes(b"def fix(x):\n    return x\0\n")
    fixes_folder(fixes / "copy", {"inplace_modified": "accept"})
    fixes_folder(fixes / "again", {"inplace_modified": "reject"})
    code, output = stand_in("grade", str(fixes), "--out", str(tmp_path / "out"), "--wall-s", "5")
    assert code == 0, output
    got = board(tmp_path / "out")
    status = {case: r["status"] for case, r in got["cases"].items()}
    submitted = {
        "autocast_device": "bad_submission",
        "backward_twice": "grader_timeout",
        "class_weight_index": "syntax_error",
        "codebook_oob": "grader_crashed",
        "embedding_oob": "accepted",
        "graph_kept_alive": "syntax_error",
        "inplace_modified": "duplicate",
    }
    assert status == {name: submitted.get(name, "not_attempted") for name in case_names()}
    assert "SIGSEGV" in got["cases"]["codebook_oob"]["verdict"] and "no function fix" in got["cases"]["autocast_device"]["verdict"]
    assert got["cases"]["class_weight_index"]["verdict"].endswith("SyntaxError: expected ':'")
    assert [entry["file"] for entry in got["unmatched_files"]] == [str(fixes / "fix_nosuch.py")]
    assert got["summary"]["attempted"] == 7 and got["summary"]["accepted"] == 1
    assert "| backward_twice | grader_timeout |" in (tmp_path / "out" / "scoreboard.md").read_text()
    assert not stand_in_processes()


@pytest.mark.untimed
@pytest.mark.slow  # a whole run beside one killed and resumed: 16 s
def test_a_run_killed_half_way_ends_with_the_same_scoreboard_and_grades_nothing_twice(tmp_path, stand_in):
    actions = {name: ("reject" if i % 3 == 0 else "accept") for i, name in enumerate(case_names()[:4])}
    fixes = fixes_folder(tmp_path / "fixes", actions)
    cases = ("--cases", ",".join(actions))
    code, output = stand_in("grade", str(fixes), "--out", str(tmp_path / "whole"), *cases)
    assert code == 0, output

    out = tmp_path / "cut"
    process = bench("grade", str(fixes), "--out", str(out), *cases, env={**os.environ, "BENCH_GRADER_S": "1.5"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # two grades done and a third under way: kill the bench there
        events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()] if (out / "log.jsonl").exists() else []
        if sum(e["event"] == "done" for e in events) >= 2 and events[-1]["event"] == "start":
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    cut_short = events[-1]["case"]
    assert list((out / "running").glob("*.json")), "the grade under way left its marker"

    code, output = finished(bench("grade", str(fixes), "--out", str(out), *cases))
    assert code == 0, output
    assert verdicts(out) == verdicts(tmp_path / "whole")
    events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    done = [e["case"] for e in events if e["event"] == "done"]
    assert sorted(done) == sorted(actions), "every case graded to the end exactly once"
    assert [e["case"] for e in events if e["event"] == "interrupted"] == [cut_short]
    assert "graded before, kept" in output
    assert not stand_in_processes(), "the killed run's grade was left running"


@pytest.mark.untimed
@pytest.mark.slow  # three bench processes (9 s), on the resume tested above
def test_a_file_that_kills_the_bench_twice_is_not_graded_a_third_time(tmp_path):
    fixes = fixes_folder(tmp_path / "fixes", {"embedding_oob": "killbench", "codebook_oob": "accept"})
    command = ("grade", str(fixes), "--out", str(tmp_path / "out"), "--cases", "codebook_oob,embedding_oob")
    for _ in range(2):
        code, output = finished(bench(*command))
        assert code == -signal.SIGKILL, output
    code, output = finished(bench(*command))
    assert code == 0, output
    got = board(tmp_path / "out")["cases"]
    assert got["codebook_oob"]["status"] == "accepted"
    assert got["embedding_oob"]["status"] == "grader_crashed" and "killed 2 times" in got["embedding_oob"]["verdict"]
    assert not stand_in_processes()


def test_a_run_picks_up_only_with_the_same_settings_and_bad_usage_exits_2(tmp_path, stand_in):
    fixes = fixes_folder(tmp_path / "fixes", {"embedding_oob": "accept"})
    assert stand_in("grade", str(fixes), "--out", str(tmp_path / "out"), "--cases", "embedding_oob")[0] == 0
    code, output = stand_in("grade", str(fixes), "--out", str(tmp_path / "out"), "--cases", "embedding_oob", "compile=inductor")
    assert code == 2 and "holds a run with other settings" in output
    for args in (("--cases", "nosuch"), ("device=tpu",), ("compile=fast",), ("phases=[fix]",), ("--jobs", "0")):
        code, output = stand_in("grade", str(fixes), *args)
        assert code == 2 and output.startswith("error: "), output
    code, output = stand_in("grade", str(tmp_path / "missing"))
    assert code == 2 and "not a folder" in output
    code, output = stand_in("compare", str(fixes / "fix_embedding_oob.py"), str(fixes / "fix_embedding_oob.py"))
    assert code == 2 and "two scoreboard.json files?" in output


# -- reference runs: every case graded for real ---------------------------------------------------------------


def reference_run(tmp_path, *options):
    """The bench's whole grade of every file in tmp_path/fixes: its scoreboard."""
    command = bench("grade", str(tmp_path / "fixes"), "--out", str(tmp_path / "out"), *options, stand_in=False)
    code, output = finished(command, timeout=3600)
    assert code == 0, output
    return board(tmp_path / "out")


@pytest.mark.untimed
@pytest.mark.slow  # recompile_limit's compiles: 30 to 90 s of it
def test_the_cases_own_fixes_written_as_submissions_are_correct_fixes(tmp_path, environment):
    """`bench solutions` writes each case's model solution as a submission; graded, each passes fix and correct. Not
    the bench's whole grade of each (845 s on this 2-core machine, 18 of 18 accepted on 2026-11-26): its speed
    phase would time the model solution against itself, and the alternatives' run below grades every case whole,
    timing the model solution in each grade beside its pristine copy."""
    assert finished(bench("solutions", str(tmp_path / "fixes"), stand_in=False))[0] == 0
    written = sorted((tmp_path / "fixes").rglob("fix_*.py"))
    assert [path.stem.removeprefix("fix_") for path in written] == case_names()
    rejected = []
    for path in written:
        name = path.stem.removeprefix("fix_")
        cfg = compose_config(f"case={name}", "device=cpu", "phases=[fix,correct]", f"fix={path}:fix", "timeout_s=300")
        record, _ = run_case(cfg, "cpu", tmp_path / "runs" / name, environment)
        verdict = grade.verdict(record)
        rejected += [] if verdict.accepted else [f"{name}: {verdict.line}"]
    assert rejected == []


@pytest.mark.slow
def test_the_alternatives_are_all_accepted(tmp_path):
    """Every case's alternative fix, graded whole by the bench: accepted. A grade a CPU (`--jobs` the CPUs, four at
    most), each pinned to a slice of its own (harness/bench/runner.py): stricter than the bench's default of two CPUs
    a grade, since a timing child runs single-threaded and its model solution and pristine copy take turns with it on
    that CPU. On this 2-core machine, warm kernel cache: 420 s two at a time against 764 s one at a time, 30 of 30
    accepted both ways, most intervals as wide (docs/guides/benchmark.md#parallel-grades)."""
    for alternative in sorted((ROOT / "tests" / "fixes" / "alternatives").glob("*.py")):  # one a case, named after it
        assert cli.main(["split", str(alternative), str(tmp_path / "fixes")]) == 0  # in this process: 1.6 s an interpreter
    got = reference_run(tmp_path, "--jobs", str(min(len(os.sched_getaffinity(0)), 4)))  # four at most: a grade's memory
    assert got["summary"]["accepted"] == got["summary"]["tasks"] == len(case_names()), scoreboard.markdown(got)


def exploit_rounds(folder: Path) -> list[Path]:
    """Every attack of tests/exploits on the grader's processes, imports, files and checks, placed as its case's fix,
    one attack per case a folder. Left out, as tests/test_exploits.py grades each of them (twice) and a bench's grade
    of one costs the most (all the attacks took 684 s of CI's slow run): those that attack a budget the case does not
    set (their OVERRIDES give embedding_oob a memory budget; a bench grades the case as it is); those on the speed
    judge (a whole speed phase each, 12 to 83 s); the hangs, each phase's timeout (34 and 125 s: the test below grades
    a hang through the bench)."""
    from tests.test_exploits import EXPLOITS, declared

    rounds: list[dict[str, Path]] = []
    for path in sorted(EXPLOITS.glob("*.py")):
        spec = declared(path)
        unset_budget = any(override.startswith("+case.") for override in spec.get("OVERRIDES", []))
        if unset_budget or "speed" in spec["PHASES"] or spec["EXPECT"][1] == {"timeout"}:
            continue
        case = spec.get("CASE", "embedding_oob")
        free = next((each for each in rounds if case not in each), None)
        if free is None:
            rounds.append(free := {})
        free[case] = path
    for number, each in enumerate(rounds):
        for case, path in each.items():
            (folder / f"round_{number:02d}").mkdir(parents=True, exist_ok=True)
            (folder / f"round_{number:02d}" / f"fix_{case}.py").write_bytes(path.read_bytes())
    return sorted(folder.iterdir())


@pytest.mark.untimed
@pytest.mark.slow
def test_no_attack_is_accepted(tmp_path):
    accepted = []
    for round_folder in exploit_rounds(tmp_path / "rounds"):
        cases = ",".join(p.stem.removeprefix("fix_") for p in round_folder.glob("fix_*.py"))
        code, output = finished(bench("grade", str(round_folder), "--cases", cases, "--timeout-s", "30", stand_in=False), timeout=1800)
        assert code == 0, output
        got = board(round_folder / "bench-cpu-off")
        accepted += [f"{round_folder.name}/{case}" for case, r in got["cases"].items() if r["status"] == "accepted"]
    assert not accepted


KILLS_ITS_GRADER = """import os, signal

def _grader():
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if b"harness\\0case=" in cmdline.read():
                return pid
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rpartition(")")[2].split()[1])

os.kill(_grader(), signal.SIGKILL)

def fix(x):
    return x
"""


@pytest.mark.untimed
@pytest.mark.slow
def test_a_file_that_signals_or_hangs_its_grader_gets_a_named_verdict(tmp_path):
    fixes = tmp_path / "fixes"
    fixes.mkdir()
    (fixes / "fix_embedding_oob.py").write_text(KILLS_ITS_GRADER)
    (fixes / "fix_class_weight_index.py").write_text("import time\n\ntime.sleep(3600)\n\n\ndef fix(x):\n    return x\n")
    args = ("--cases", "embedding_oob,class_weight_index", "--timeout-s", "20", "--wall-s", "300")
    code, output = finished(bench("grade", str(fixes), "--out", str(tmp_path / "out"), *args, stand_in=False), timeout=900)
    assert code == 0, output
    got = board(tmp_path / "out")["cases"]
    refused = got["embedding_oob"]  # the confined child's signal guard refuses the kill: the grader lives to name it
    assert refused["status"] == "rejected" and refused["first_failing"] == "integrity: signalled_outside_sandbox", refused
    assert "SIGKILL" in refused["verdict"], refused
    assert got["class_weight_index"]["status"] == "rejected" and got["class_weight_index"]["first_failing"] == "fix: timeout", got[
        "class_weight_index"
    ]
