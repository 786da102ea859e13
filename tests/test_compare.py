import math

import torch

from harness.compare import compare, describe


def test_integers_must_be_equal_floats_within_tolerance():
    got = (torch.tensor([1, 2, 3]), torch.tensor([1.0, 2.0]))
    want = (torch.tensor([1, 2, 4]), torch.tensor([1.0, 2.0 + 1e-9]))
    figures = compare(got, want, atol=1e-6, rtol=0)
    assert not figures["match"]
    assert (figures["mismatched_integers"], figures["integers"]) == (1, 3)
    assert (figures["mismatched_floats"], figures["floats"]) == (0, 2)


def test_exact_tolerance_catches_any_float_difference():
    figures = compare(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-6]), atol=0, rtol=0)
    assert not figures["match"]
    assert figures["max_abs_diff"] > 0


def test_relative_error_and_snr():
    want = torch.ones(100)
    figures = compare(want * 1.1, want, atol=0, rtol=0)
    assert math.isclose(figures["relative_error"], 0.1, rel_tol=1e-6)
    assert math.isclose(figures["snr_db"], 20.0, rel_tol=1e-6)


def test_equal_outputs_match_with_infinite_snr():
    figures = compare({"a": torch.arange(3.0)}, {"a": torch.arange(3.0)}, atol=0, rtol=0)
    assert figures["match"] and figures["snr_db"] == math.inf


def test_structure_mismatches_are_reasons_not_crashes():
    assert compare(torch.zeros(2), (torch.zeros(2), torch.zeros(2)), atol=0, rtol=0)["reason"] == "1 tensors, reference has 2"
    assert compare(torch.zeros(2), torch.zeros(3), atol=0, rtol=0)["reason"] == "shape (2,), reference (3,)"


def test_describe():
    assert describe((torch.zeros(2, 3), torch.zeros(1, dtype=torch.long))) == "(2, 3) float32, (1,) int64"
