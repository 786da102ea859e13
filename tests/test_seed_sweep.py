import json

from harness import seed_sweep
from harness.seed_sweep import MARGIN, Sweep, summarise


def rows(*used_and_match):
    return [(1000 + i, "case", {"match": match, "tolerance_used": used}) for i, (used, match) in enumerate(used_and_match)]


def test_a_case_holds_only_while_its_worst_seed_uses_at_most_one_margin_of_its_tolerance():
    assert summarise("c", rows((0.1, True), (1 / MARGIN, True))).standing == "held"
    thin = summarise("c", rows((0.1, True), (0.9, True)))
    assert thin.standing == "thin" and thin.worst_seed == 1001 and "worst 0.9 of its tolerance over 2 seeds" in thin.line()
    failed = summarise("c", rows((0.1, True), (3.0, False), (2.0, False)))
    assert failed.standing == "failed" and failed.failed_seeds == [1001, 1002] and "on 2 seeds: [1001, 1002]" in failed.line()


def test_a_seed_that_raises_or_a_child_that_died_is_an_error_not_a_pass():
    raised = summarise("c", [(1000, "case", {"match": False, "raised": "RuntimeError: boom"})])
    assert raised.standing == "error" and "seed 1000 raised: RuntimeError: boom" in raised.line()
    assert Sweep("c", 0, None, None, "", "", [], "the child was killed by signal 9").standing == "error"


def test_the_command_sweeps_a_case_writes_its_line_as_json_and_exits_by_the_standing(tmp_path, capsys):
    code = seed_sweep.main(["--cases", "embedding_oob", "--seeds", "2", "--max-s", "30", "--out", str(tmp_path / "s.json")])
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["cases"][0]["case"] == "embedding_oob" and written["cases"][0]["seeds"] == 2
    assert printed.startswith(f"embedding_oob: {written['cases'][0]['standing']}: ")
    assert code == (0 if written["cases"][0]["standing"] == "held" else 1)


def test_bad_arguments_exit_2(capsys):
    for argv in (["--cases", "no_such_case"], ["--seeds", "0"]):
        try:
            seed_sweep.main(argv)
        except SystemExit as exit:
            assert exit.code == 2
        else:
            raise AssertionError(argv)
