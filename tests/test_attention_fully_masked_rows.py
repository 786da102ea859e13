"""attention_fully_masked_rows beyond the harness phases: the forward right and the gradients NaN, where the NaN comes
from, PyTorch's own attention on the same rows per torch version (as measured), and by how much each wrong fix is wrong."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.torch_version import TorchVersion

from cases import attention_fully_masked_rows as case
from harness.cases import CASE_CONFIG_DIR
from tests.fixes.alternatives.attention_fully_masked_rows import attention_fully_masked_rows as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "attention_fully_masked_rows.yaml")
TORCH = TorchVersion(torch.__version__.split("+")[0])


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


def relative(got, want):
    """Each parameter's gradient distance from the reference's over the reference's norm (inf where NaN), and all together."""
    per = {name: float((got["grad"][name] - g).nan_to_num(float("inf")).norm() / g.norm()) for name, g in want["grad"].items()}
    diff = torch.cat([(got["grad"][name] - g).nan_to_num(float("inf")).flatten() for name, g in want["grad"].items()])
    return per, float(diff.norm() / torch.cat([g.flatten() for g in want["grad"].values()]).norm())


def test_every_batch_pads_so_some_query_rows_hide_every_key(x):
    assert len(set(x.lengths)) > 1 and min(x.lengths) < max(x.lengths)  # unequal graphs: padded rows in all but the largest


def test_the_forward_is_right_and_14_gradients_are_nan(x, want):
    got = case.buggy(x)
    assert torch.allclose(got["pred"], want["pred"], atol=1e-5) and torch.allclose(got["loss"], want["loss"], atol=1e-6)
    nan = sorted(name for name, g in got["grad"].items() if torch.isnan(g).any())
    encoder0 = sorted(name for name in got["grad"] if name.startswith("encoder.0."))
    assert nan == sorted(encoder0 + ["encoder.1.proj_v.weight", "encoder.1.proj_o.weight"])
    assert len(nan) == 14 and len(got["grad"]) == 55
    assert int(got["nonfinite_grads"]) == 41408 and int(want["nonfinite_grads"]) == 0


def test_the_nan_is_the_softmax_of_a_padded_row_and_the_fix_makes_it_zero():
    e = torch.randn(2, 1, 3, 3)
    mask = torch.zeros(2, 1, 3, 3)
    mask[0, :, :3, :3] = 1
    mask[1, :, :2, :2] = 1  # graph 1 has 2 nodes: its third query row is padding, every key masked
    values = torch.randn(2, 3, 1, 4)
    out = case.attend_buggy(e.clone(), mask, values)
    assert torch.isnan(out[1, 2]).all() and torch.isfinite(out[0]).all() and torch.isfinite(out[1, :2]).all()
    assert torch.equal(case.attend_fixed(e.clone(), mask, values)[1, 2], torch.zeros(1, 4))


def test_pytorch_attention_on_a_fully_masked_row_per_torch_version():
    """As measured on CPU (docstring): SDPA NaN on 2.4.1, zeros from 2.6.0 (2.5 not run); nn.MultiheadAttention NaN with
    the default need_weights=True on every version run."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 4, 8, requires_grad=True)
    k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[1] = False  # the second sequence hides every key
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    (grad,) = torch.autograd.grad(out.sum(), q)
    if TORCH >= "2.6":
        assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isfinite(grad).all()
    elif TORCH < "2.5":
        assert torch.isnan(out[1]).all() and torch.isnan(grad).any()
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    seq = torch.randn(2, 4, 8)
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1] = True
    out, _ = mha(seq, seq, seq, key_padding_mask=padding)  # need_weights=True, the default
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()


def test_nan_to_num_of_the_output_leaves_13_gradients_nan(x, want):
    got = case.nan_to_num_output(x)
    assert torch.allclose(got["loss"], want["loss"], atol=1e-6)  # the forward was right already
    assert sum(bool(torch.isnan(g).any()) for g in got["grad"].values()) == 13 and int(got["nonfinite_grads"]) == 37312


def test_filling_with_minus_1e_minus_9_attends_to_the_padding(x, want):
    got = case.fill_minus_1e_minus_9(x)
    assert int(got["nonfinite_grads"]) == 0
    pred_off = float((got["pred"] - want["pred"]).norm() / want["pred"].norm())
    per, together = relative(got, want)
    assert pred_off > 2.5 and together > 2.0 and min(per.values()) > 1e-3  # 294%, 265%, every one of the 55 off


def test_nan_to_num_of_the_gradients_zeroes_14(x, want):
    got = case.nan_to_num_gradients(x)
    per, together = relative(got, want)
    zeroed = [name for name, g in got["grad"].items() if not g.any()]
    assert len(zeroed) == 14 and all(per[name] == pytest.approx(1.0) for name in zeroed)
    assert 0.15 < together < 0.3  # 21% of all 55 together


def test_the_alternative_and_the_slow_control_are_right(x, want):
    for got in (alternative(x), case.one_graph_at_a_time(x)):
        assert int(got["nonfinite_grads"]) == 0
        assert relative(got, want)[1] < 1e-5
