"""zero_grad_set_to_none beyond the harness phases: which torch releases raise, that the reference is torch's SGD with
momentum, and how each wrong fix is wrong."""

import inspect

import pytest
import torch
from omegaconf import OmegaConf
from torch.torch_version import TorchVersion

from cases import zero_grad_set_to_none as case
from harness.cases import CASE_CONFIG_DIR, case_text
from harness.measure.compare import compare
from tests.fixes.alternatives.zero_grad_set_to_none import zero_grad_set_to_none as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "zero_grad_set_to_none.yaml")
NONE_BY_DEFAULT = TorchVersion(torch.__version__) >= "2.0"
TOLERANCE = dict(CFG.tolerance)


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


def matches(got, want):
    return compare(got, want, **TOLERANCE)["match"]


@pytest.mark.parametrize(("version", "raises"), [("1.13.1", False), ("2.0.1", True), ("2.3.1", True), ("2.13.0+cpu", True)])
def test_the_symptom_is_expected_from_torch_2_0(version, raises):
    for device in ("cpu", "cuda"):
        assert case.symptoms[device].expected_on(version) is raises


def test_the_default_of_both_zero_grads_is_none_on_this_torch_as_its_release_says():
    for zero_grad in (torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad):
        assert inspect.signature(zero_grad).parameters["set_to_none"].default is NONE_BY_DEFAULT


def test_the_quoted_error_is_the_one_the_symptom_matches():
    quoted = case_text(case).sections["Symptom on CPU"]
    assert "unsupported operand type(s) for +=: 'NoneType' and 'Tensor'" in quoted


@pytest.mark.skipif(not NONE_BY_DEFAULT, reason="zero_grad() zeroes in place before torch 2.0")
def test_buggy_raises_in_the_second_round_not_the_first(x):
    server = case.BatchUpdateParameterServer(case.server_model(x), x.images.shape[1], x.lr, x.momentum, case.zero_grad_by_default)
    grads = [torch.ones_like(p) for p in server.model.parameters()]
    for _ in range(x.images.shape[1]):  # the first round: the gradients __init__ made
        server.update_and_fetch_model(grads)
    assert all(p.grad is None for p in server.model.parameters())  # zero_grad() at the round's end
    with pytest.raises(TypeError, match=case.NONE_PLUS_TENSOR):
        server.update_and_fetch_model(grads)


def test_the_reference_is_torchs_sgd_with_momentum_on_the_trainers_mean_gradient(x, want):
    """The reference's hand-written momentum against torch.optim.SGD stepped on the same mean gradients."""
    model = case.server_model(x)
    optimizer = torch.optim.SGD(model.parameters(), lr=x.lr, momentum=x.momentum)
    for batches in x.images:
        losses = [torch.nn.functional.mse_loss(model(inputs), x.labels[t]) for t, inputs in enumerate(batches)]
        optimizer.zero_grad()
        torch.stack(losses).mean().backward()
        optimizer.step()
    assert matches(case.updates(model, x), want)


def test_the_steps_move_every_weight_and_the_first_round_alone_is_far_from_six(x, want):
    steps = torch.cat([update.flatten() for update in want["update"].values()])
    assert (steps != 0).float().mean() > 0.9
    one_round = case.Inputs(x.images[:1], *x[1:])
    assert not matches(case.reference(one_round), want)  # what skip_none_gradients trains


def test_fixed_the_alternative_and_the_slow_control_match_the_reference(x, want):
    for candidate in (case.fixed, alternative, case.replay_every_step, case.speed_baseline):
        assert matches(candidate(x), want), candidate.__name__


def test_skipping_none_gradients_trains_the_first_round_only(x, want):
    got = case.skip_none_gradients(x)
    if NONE_BY_DEFAULT:
        assert matches(got, case.reference(case.Inputs(x.images[:1], *x[1:])))
        assert not matches(got, want)
    else:
        assert matches(got, want)  # nothing is None before 2.0: right by luck of the version


def test_assigning_keeps_the_last_trainers_gradient_on_every_release(x, want):
    assert not matches(case.assign_instead_of_add(x), want)


def test_the_modules_zero_grad_changed_with_the_optimizers(x, want):
    if NONE_BY_DEFAULT:
        with pytest.raises(TypeError, match=case.NONE_PLUS_TENSOR):
            case.module_zero_grad(x)
    else:
        assert matches(case.module_zero_grad(x), want)
