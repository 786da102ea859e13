"""The run spec (harness/spec.py): made once from the config where a run starts, typed, and picklable for children."""

from __future__ import annotations

import dataclasses
import os
import pickle

from harness.grading.seam import Graded, Ungraded, grading_of
from harness.records import CaseRecord
from harness.run import make_spec, validate
from harness.spec import RunSpec
from tests.conftest import compose_config


def test_the_spec_holds_what_the_phases_read_and_survives_pickling():
    cfg = compose_config("case=embedding_oob", "device=cpu", "compile=inductor", "phases=[reproduce,fix]", "timeout_s=77")
    validate(cfg)
    spec = make_spec(cfg, "cpu")
    assert (spec.case, spec.device, spec.compile, spec.phases, spec.timeout_s) == (
        "embedding_oob",
        "cpu",
        "inductor",
        ("reproduce", "fix"),
        77.0,
    )
    assert spec.submission is None and not spec.graded and spec.limits.gpu is False
    assert spec.case_cfg.compile == "inductor"  # what the children read, the same mode
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert dataclasses.is_dataclass(spec) and isinstance(spec, RunSpec)


def test_a_graded_spec_names_its_submission_and_the_case_config_carries_it_to_the_children(tmp_path):
    cfg = compose_config("case=embedding_oob", "device=cpu", "fix=tests/fixes/alternatives/embedding_oob.py:embedding_oob")
    validate(cfg)
    spec = make_spec(cfg, "cpu")
    assert spec.graded and spec.submission.function == "embedding_oob"
    assert spec.case_cfg.submitted_fix.sha256 == spec.submission.sha256
    assert "slow_fixes" not in spec.phases  # a grade leaves the case's own controls out
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_a_run_without_a_submission_is_ungraded_and_a_grade_closes_with_integrity(tmp_path):
    """The grading seam (harness/grading/seam.py): the same five points whether or not a run grades."""
    cfg = compose_config("case=embedding_oob", "device=cpu", "fix=tests/fixes/alternatives/embedding_oob.py:embedding_oob")
    validate(cfg)
    spec = make_spec(cfg, "cpu")
    plain = grading_of(None)
    assert (
        isinstance(plain, Ungraded)
        and plain.at_close == ()
        and plain.plan(cfg.case, ("reproduce", "slow_fixes"), "cpu")
        == (
            cfg.case,
            ("reproduce", "slow_fixes"),
        )
    )
    assert plain.verdict(CaseRecord("embedding_oob", "", "cpu", "now", {}, {})) is None
    with plain.session(spec) as same:
        assert same is spec

    graded = grading_of(spec.submission)
    assert isinstance(graded, Graded) and graded.at_close == ("integrity",)
    with graded.session(spec) as inside:
        kernels = inside.limits.kernels
        assert kernels and os.path.isdir(kernels) and spec.limits.kernels is None
        record = CaseRecord("embedding_oob", "", "cpu", "now", {}, {})
        closing = graded.check_at_close("integrity", record, tmp_path)
    assert closing.phase == "integrity" and closing.ok, closing
    assert not os.path.exists(kernels)  # the grade's kernels folder goes with its session
