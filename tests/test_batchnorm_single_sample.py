"""batchnorm_single_sample beyond the harness phases: the split the thread's sizes give, where torch's check sits in
BatchNorm's forward, and why turning running statistics off cannot help."""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from cases import batchnorm_single_sample as case
from harness.cases import CASE_CONFIG_DIR

CFG = OmegaConf.load(CASE_CONFIG_DIR / "batchnorm_single_sample.yaml")
MESSAGE = "Expected more than 1 value per channel when training, got input size torch.Size([1, 128])"


def test_the_threads_sizes_leave_one_cell_for_the_last_minibatch():
    x = case.make_inputs(CFG, "cpu")
    assert len(x.epoch_order) == 129 and len(x.epoch_order) % x.batch_size == 1  # ceil(0.9 * 143) = 129 = 128 + 1
    assert [len(batch["X"]) for batch in case.train_loader(x)] == [128, 1]
    assert [len(batch["X"]) for batch in case.train_loader(x, drop_last=True)] == [128]


def test_the_check_raises_after_the_layer_counted_the_batch_and_before_its_statistics_move():
    """BatchNorm's forward counts the batch, then F.batch_norm checks the size in Python before any kernel: a caller
    that catches the error and carries on is left with a count one ahead of its running statistics."""
    layer = nn.BatchNorm1d(128, momentum=0.01, eps=0.001)
    with pytest.raises(ValueError) as raised:
        layer(torch.randn(1, 128))
    assert str(raised.value) == MESSAGE
    assert int(layer.num_batches_tracked) == 1
    assert torch.equal(layer.running_mean, torch.zeros(128)) and torch.equal(layer.running_var, torch.ones(128))


def test_without_running_statistics_a_lone_sample_raises_in_eval_mode_too():
    """pytorch/pytorch#156051: track_running_stats=False normalises by the batch in eval as well, so the check runs
    there too; with running statistics, eval normalises one sample by them and passes."""
    without = nn.BatchNorm1d(128, track_running_stats=False).eval()
    with pytest.raises(ValueError, match=r"Expected more than 1 value per channel when training"):
        without(torch.randn(1, 128))
    assert nn.BatchNorm1d(128).eval()(torch.randn(1, 128)).shape == (1, 128)
