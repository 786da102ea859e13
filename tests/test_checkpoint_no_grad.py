"""checkpoint_no_grad: what the installed torch does with a checkpoint whose inputs need no grad, and the signature of
the silent form (the head trains, the adapters inside the checkpointed layers get None). Fast: no harness run."""

import warnings

import pytest
import torch
from omegaconf import OmegaConf
from torch.torch_version import TorchVersion
from torch.utils.checkpoint import checkpoint

from cases import checkpoint_no_grad as case
from harness.cases import CASE_CONFIG_DIR
from harness.measure.compare import compare

# What `checkpoint(...)` without use_reentrant warns, per release (the case's docstring says which rows were run: 2.13.0
# here; the others from pytorch PRs #100551, #116710, #160643, the 2.3.0 release notes, issue #160534 and users' logs).
UNSET_WARNING = (
    ("2.1", "2.3", r"please pass in use_reentrant=True or use_reentrant=False explicitly"),
    ("2.3", "2.4", r"should be passed explicitly\. In version 2\.4 we will raise an exception"),
    ("2.4", "2.9", r"should be passed explicitly\. In version 2\.[45] we will raise an exception"),
    (
        "2.9",
        None,
        r"should be passed explicitly\. Starting in PyTorch 2\.9, calling checkpoint without use_reentrant will raise an exception",
    ),
)
NO_GRAD_WARNING = "None of the inputs have requires_grad=True. Gradients will be None"


def _unset_warning(version: str) -> str | None:
    version = TorchVersion(version)
    return next((pattern for start, end, pattern in UNSET_WARNING if version >= start and (end is None or version < end)), None)


@pytest.fixture(scope="module")
def cfg():
    return OmegaConf.load(CASE_CONFIG_DIR / "checkpoint_no_grad.yaml")


def test_an_unset_use_reentrant_is_still_the_reentrant_checkpoint_and_warns_twice():
    layer = torch.nn.Linear(4, 4)  # trainable, inside the block
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = checkpoint(layer, torch.randn(2, 4))  # the input needs no grad
    said = [str(w.message) for w in caught]
    assert not out.requires_grad, "the non-reentrant checkpoint would give the output a grad_fn through the layer's weights"
    assert NO_GRAD_WARNING in said
    expected = _unset_warning(torch.__version__)
    assert expected is not None and any(__import__("re").search(expected, message) for message in said), said


def test_the_non_reentrant_checkpoint_reaches_parameters_whatever_the_inputs():
    layer = torch.nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        checkpoint(layer, torch.randn(2, 4), use_reentrant=False).sum().backward()
    assert layer.weight.grad is not None


def test_buggy_trains_the_head_and_leaves_every_adapter_without_a_gradient(cfg):
    x = case.make_inputs(cfg, "cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = case.buggy(x)
    want = case.reference(case.make_inputs(cfg, "cpu"))
    adapters = [name for name in want["grad"] if ".lora_" in name]
    head = {name: got["grad"][name] for name in want["grad"] if name.startswith("classifier.")}
    assert len(adapters) == 4 * cfg.sizes.layers and all(got["grad"][name] is None for name in adapters)
    assert compare(
        {"loss": got["loss"], "grad": head}, {"loss": want["loss"], "grad": {n: want["grad"][n] for n in head}}, **cfg.tolerance
    )["match"]
    assert sum(NO_GRAD_WARNING in str(w.message) for w in caught) == cfg.sizes.layers  # one per checkpointed layer


def test_the_inputs_the_fix_is_given_are_left_as_they_were(cfg):
    x = case.make_inputs(cfg, "cpu")
    case.fixed(x)
    case.speed_baseline(x)
    assert not x.model.get_input_embeddings().weight.requires_grad
    assert not x.model.get_input_embeddings()._forward_hooks  # the baseline removes its hook
