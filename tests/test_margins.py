"""The margin check: how far each control is past its line, judged on synthetic records of every kind of control."""

import json
import math

import pytest

from harness.margins import BAD_FIX, MEMORY, SLOW, margins, report, table
from harness.matrix import main
from harness.recordset import load_records


def write(folder, phases, torch="2.13.0", case="embedding_oob"):
    record = {
        "case": case,
        "device": "cpu",
        "environment": {"torch": torch},
        "phases": [{"message": p.get("message", p["status"]), "figures": {}, **p} for p in phases],
    }
    path = folder / f"torch-{torch}" / f"{case}.cpu.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def slow(status, low, high=None, budget=1.15):
    return {
        "phase": "slow_fix:loop",
        "status": status,
        "figures": {"ratio": low * 1.05, "ratio_low": low, "ratio_high": high or low * 1.1, "budget": budget},
    }


def standing_of(tmp_path, phase_record):
    write(tmp_path, [{"phase": "reproduce", "status": "raised"}, phase_record])
    [margin] = margins(load_records(tmp_path))
    return margin


@pytest.mark.parametrize(
    ("low", "standing"),
    [(SLOW * 1.15 + 0.01, "held"), (SLOW * 1.15 - 0.01, "thin"), (1.16, "thin")],
)
def test_a_slow_control_holds_only_when_its_low_end_clears_the_margin(tmp_path, low, standing):
    margin = standing_of(tmp_path, slow("flagged", low))
    assert margin.standing == standing and margin.margin == pytest.approx(low / 1.15)


@pytest.mark.parametrize(
    ("status", "standing"), [("missed", "missed"), ("no_budget", "exempt"), ("not_applicable", "exempt"), ("retraced", "exempt")]
)
def test_a_missed_control_fails_and_one_not_run_is_exempt(tmp_path, status, standing):
    assert standing_of(tmp_path, slow(status, 0.9)).standing == standing


def test_a_memory_control_is_judged_by_the_larger_of_its_growth_and_its_peak(tmp_path):
    figures = {"growth_fraction_low": 0.05, "peak_ratio": 2.03, "budget": {"growth": 0.02, "peak": 1.5}}
    margin = standing_of(tmp_path, {"phase": "memory_fix:keep_all", "status": "flagged", "figures": figures})
    assert margin.standing == "held" and margin.margin == pytest.approx(2.5) and "growth" in margin.how
    figures["growth_fraction_low"] = 0.001
    margin = margins(
        load_records(write(tmp_path, [{"phase": "memory_fix:keep_all", "status": "flagged", "figures": figures}]).parent.parent)
    )[0]
    assert margin.standing == "thin" and margin.margin == pytest.approx(2.03 / 1.5) and margin.margin < MEMORY


@pytest.mark.parametrize(
    ("figures", "standing", "value"),
    [
        ({"how": "raised", "error": "IndexError: x"}, "held", math.inf),
        ({"how": "warns", "still_warns": "UserWarning: The verbose parameter is deprecated."}, "held", math.inf),
        ({"how": "differs", "mismatched_integers": 2, "integers": 6}, "held", math.inf),
        ({"how": "differs", "reason": "output['grad'] is None where the reference has a tensor (16 such)"}, "held", math.inf),
        ({"how": "differs", "mismatched_floats": 3, "floats": 9, "tolerance_excess": BAD_FIX * 4}, "held", BAD_FIX * 4),
        ({"how": "differs", "mismatched_floats": 3, "floats": 9, "tolerance_excess": 3.0}, "thin", 3.0),
        ({"how": "differs", "mismatched_floats": 3, "floats": 9}, "unmeasured", None),
    ],
)
def test_a_bad_fix_is_far_enough_when_it_raises_differs_categorically_or_by_ten_tolerances(tmp_path, figures, standing, value):
    margin = standing_of(tmp_path, {"phase": "bad_fix:clamp", "status": "rejected", "figures": figures})
    assert margin.standing == standing and margin.margin == value


def test_an_accepted_bad_fix_is_missed(tmp_path):
    assert standing_of(tmp_path, {"phase": "bad_fix:clamp", "status": "accepted", "figures": {"match": True}}).standing == "missed"


def test_the_command_exits_1_naming_each_short_control_and_0_when_all_hold(tmp_path, capsys):
    write(
        tmp_path,
        [
            {"phase": "reproduce", "status": "raised"},
            slow("flagged", 2.0),
            {"phase": "bad_fix:clamp", "status": "rejected", "figures": {"how": "raised"}},
        ],
    )
    assert main(["margins", str(tmp_path)]) == 0
    write(tmp_path, [slow("flagged", 1.2)], torch="2.4.1")
    assert main(["margins", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "SHORT embedding_oob torch 2.4.1 cpu slow_fix:loop: thin, margin 1.04x (needs 1.3x)" in out


def test_the_table_names_each_controls_smallest_margin_and_where(tmp_path):
    write(tmp_path, [slow("flagged", 2.0)], torch="2.13.0")
    write(tmp_path, [slow("flagged", 1.2)], torch="2.4.1")
    found = margins(load_records(tmp_path))
    assert "| `embedding_oob` | `slow_fix:loop` | 1.04x (2.4.1 cpu) | 1 / 2 |" in table(found)
    short, counts = report(found)
    assert len(short) == 1 and counts == {"held": 1, "thin": 1}


def test_a_slow_or_memory_control_is_exempt_where_the_case_s_own_fix_is_not_correct_and_a_bad_fix_is_not(tmp_path):
    bad = {"phase": "bad_fix:clamp", "status": "rejected", "figures": {"how": "differs", "tolerance_excess": 3.0}}
    write(tmp_path, [{"phase": "reproduce", "status": "raised"}, {"phase": "correct", "status": "raised"}, slow("missed", 0.9), bad])
    control, bad_fix = margins(load_records(tmp_path))
    assert control.standing == "exempt" and "correct: raised" in control.how
    assert bad_fix.standing == "thin"
    write(tmp_path, [{"phase": "reproduce", "status": "raised"}, {"phase": "correct", "status": "passed"}, slow("missed", 0.9)])
    assert margins(load_records(tmp_path))[0].standing == "missed"
