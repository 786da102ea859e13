"""fp16_grad_underflow: what the case's docstring says of torch, checked on the installed torch (each fast).

The refusal and CPU float16 autocast hold on torch 2.3.1 to 2.15.0 (run on each by hand; the matrix records them);
the figures of the bad fixes are the docstring's (the yaml's 4 micro-batches: at 1, the loss is not divided by 4 and
only 4% of the gradient entries reaching to_q underflow to 0, against 82%).
"""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from cases import fp16_grad_underflow as case
from harness.cases import CASE_CONFIG_DIR


@pytest.fixture(scope="module")
def inputs():
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "fp16_grad_underflow.yaml")
    return case.make_inputs(cfg, "cpu")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_adapters_added_after_the_cast_are_float16(inputs):
    assert {p.dtype for p in case.lora_parameters(inputs.unet)} == {torch.float16}
    assert {p.dtype for p in inputs.unet.parameters() if not p.requires_grad} == {torch.float16}
    assert len(case.lora_parameters(inputs.unet)) == 2 * 2 * len(case.LORA_TARGETS)  # A and B, both attentions


def test_cpu_grad_scaler_refuses_float16_gradients_and_cpu_autocast_runs_float16():
    layer = nn.Linear(8, 8).half()
    optimizer = torch.optim.AdamW(layer.parameters())
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        out = layer(torch.randn(4, 8))
    assert out.dtype == torch.float16
    scaler.scale(out.float().pow(2).mean()).backward()
    with pytest.raises(ValueError, match=r"^Attempting to unscale FP16 gradients\.$"):
        scaler.unscale_(optimizer)


def test_float16_adamw_with_eps_1e_8_turns_small_gradients_into_inf_and_zero_ones_into_nan():
    weight = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    weight.grad = torch.tensor([1e-4, -3e-4, 0.0], dtype=torch.float16)
    optimizer = torch.optim.AdamW([weight], lr=1e-4, weight_decay=1e-2, eps=1e-8)
    optimizer.step()
    assert (optimizer.state[weight]["exp_avg_sq"] == 0).all()  # (1 - 0.999) * g**2 underflows
    assert weight[0].item() == -float("inf") and weight[1].item() == float("inf") and weight[2].isnan()


def gradients_reaching_to_q(x, scaler):
    """The gradient entries reaching the self-attention's to_q output in one accumulated step, and how many are 0."""
    unet = case.fresh_unet(x)
    for param in unet.parameters():
        if param.requires_grad:
            param.data = param.to(torch.float32)
    seen = []
    unet.transformer_block.attn1.to_q.register_full_backward_hook(lambda module, grad_in, grad_out: seen.append(grad_out[0]))
    case.accumulate(x, unet, scaler)
    return sum(int((g == 0).sum()) for g in seen), sum(g.numel() for g in seen)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_without_the_scaler_most_gradients_reaching_to_q_underflow_to_zero(inputs):
    zeros_unscaled, total = gradients_reaching_to_q(inputs, None)
    zeros_scaled, _ = gradients_reaching_to_q(inputs, torch.amp.GradScaler("cpu"))
    assert zeros_unscaled > 0.5 * total  # the docstring: 214,611 of 262,144 over 4 micro-batches
    assert zeros_scaled < 0.001 * total


def test_dropping_the_scaler_leaves_the_adapters_inf_or_nan(inputs):
    kept = {}

    def spied(x):
        kept["unet"] = unet = fresh(x)
        return unet

    fresh, case.fresh_unet = case.fresh_unet, spied
    try:
        case.drop_the_scaler(inputs)
    finally:
        case.fresh_unet = fresh
    weights = torch.cat([p.detach().flatten().float() for p in case.lora_parameters(kept["unet"])])
    assert (~torch.isfinite(weights)).float().mean() > 0.99  # the docstring: 9,715 of 9,728 after one step


def test_the_slow_control_is_the_fix_beside_two_more_steps_of_its_own(inputs, monkeypatch):
    """underflow_check_left_on: the fix's step exactly, beside two more UNets made as the step makes its own, each
    run through every micro-batch (its cost is the step's own work twice again); without the scaler the
    self-attention's to_q and to_k adapters keep 16% and 11% of their gradient norm (the docstring), to_v all of it,
    with float32 or float16 adapters alike."""
    fresh, norms, made, calls, logged = case.fresh_unet, case.unscaled_norms, [], [], []

    def counted(x):
        made.append(fresh(x))
        made[-1].register_forward_pre_hook(lambda module, args: calls.append(1))
        return made[-1]

    def kept(*args, **kwargs):
        logged.append(norms(*args, **kwargs))
        return logged[-1]

    monkeypatch.setattr(case, "fresh_unet", counted)
    monkeypatch.setattr(case, "unscaled_norms", kept)
    fixed = case.fixed(inputs)
    scaled = [p.grad.norm().item() for p in case.lora_parameters(made[0])]
    once, calls[:], made[:] = len(calls), [], []
    checked = case.underflow_check_left_on(inputs)
    assert once == inputs.target.shape[0] and len(calls) == 3 * once and len(made) == 3
    assert set(fixed) == set(checked)
    for key in fixed:
        if isinstance(fixed[key], dict):
            for name, value in fixed[key].items():
                assert (value is None and checked[key][name] is None) or torch.equal(value, checked[key][name]), (key, name)
        else:
            assert torch.equal(fixed[key], checked[key])
    names = [name for name, p in inputs.unet.named_parameters() if p.requires_grad]
    for unscaled in logged:
        kept_norm = {name: u / s for name, u, s in zip(names, unscaled, scaled) if name.endswith("lora_B.weight")}  # A: 0, B = 0
        assert 0.14 < kept_norm["transformer_block.attn1.to_q.lora_B.weight"] < 0.19
        assert 0.09 < kept_norm["transformer_block.attn1.to_k.lora_B.weight"] < 0.14
        assert abs(kept_norm["transformer_block.attn1.to_v.lora_B.weight"] - 1) < 0.01
