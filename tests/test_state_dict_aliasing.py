"""state_dict_aliasing beyond the harness phases: what `state_dict()` returns, which epoch each version of fit hands
back, and that every wrong fix is the buggy code's numbers exactly."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from cases import state_dict_aliasing as case
from harness.cases import CASE_CONFIG_DIR
from harness.measure.compare import compare

CFG = OmegaConf.load(CASE_CONFIG_DIR / "state_dict_aliasing.yaml")
TOLERANCE = dict(CFG.tolerance)


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


def curve(x):
    """The validation metric after each epoch, up to where PyPOTS's patience stops the loop, and the parameters there."""
    model = copy.deepcopy(x.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=x.lr)
    metrics = []
    for epoch in range(1, x.epochs + 1):
        case.train_epoch(model, model.calc_criterion, optimizer, x, epoch)
        metrics.append(case.validation_metric(model, model.calc_criterion, x))
        if len(metrics) - 1 - metrics.index(min(metrics)) == x.patience:
            break
    return metrics, model


def test_state_dict_holds_the_parameters_own_storage(x):
    model = copy.deepcopy(x.model)
    kept = model.state_dict()
    for name, p in model.named_parameters():
        assert kept[name].data_ptr() == p.data_ptr() and not kept[name].requires_grad
    with torch.no_grad():
        model.backbone.linear_trend.bias.add_(1.0)  # what optimizer.step() does, in place
    assert torch.equal(kept["backbone.linear_trend.bias"], model.backbone.linear_trend.bias)


def test_seed_0_has_its_best_epoch_six_before_the_stop(x):
    metrics, _ = curve(x)
    best = metrics.index(min(metrics)) + 1
    assert (best, len(metrics)) == (22, 28)  # the docstring's figures: best at 22, patience 6 stops at 28


def test_the_buggy_fit_returns_the_last_epochs_model(x, want):
    _, last = curve(x)
    got = case.buggy(x)
    assert compare(got["param"], {n: p.detach() for n, p in last.named_parameters()}, atol=0.0, rtol=0.0)["match"]
    assert not compare(got, want, **TOLERANCE)["match"]
    differing = [n for n in want["param"] if not torch.allclose(got["param"][n], want["param"][n], **TOLERANCE)]
    assert len(differing) == len(want["param"]) == 12  # every parameter tensor is the last epoch's


def test_the_fix_and_the_alternative_return_the_best_epochs_model(x, want):
    from tests.fixes.alternatives.state_dict_aliasing import state_dict_aliasing as alternative

    assert compare(case.fixed(x), want, **TOLERANCE)["match"]
    assert compare(alternative(x), want, **TOLERANCE)["match"]


@pytest.fixture(scope="module")
def buggy(x):
    return case.buggy(x)


@pytest.mark.parametrize("name", sorted(case.bad_fixes))
def test_each_shallow_copy_is_the_buggy_code_exactly(x, buggy, name):
    assert compare(case.bad_fixes[name](x), buggy, atol=0.0, rtol=0.0)["match"]


def test_cpu_is_no_copy_on_the_cpu(x):
    """`{k: v.cpu() ...}` (named in the docstring, not a bad fix): on CUDA a copy, on the CPU the same tensor."""
    model = copy.deepcopy(x.model)
    assert all(v.cpu() is v for v in model.state_dict().values())


def test_the_slow_control_is_correct(x, want):
    assert compare(case.every_epoch_element_by_element(x), want, **TOLERANCE)["match"]


def test_inputs_are_left_as_they_were(x):
    before = {n: p.detach().clone() for n, p in x.model.named_parameters()}
    case.fixed(x)
    assert all(torch.equal(before[n], p) for n, p in x.model.named_parameters())
