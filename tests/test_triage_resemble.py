"""Triage's second ranking: the cases a log's words resemble (harness/triage/resemble.py), a lead after the signs'
candidates and never a verdict."""

import pytest

from harness.cases import ROOT
from harness.triage import CASES_DIR, RESEMBLES, UNCLAIMED_CEILING, VERDICT_SCORE, _versions, triage
from harness.triage.resemble import SHARED_TERMS, case_vectors, line_terms, resemblance, terms
from tests.test_triage import _fixture

SETS = sorted(path for path in (ROOT / "tests").glob("triage_logs*") if path.is_dir())


def test_terms_are_words_snake_case_parts_and_adjacent_pairs():
    assert terms("The set_epoch call was never made") == [
        "set_epoch",
        "call",
        "never",
        "made",
        "set",
        "epoch",
        "set_epoch call",
        "call never",
        "never made",
    ]


def test_a_report_no_sign_decides_has_its_case_among_the_first_three():
    """EDM's report of a DataLoader worker killed after 15 hours of ImageNet (cut before its error line): the only
    sign that matched is multigpu_segfault's, which its own veto rules out; the words name dataloader_worker_killed."""
    _, log, _ = _fixture(
        ROOT / "tests" / "triage_logs_keptapart8" / "dataloader_worker_killed" / "edm_imagenet_worker_killed_after_15h.log"
    )
    verdict = triage(log)
    assert verdict.case is None
    first = verdict.candidates[0]
    assert first.case == "dataloader_worker_killed" and first.why.startswith(RESEMBLES) and first.evidence
    assert verdict.candidates[-1].case == "multigpu_segfault" and verdict.candidates[-1].score == 0


def test_words_the_cases_barely_share_give_no_lead():
    vectors, idf = case_vectors(CASES_DIR, _versions(CASES_DIR))
    assert resemblance(line_terms(["Traceback (most recent call last):", "ValueError: nothing known"]), vectors, idf) == []
    assert len(terms("the model")) < SHARED_TERMS
    assert resemblance(line_terms(["the model"]), vectors, idf) == []


@pytest.mark.parametrize("folder", SETS, ids=lambda path: path.name)
def test_resemblance_only_follows_the_signs_and_never_names_a_case(folder):
    """On every log of every set: a case resembled in words scores below UNCLAIMED_CEILING, comes after every case a
    sign found live and before every case a veto ruled out, and is never the verdict."""
    for path in sorted(folder.rglob("*.log")):
        _, log, _ = _fixture(path)
        verdict = triage(log)
        kinds = ["resembles" if c.why.startswith(RESEMBLES) else "live" if c.score > 0 else "ruled out" for c in verdict.candidates]
        assert kinds == sorted(kinds, key=["live", "resembles", "ruled out"].index), (path.name, kinds)
        for candidate, kind in zip(verdict.candidates, kinds):
            if kind == "resembles":
                assert candidate.score <= UNCLAIMED_CEILING < VERDICT_SCORE and candidate.case != verdict.case, path.name
        assert len([kind for kind in kinds if kind != "ruled out"]) <= max(3, kinds.count("live")), (path.name, kinds)
