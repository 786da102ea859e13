"""A case whose failure is a warning (`Warns`): a fix, or a bad fix, that returns the right result while still issuing
the warning is the buggy code, and correct and bad_fixes say so (harness/phases/correct.py)."""

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

from harness.phases.correct import _still_warns
from harness.symptoms import Warns, WrongResult

CFG = OmegaConf.create({"compile": "off"})
WARNED = ["UserWarning: The verbose parameter is deprecated. Please use get_last_lr() to access the learning rate."]


def case_with(symptom):
    return SimpleNamespace(symptoms={"cpu": symptom})


def test_a_candidate_that_still_issues_the_cases_warning_is_named():
    case = case_with(Warns(warning=r"verbose parameter is deprecated"))
    assert _still_warns(case, CFG, "cpu", WARNED) == WARNED[0]


def test_other_warnings_and_other_kinds_of_failure_are_not_judged_by_warning():
    assert _still_warns(case_with(Warns(warning=r"verbose parameter is deprecated")), CFG, "cpu", ["UserWarning: something else"]) is None
    assert _still_warns(case_with(WrongResult(warning=r"verbose parameter")), CFG, "cpu", WARNED) is None


def test_outside_the_warnings_range_of_torch_versions_it_is_not_judged():
    after = f"{int(torch.__version__.split('.')[0]) + 1}.0"
    case = case_with(Warns(warning=r"verbose parameter is deprecated", fixed_in="2.0"))
    assert _still_warns(case, CFG, "cpu", WARNED) is None
    assert _still_warns(case_with(Warns(warning="verbose", appears_in=after)), CFG, "cpu", WARNED) is None
