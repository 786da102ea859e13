import math

import pytest
import torch

from harness.measure.compare import compare, describe, training_outputs


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
    assert compare(torch.zeros(2), (torch.zeros(2), torch.zeros(2)), atol=0, rtol=0)["reason"] == "1 outputs, reference has 2"
    assert compare(torch.zeros(2), torch.zeros(3), atol=0, rtol=0)["reason"] == "output: shape (2,), reference (3,)"


def test_a_gradient_left_none_is_named_and_only_none_matches_none():
    want = {"loss": torch.tensor(1.0), "grad": {"a": torch.ones(2), "b": None}}
    assert compare({"loss": torch.tensor(1.0), "grad": {"a": torch.ones(2), "b": None}}, want, atol=0, rtol=0)["match"]
    missing = compare({"loss": torch.tensor(1.0), "grad": {"a": None, "b": None}}, want, atol=0, rtol=0)
    assert not missing["match"] and missing["reason"] == "output['grad']['a'] is None where the reference has a tensor (1 such)"


def test_the_outputs_that_differ_are_named_with_their_own_figures():
    want = {"loss": torch.tensor(2.0), "labels": torch.tensor([0, 1, 2]), "grad": {"w": torch.ones(3)}}
    got = {"loss": torch.tensor(2.0), "labels": torch.tensor([0, 1, 1]), "grad": {"w": torch.tensor([1.0, 1.0, 3.0])}}
    figures = compare(got, want, atol=1e-6, rtol=1e-6)
    assert not figures["match"] and figures["outputs_differing"] == 2
    assert figures["differing"] == [
        {"output": "output['grad']['w']", "mismatched": 1, "of": 3, "max_abs_diff": 2.0, "relative_error": 2.0 / 3**0.5},
        {"output": "output['labels']", "mismatched": 1, "of": 3},
    ]


def test_training_outputs_name_each_gradient_and_parameter():
    model = torch.nn.Sequential(torch.nn.Linear(2, 1), torch.nn.Linear(1, 1))
    model[0].requires_grad_(False)
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    out = training_outputs(model, loss, parameters=True)
    assert out["grad"]["0.weight"] is None and out["grad"]["1.weight"].shape == (1, 1)
    assert sorted(out["param"]) == ["0.bias", "0.weight", "1.bias", "1.weight"] and out["loss"].requires_grad is False


def test_describe():
    assert describe((torch.zeros(2, 3), torch.zeros(1, dtype=torch.long))) == "(2, 3) float32, (1,) int64"


def test_a_scaled_tolerance_follows_each_tensor_s_largest_magnitude():
    """Rounding of a large tensor's terms lands on its elements near zero; a small tensor keeps a tight bound."""
    want = {"large": torch.tensor([4e-2, 0.0]), "small": torch.tensor([1e-5, 1e-6])}
    rounding = {"large": torch.tensor([4e-2, 6e-8]), "small": torch.tensor([1e-5, 1e-6])}
    assert not compare(rounding, want, atol=2e-9, rtol=1e-4)["match"]
    assert compare(rounding, want, atol=2e-9, rtol=1e-4, scale=1e-5)["match"]
    off = {"large": torch.tensor([4e-2, 0.0]), "small": torch.tensor([1e-5, 1.05e-6])}  # a small gradient 5% off
    assert not compare(off, want, atol=2e-9, rtol=1e-4, scale=1e-5)["match"]  # what a loose atol (2e-7) would let through
    assert compare(off, want, atol=2e-7, rtol=1e-4)["match"]


def test_the_tolerance_excess_says_how_many_tolerances_the_worst_element_is_away():
    want = torch.tensor([1.0, 2.0, 0.0])
    figures = compare(torch.tensor([1.0, 2.5, 0.0]), want, atol=0.01, rtol=0.01)
    assert figures["tolerance_excess"] == pytest.approx(0.5 / (0.01 + 0.02))
    assert compare(torch.tensor([float("nan"), 2.0, 0.0]), want, atol=0.01, rtol=0.0)["tolerance_excess"] == float("inf")
    assert compare(torch.tensor([1.0, 2.5, 0.0]), want, atol=0.0, rtol=0.0)["tolerance_excess"] == float("inf")
    assert "tolerance_excess" not in compare(want, want, atol=0.0, rtol=0.0)
    both_infinite = compare(torch.tensor([float("inf"), 2.0, 1.001]), torch.tensor([float("inf"), 2.0, 1.0]), atol=1e-4, rtol=0.0)
    assert both_infinite["tolerance_excess"] == pytest.approx(10.0, rel=1e-3)


def test_the_tolerance_used_says_how_near_a_matching_output_came_to_its_line():
    want = torch.tensor([1.0, 2.0, 0.0])
    figures = compare(torch.tensor([1.0, 2.01, 0.0]), want, atol=0.01, rtol=0.01)
    assert figures["match"] and figures["tolerance_used"] == pytest.approx(0.01 / (0.01 + 0.02), rel=1e-4)
    assert compare(want, want, atol=0.0, rtol=0.0)["tolerance_used"] == 0.0
    beyond = compare(torch.tensor([1.0, 2.5, 0.0]), want, atol=0.01, rtol=0.01)
    assert beyond["tolerance_used"] == beyond["tolerance_excess"]
    assert "tolerance_used" not in compare(torch.tensor([1, 2]), torch.tensor([1, 2]), atol=0.0, rtol=0.0)


@pytest.mark.parametrize("seed", range(40))
def test_the_figures_of_finite_outputs_are_those_of_the_path_that_handles_nan_and_infinity(seed):
    """compare reads a finite pair in a few passes (harness/measure/compare.py: `_finite_figures`); every figure must be
    the one torch.isclose and the NaN-aware path give, at the line, at 0 allowed, and far from both."""
    from harness.measure import compare as module

    generator = torch.Generator().manual_seed(seed)
    want = torch.randn(500, generator=generator, dtype=torch.float64) * 10.0 ** (seed % 7 - 3)
    want[torch.rand(500, generator=generator) < 0.2] = 0.0
    got = want + torch.randn(500, generator=generator, dtype=torch.float64) * 10.0 ** (seed % 5 - 8)
    got[:5] = want[:5]  # exact
    for atol, rtol, scale in ((0.0, 0.0, 0.0), (0.0, 1e-4, 0.0), (1e-6, 1e-5, 0.0), (1e-8, 1e-4, 1e-3)):
        bound = atol + scale * float(want.abs().max()) if scale else atol
        allowed = bound + rtol * want.abs()
        at_the_line = got.clone()
        at_the_line[5:10] = want[5:10] + allowed[5:10]  # |got - want| exactly its allowance: within, as isclose says
        for pair in ((got, want), (at_the_line, want)):
            fast, slow = (
                {key: 0.0 for key in ("max_abs_diff", "used", "error_sq", "reference_sq")},
                {key: 0.0 for key in ("max_abs_diff", "used", "error_sq", "reference_sq")},
            )
            raw = pair[0] - pair[1]
            largest = (float(raw.abs().max()), float(pair[1].abs().max()))
            assert module._finite_figures(raw, raw.abs(), pair[1].abs(), largest, atol, rtol, scale, fast) == module._any_figures(
                *pair, raw, atol, rtol, scale, slow
            )
            assert fast == slow
