"""clip_before_unscale: what the case's docstring says of GradScaler and the clipping, checked on the installed torch
(each fast: the yaml's steps on 16 images, one thread)."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from cases import clip_before_unscale as case
from harness.cases import CASE_CONFIG_DIR
from harness.measure.compare import compare, tolerance_of

CFG = OmegaConf.load(CASE_CONFIG_DIR / "clip_before_unscale.yaml")


def inputs(scale=None, batch=16):
    cfg = OmegaConf.merge(CFG, {"sizes": {"batch": batch}})
    if scale is not None:
        cfg.scaler.scale = scale
    return case.make_inputs(cfg, "cpu")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def matches(out, x):
    return compare(out, case.reference(x), **tolerance_of(CFG.tolerance))["match"]


def test_the_net_is_the_mnist_examples():
    model = case.Net()
    assert sum(p.numel() for p in model.parameters()) == 1_199_882
    assert [tuple(p.shape) for p in model.parameters()] == [
        (32, 1, 3, 3),
        (32,),
        (64, 32, 3, 3),
        (64,),
        (128, 9216),
        (128,),
        (10, 128),
        (10,),
    ]


def test_clip_grad_norm_before_unscale_measures_the_scale_times_the_true_norm():
    layer = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")  # the CPU GradScaler of every torch in the matrix (2.3 on)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = layer(torch.randn(16, 8)).float().pow(2).mean()
    true = torch.autograd.grad(loss, list(layer.parameters()), retain_graph=True)
    true_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in true]))
    scaler.scale(loss).backward()
    measured = nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
    assert scaler.get_scale() == 65536.0
    assert measured / true_norm == pytest.approx(65536.0, rel=1e-2)
    scaler.unscale_(optimizer)  # after the clip: the gradients are max_norm / scale
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in layer.parameters()]))
    assert after == pytest.approx(1 / 65536, rel=1e-4)


def test_the_buggy_steps_take_max_norm_over_the_scale_and_the_fix_max_norm():
    x = inputs()
    buggy, fixed = case.buggy(x), case.fixed(x)
    for step in buggy:
        assert float(step["clipped_norm"]) == pytest.approx(CFG.max_norm / CFG.scaler.scale, rel=1e-3)  # 3.05e-5
    for step in fixed:
        assert float(step["clipped_norm"]) == pytest.approx(CFG.max_norm, rel=1e-3)  # the unclipped norm is about 4 on 16 images
    assert matches(fixed, x) and not matches(buggy, x)


def test_max_norm_times_65536_is_the_fix_only_while_the_scale_is_65536():
    """The bad fix is exact at the default scale, and wrong once the scale has moved (2^15 after an overflow)."""
    at_default = inputs(scale=65536.0)
    assert matches(case.max_norm_times_the_scale(at_default), at_default)
    moved = inputs()
    assert moved.scaler_state["scale"] == 32768.0
    first = case.max_norm_times_the_scale(moved)[0]
    assert float(first["clipped_norm"]) > 1.5 * CFG.max_norm  # clipped at 2.0 in true units: not at all here
    assert not matches(case.max_norm_times_the_scale(moved), moved)


def test_clipping_after_the_step_leaves_clipped_gradients_and_unclipped_updates():
    x = inputs()
    after, ref = case.clip_after_the_step(x)[0], case.reference(x)[0]
    assert float(after["clipped_norm"]) == pytest.approx(1.0, rel=1e-3)
    moved = torch.linalg.vector_norm(torch.stack(list(after["update_norm"].values())))
    wanted = torch.linalg.vector_norm(torch.stack(list(ref["update_norm"].values())))
    assert moved > 1.2 * wanted


def test_the_slow_control_is_correct_and_runs_each_forward_twice(monkeypatch):
    x = inputs()
    calls = []
    forward = case.forward_loss

    def counted(model, batch):
        calls.append(1)
        return forward(model, batch)

    monkeypatch.setattr(case, "forward_loss", counted)
    out = case.norm_from_an_unscaled_pass(x)
    assert len(calls) == 2 * len(x.batches)
    monkeypatch.setattr(case, "forward_loss", forward)
    assert matches(out, x)


def test_the_scale_aware_clip_of_the_alternative_is_the_fix():
    from tests.fixes.alternatives.clip_before_unscale import clip_before_unscale as alternative

    x = inputs()
    assert matches(alternative(x), x)
