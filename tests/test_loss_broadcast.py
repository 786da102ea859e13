"""loss_broadcast beyond the harness phases: what the (N, N) loss trains towards, the warning as FARM #229 printed it,
and by how much each wrong fix is wrong."""

import copy
import re
import warnings

import pytest
import torch
from omegaconf import OmegaConf

from cases import loss_broadcast as case
from harness.cases import CASE_CONFIG_DIR
from harness.measure.compare import compare

CFG = OmegaConf.load(CASE_CONFIG_DIR / "loss_broadcast.yaml")
TOLERANCE = dict(CFG.tolerance)


@pytest.fixture
def x():
    return case.make_inputs(CFG, "cpu")


def quietly(function, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(x)


def test_the_warning_is_the_threads_text_for_the_batch_of_32(x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        case.buggy(x)
    messages = [str(w.message) for w in caught]
    assert messages[0] == (
        "Using a target size (torch.Size([32, 1])) that is different to the input size (torch.Size([32])). "
        "This will likely lead to incorrect results due to broadcasting. Please ensure they have the same size."
    )
    assert re.search(case.WARNING, messages[1]) and "torch.Size([1, 1])" in messages[1] and "torch.Size([]))" in messages[1]
    assert caught[0].filename.endswith("torch/nn/modules/loss.py")  # attributed to MSELoss.forward, as in the thread


def test_the_buggy_gradient_is_the_intended_one_with_every_label_replaced_by_the_batch_mean(x):
    """d/dp_j of mean_ij (p_j - y_i)^2 is 2 (p_j - mean(y)) / N: the model is trained towards the batch's mean label."""
    got = quietly(case.buggy, x)[0]
    params = {name: p.detach().double() for name, p in x.model.named_parameters()}
    states, labels = x.batches[0]
    towards_the_mean = case.by_hand(params, states.double(), labels.double().reshape(-1).mean().expand(len(labels)))
    assert compare(got["grad"], towards_the_mean["grad"], **TOLERANCE)["match"]
    intended = case.reference(x)[0]
    assert compare(got["grad"]["head.bias"], intended["grad"]["head.bias"], **TOLERANCE)["match"]  # the sums agree
    assert not compare(got["grad"]["head.weight"], intended["grad"]["head.weight"], **TOLERANCE)["match"]


def test_the_buggy_code_is_right_on_the_last_batch_of_one(x):
    got, want = quietly(case.buggy, x)[-1], case.reference(x)[-1]
    assert len(x.batches[-1][1]) == 1 and compare(got, want, **TOLERANCE)["match"]


def test_training_on_the_pairs_learns_the_mean():
    """Plain SGD of the head on the batch of 32 (the pooler's output held fixed): the buggy loss collapses the
    predictions onto the mean label, the fixed one fits the labels."""

    def train(logits_to_loss):
        x = case.make_inputs(CFG, "cpu")
        states, labels = x.batches[0]
        with torch.no_grad():
            pooled = torch.tanh(x.model.pooler(states))
        for _ in range(200):  # plain SGD, lr 0.05
            x.model.head.zero_grad()
            logits_to_loss(x, x.model.head(pooled), labels).mean().backward()
            with torch.no_grad():
                for p in x.model.head.parameters():
                    p -= 0.05 * p.grad
        with torch.no_grad():
            return x.model.head(pooled).reshape(-1), labels.reshape(-1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        buggy, labels = train(case.farm_logits_to_loss)
    fixed, _ = train(case.fixed_logits_to_loss)
    assert abs(float(buggy.mean() - labels.mean())) < 0.05 and float(buggy.std()) < 0.2 * float(labels.std())
    assert float(torch.corrcoef(torch.stack([fixed, labels]))[0, 1]) > 0.9


def test_a_bare_squeeze_of_the_labels_too_is_right_but_for_the_last_batchs_shape(x):
    per_sample = []

    def squeezed(x, logits, labels):
        loss = x.loss_fct(logits.squeeze(), labels.float().squeeze())
        per_sample.append(loss.detach())
        return loss

    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        case.train_epoch(x, squeezed)
    assert [tuple(t.shape) for t in per_sample] == [(32,), ()]
    want = case.reference(x)
    assert torch.allclose(per_sample[0], want[0]["per_sample_loss"], **TOLERANCE)
    assert torch.allclose(per_sample[1], want[1]["loss"], **TOLERANCE)  # the 0-d loss of the batch of 1 has the right value


def test_reduction_sum_sums_all_32_x_32_pairs(x):
    states, labels = x.batches[0]
    logits = x.model.head(torch.tanh(x.model.pooler(states)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summed = torch.nn.MSELoss(reduction="sum")(logits.squeeze(), labels)
        pairs = x.loss_fct(logits.squeeze(), labels)
    assert summed.shape == () and torch.allclose(summed, pairs.sum())
    ratio = float(summed.detach() / case.reference(x)[0]["loss"])
    assert 900 < ratio < 1100  # 990x on seed 0: 1024 pairs, whose mean is 3% under the intended loss


def test_silencing_the_warning_changes_no_number(x):
    silenced = case.silence_the_warning(copy.deepcopy(x))
    assert compare(silenced, quietly(case.buggy, x), atol=0.0, rtol=0.0)["match"]


def full_batches_only(x):
    """The squeeze taken out for the batch of 32 alone (tests/exploits/loss_broadcast_full_batches_only.py)."""
    return case.train_epoch(x, lambda x, logits, labels: x.loss_fct(logits if len(logits) == 32 else logits.squeeze(), labels.float()))


def test_the_published_epoch_ends_on_one_sample_and_every_other_seed_on_two_to_31():
    assert CFG.seed == CFG.last_batch_of_one_seed and [len(y) for _, y in case.make_inputs(CFG, "cpu").batches] == [32, 1]
    last = {case.epoch_samples(OmegaConf.merge(CFG, {"seed": seed})) - 32 for seed in range(1, 2000)}
    assert last == set(range(2, 32))


def test_a_fix_right_only_for_the_published_batch_sizes_fails_on_another_seed(x):
    assert compare(quietly(full_batches_only, x), case.reference(x), **TOLERANCE)["match"]  # 32 and 1: what the published epoch holds
    other = case.make_inputs(OmegaConf.merge(CFG, {"seed": 5}), "cpu")
    assert len(other.batches[-1][1]) > 1
    assert not compare(quietly(full_batches_only, other), case.reference(other), **TOLERANCE)["match"]
    assert compare(case.fixed(other), case.reference(other), **TOLERANCE)["match"]
