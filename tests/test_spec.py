"""The run spec (harness/spec.py): made once from the config where a run starts, typed, and picklable for children."""

from __future__ import annotations

import dataclasses
import pickle

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
