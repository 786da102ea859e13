r"""A regression head squeezes its (N, 1) logits against (N, 1) labels: MSELoss broadcasts to (N, N), silently.

Upstream: https://github.com/deepset-ai/FARM/issues/229 (a DistilBERT `RegressionHead([768, 1])` trained
    with FARM's doc_regression example, batch 32; labels from 0 to 16) and the fix the maintainers merged
    the next day, https://github.com/deepset-ai/FARM/pull/230 ("Fix shape of logits in regression head",
    commit 58a354f, released in FARM 0.4.1; the reporter: "Yes the error is gone"): `RegressionHead.logits_to_loss`
    in farm/modeling/prediction_head.py called `self.loss_fct(logits.squeeze(), label_ids.float())`, with
    `loss_fct = MSELoss(reduction="none")`, logits (N, 1) and labels (N, 1) (the processor writes each
    regression label as `[float(label_raw)]`). The squeeze came with the head in FARM 0.2.1 and the labels
    were (N, 1) from then on, so every release from 0.2.1 to 0.4.0 trained its regression heads on the
    (N, N) loss (read in the tags' source). The other way round, predictions (B, 1) and targets (B,), with
    merged fixes: https://github.com/sktime/sktime/issues/10931 and https://github.com/sktime/sktime/pull/10932
    (BaseDeepRegressorTorch's `_run_epoch`, four time-series regressors ending in Linear(..., 1); fixed with
    a guarded `squeeze(-1)` of the predictions, and a bare `squeeze()` in `_predict` changed to
    `squeeze(-1)` because it "collapsed (1, 1) to a 0-d array"), and https://github.com/jsboige/CoursIA/pull/926
    (nn.MSELoss in four time-series training scripts, batch 64, on a GPU; fixed with `y_batch.view_as(pred)`).

Fidelity: faithful in the code path and the sizes: FARM 0.4.0's head and trainer, re-typed (the package
    pins transformers 2.x and the torch of its time; three lines matter): DistilBERT's pooler as FARM adds
    it (`SequenceSummary`: the first token through Linear(768, 768) and tanh, weights drawn from N(0, 0.02)
    as `_init_weights` does, bias 0), the head's `FeedForwardBlock([768, 1])` (one nn.Linear(768, 1),
    default init), `MSELoss(reduction="none")` on the squeezed logits and the (N, 1) labels,
    `Trainer.adjust_loss`'s `loss.mean()` and the backward, batch 32 (the thread's torch.Size([32, 1])),
    the labels standardised as RegressionProcessor does (StandardScaler on the training labels).
    Synthetic: DistilBERT's first-token hidden states (seeded normal draws; the transformer is not run),
    the labels (a seeded linear function of 16 of those features plus noise, clipped to the thread's 0 to
    16, then standardised), 33 samples, so that the epoch ends on a batch of 1 (FARM's DataLoader keeps
    a short last batch: drop_last is False), no dropout (AdaptiveModel's embeds_dropout_prob=0.1 draws at
    random), and no optimizer step: each batch's gradients are taken at the starting weights, which is what
    a step would use. The outputs, per batch: the per-sample losses (one per sample, as
    AdaptiveModel.logits_to_loss documents), the loss, and every parameter's gradient.

Symptom on CUDA: the same warning and the same wrong numbers: the shapes are checked in Python
    (torch.nn.functional.mse_loss) before any kernel runs. A thread shows it on a GPU, the other way round
    (CoursIA #926, "detected during walk-forward Mamba launch on GPU 2", quoted wrapped and cut as there):
        UserWarning: Using a target size (torch.Size([64])) that is different to the
        input size (torch.Size([64, 1])). This will likely lead to incorrect results
        due to broadcasting.
    FARM #229 does not say its device. Not run on CUDA here.

Symptom on CPU: nothing raises. FARM #229 (device not given; the thread bolds the two sizes):
        /home/ec2-user/anaconda3/envs/python3/lib/python3.6/site-packages/torch/nn/modules/loss.py:431: UserWarning: Using a target size (torch.Size([32, 1])) that is different to the input size (torch.Size([32])). This will likely lead to incorrect results due to broadcasting. Please ensure they have the same size.
    torch 2.13.0 (run here) prints the same text, attributed to the same line (`return F.mse_loss(...)` in
    MSELoss.forward, now loss.py:630), once per distinct message (Python's default filter), then
    `Using a target size (torch.Size([1, 1])) that is different to the input size (torch.Size([]))` for the
    last batch, which is right: (1, 1) against a 0-d tensor is that one pair, so a check on one sample
    looks fine. On the batch of 32 the loss is only 3% off (1.003 for 1.038: at the first step the
    predictions are near 0, and the mean over all pairs is close to the mean over matching ones); the
    per-sample losses are 27% off and the gradients of the head's weight and of the pooler 94 to 97%
    (relative error); the head's bias gradient is right (the sum over j of p_j - mean(y) is the sum of
    p_j - y_j). Compiled (inductor, torch 2.13.0): the same warning and the same wrong numbers. Other
    releases not run: the threads place the change at torch 1.0, whose losses began to broadcast
    (https://github.com/pytorch/pytorch/pull/12996; https://github.com/pytorch/pytorch/issues/16045: 0.4
    refused [n, 1] against [n]); L1's warning came with https://github.com/pytorch/pytorch/pull/18565 (1.1).

Cause: `logits.squeeze()` makes the predictions (N,) while the labels stay (N, 1), and elementwise
    broadcasting pairs every label with every prediction: the per-sample loss is (N, N) and its mean is
    the mean over all N^2 pairs. Its gradient for prediction j is 2 (p_j - mean(y)) / N instead of
    2 (p_j - y_j) / N: every prediction is pulled to the batch's mean label, so the model learns the mean
    (tests/test_loss_broadcast.py trains the head both ways).

Fix: FARM's (#230): no squeeze; the logits (N, 1) meet the labels (N, 1) and MSELoss(reduction="none")
    returns one loss per sample. Equivalent: both sides flattened to (N,) (`reshape(-1)`, `squeeze(-1)`:
    sktime's), or `target.view_as(pred)` (CoursIA's). The reference spells the forward and the backward out
    by hand in float64 (tanh, the two affine maps, the squared error and its chain rule), so the check does
    not compare autograd with itself. It costs nothing: 0.98-1.03x of the same epoch with the squared error
    written out, eager and compiled (budget 1.10); the control, each sample through the model alone so that
    no shapes ever differ, is 7.8-9.2x (6.4-6.6x compiled). A per-sample loop over the loss alone (1.37-1.49x
    eager) is no control: inductor fuses it (1.08x, missed); nor is the (N, N) matrix's diagonal (8% over
    the fix).
    Wrong ones, each rejected, all three generic attempts (not from the cited threads): a bare `.squeeze()` on
    the labels too, which matches the squeezed logits
    and is right for 32, but squeezes the last batch's logits and labels to 0-d tensors: its loss and
    gradients are still right, its per-sample loss has no sample dimension, and the trainer's `len()` of it
    raises (TypeError: len() of a 0-d tensor; compiled, IndexError: tuple index out of range);
    `reduction="sum"`, as if the mean were the problem: still (32, 32), summed, 990x the intended loss on
    the batch of 32, a 0-d "per-sample" loss whose `len()` raises on the first batch; and silencing the
    warning with `warnings.filterwarnings`, which leaves every number as wrong as the buggy code's.
"""

import math
import random
import warnings
from typing import NamedTuple

import torch
from torch import nn

from harness.cases import WrongResult
from harness.measure.compare import training_outputs
from harness.triage import Sign, TriageSigns

WARNING = r"Using a target size .* that is different to the input size"

symptoms = {"cpu": WrongResult(warning=WARNING), "cuda": WrongResult(warning=WARNING)}

# The loss warning whose shapes cross a batch of several with itself: (N,) against (N, 1) either way round, or a singleton
# channel on one side only; not the same warning where nothing is crossed (a batch of one), nor binary cross entropy's refusal.
triage_signs = TriageSigns(
    family="a loss warned that its input and target shapes differ and broadcast",
    cause="(N,) targets against (N, 1) predictions: broadcasting crosses the batch with itself, (N, N)",
    confirm="the two sizes in the warning are [N] and [N, 1] (or the reverse) with the same N > 1",
    also="any target shape that broadcasts against the input: a scalar target, a batch of one, quantiles against one value",
    signs=(
        Sign(
            "failure",
            r"Using a target size \(torch\.Size\(\[((?!1\])\w+)\]\)\) that is different to the input size \(torch\.Size\(\[\1, 1\]\)\)",
            0.9,
            "a loss got (N,) targets for (N, 1) predictions: broadcasting pairs every prediction with every target, (N, N)",
        ),
        Sign(
            "failure",
            r"Using a target size \(torch\.Size\(\[((?!1,)\w+), 1\]\)\) that is different to the input size \(torch\.Size\(\[\1\]\)\)",
            0.9,
            "a loss got (N, 1) targets for (N,) predictions (squeezed logits): broadcasting pairs every prediction with every target, (N, N)",
        ),
        Sign(
            "failure",
            r"Using a target size \(torch\.Size\(\[((?!1,)\d+), ([\d, ]+)\]\)\) that is different to the input size \(torch\.Size\(\[\1, 1, \2\]\)\)|Using a target size \(torch\.Size\(\[((?!1,)\d+), 1, ([\d, ]+)\]\)\) that is different to the input size \(torch\.Size\(\[\3, \4\]\)\)",
            0.8,
            "a singleton channel on one side only, right after a batch of several: broadcasting pairs every sample of the batch with every other",
        ),
        Sign(
            "failure",
            r"[Uu]sing a target size \(.*\) that is different to (?:the )?input size",
            0.3,
            "a loss warned that its input and target shapes differ and broadcast; alone it does not say whether the batch is crossed with itself (a batch of one crosses nothing)",
            family=True,
        ),
        Sign(
            "context",
            r"\b(?:mse_loss|l1_loss|smooth_l1_loss|huber_loss)\(|MSELoss|L1Loss|SmoothL1Loss|HuberLoss",
            0.1,
            "a regression loss (MSE, L1, smooth L1, Huber)",
        ),
        Sign("context", r"[Rr]egression|y_hat|y_pred|pred(?:iction)?s?\.shape", 0.1, "a regression model's predictions"),
        Sign(
            "against",
            r"Using a target size \(torch\.Size\(\[(?:1(?:, 1)*)?\]\)\) that is different to the input size \(torch\.Size\(\[1(?:, 1)*\]\)\)",
            0,
            "a batch of one (or a scalar): broadcasting crosses nothing, the loss is right",
        ),
        Sign(
            "veto",
            r"that is different to the input size \(torch\.Size\(\[[\d, ]*\]\)\) is deprecated",
            0,
            "the words `is deprecated`: binary cross entropy's refusal (a ValueError now, a UserWarning in older releases), or a loss of torch before 1.0 matching elements by count; neither broadcasts",
        ),
    ),
)

compiled_unit = "the training step as a user compiles it: the pooler and the head's forward, the head's logits_to_loss, the trainer's mean and the backward"


class Inputs(NamedTuple):
    model: nn.ModuleDict  # pooler: Linear(768, 768) then tanh (DistilBERT's, as FARM adds it); head: Linear(768, 1)
    batches: tuple  # ((first-token states (n, 768), standardised labels (n, 1)), ...): an epoch's batches, the last short
    loss_fct: nn.Module  # the head's MSELoss(reduction="none")


def epoch_samples(cfg) -> int:
    """`sizes.samples` for the seed `last_batch_of_one_seed` (the published one: full batches, then a last batch of 1);
    for any other seed, such as a grade's second inputs, the same full batches and a last one of 2 to batch - 1 samples
    drawn from the seed, where a squeeze that survives crosses its samples: a fix right only for the published epoch's
    two batch sizes fails there."""
    if cfg.seed == cfg.last_batch_of_one_seed:
        return cfg.sizes.samples
    full = cfg.sizes.samples // cfg.sizes.batch * cfg.sizes.batch
    return full + random.Random(cfg.seed).randint(2, cfg.sizes.batch - 1)


def make_inputs(cfg, device):
    sizes = cfg.sizes
    samples = epoch_samples(cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    pooler, head = nn.Linear(sizes.hidden, sizes.hidden), nn.Linear(sizes.hidden, 1)
    bound = 1 / math.sqrt(sizes.hidden)  # nn.Linear's default init, drawn from the case's generator
    with torch.no_grad():
        pooler.weight.copy_(0.02 * torch.randn(sizes.hidden, sizes.hidden, generator=generator))  # FARM: _init_weights
        pooler.bias.zero_()
        head.weight.copy_(torch.empty(1, sizes.hidden).uniform_(-bound, bound, generator=generator))
        head.bias.copy_(torch.empty(1).uniform_(-bound, bound, generator=generator))
    states = torch.randn(samples, sizes.hidden, generator=generator)
    signal = states[:, : cfg.label_features].sum(1) / math.sqrt(cfg.label_features)
    raw = (8 + 3 * signal + torch.randn(samples, generator=generator)).clamp(0, 16)  # the thread's labels: 0 to 16
    labels = ((raw - raw.mean()) / raw.std(correction=0)).unsqueeze(1)  # StandardScaler; `[float(label)]`: (n, 1)
    batches = tuple(zip(states.split(sizes.batch), labels.split(sizes.batch)))
    return Inputs(
        model=nn.ModuleDict({"pooler": pooler, "head": head}).to(device),
        batches=tuple((s.to(device), y.to(device)) for s, y in batches),
        loss_fct=nn.MSELoss(reduction="none"),
    )


def train_epoch(x, logits_to_loss):
    """FARM's Trainer over the epoch: forward, the head's per-sample loss, `loss.mean()`, backward; what each batch
    leaves, at the starting weights (no optimizer step)."""
    out = []
    for states, labels in x.batches:
        x.model.zero_grad(set_to_none=True)
        logits = x.model.head(torch.tanh(x.model.pooler(states)))  # (n, 1)
        per_sample_loss = logits_to_loss(x, logits, labels)
        loss = per_sample_loss.mean()  # Trainer.adjust_loss
        loss.backward()
        out.append({"per_sample_loss": per_sample(per_sample_loss.detach()), **training_outputs(x.model, loss)})
    return tuple(out)


def per_sample(loss):
    """One loss per sample, (n,), as AdaptiveModel.logits_to_loss documents ("the per sample loss (len: batch_size)"):
    the first dimension is the sample's, the mean over the rest of its row."""
    return loss.reshape(len(loss), -1).mean(1)


def buggy(x):
    return train_epoch(x, farm_logits_to_loss)


def farm_logits_to_loss(x, logits, labels):
    """RegressionHead.logits_to_loss of FARM 0.2.1 to 0.4.0."""
    # Squeeze the logits to obtain a coherent output size
    return x.loss_fct(logits.squeeze(), labels.float())


def fixed(x):
    return train_epoch(x, fixed_logits_to_loss)


def fixed_logits_to_loss(x, logits, labels):
    """FARM 0.4.1 (#230): no squeeze, (n, 1) against (n, 1)."""
    return x.loss_fct(logits, labels.float())


def reference(x):
    """Each batch's forward and backward by hand, in float64, returned in float32."""
    model = {name: p.detach().double() for name, p in x.model.named_parameters()}
    return tuple(by_hand(model, states.double(), labels.double().reshape(-1)) for states, labels in x.batches)


def by_hand(p, states, labels):
    """The squared error of each sample, its mean, and the chain rule through head, tanh and pooler."""
    hidden = torch.tanh(states @ p["pooler.weight"].T + p["pooler.bias"])  # (n, 768)
    error = hidden @ p["head.weight"][0] + p["head.bias"][0] - labels  # (n,)
    d_prediction = 2 * error / len(error)
    d_before_tanh = d_prediction[:, None] * p["head.weight"] * (1 - hidden**2)  # (n, 768)
    grad = {
        "head.bias": d_prediction.sum().reshape(1),
        "head.weight": (d_prediction @ hidden).reshape(1, -1),
        "pooler.bias": d_before_tanh.sum(0),
        "pooler.weight": d_before_tanh.T @ states,
    }
    return {"per_sample_loss": (error**2).float(), "loss": (error**2).mean().float(), "grad": {k: v.float() for k, v in grad.items()}}


def speed_baseline(x):
    """The same epoch with the per-sample squared error written out on matching shapes: what the intended loss costs."""
    return train_epoch(x, lambda x, logits, labels: (logits - labels.float()) ** 2)


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def squeeze_the_labels_too(x):
    """Match the squeezed logits by squeezing the labels (a generic attempt, not from the cited threads): right for
    32, 0-d tensors for the last batch of 1."""
    return train_epoch(x, lambda x, logits, labels: x.loss_fct(logits.squeeze(), labels.float().squeeze()))


def reduction_sum(x):
    """MSELoss(reduction="sum"), as if the mean were the problem (a generic attempt, not from the cited threads): the
    (N, N) pairs summed into one number."""
    return train_epoch(x, lambda x, logits, labels: nn.MSELoss(reduction="sum")(logits.squeeze(), labels.float()))


def silence_the_warning(x):
    """`warnings.filterwarnings("ignore", ...)` for the message (a generic attempt, not from the cited threads): no
    warning, the same (N, N) loss."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using a target size")
        return train_epoch(x, farm_logits_to_loss)


bad_fixes = {"squeeze_the_labels_too": squeeze_the_labels_too, "reduction_sum": reduction_sum, "silence_the_warning": silence_the_warning}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def one_sample_at_a_time(x):
    """Never let the shapes differ: each sample through the pooler, the head and the loss alone, as a batch of 1."""
    out = []
    for states, labels in x.batches:
        x.model.zero_grad(set_to_none=True)
        logits = [x.model.head(torch.tanh(x.model.pooler(s[None]))) for s in states]  # each (1, 1)
        per_sample_loss = torch.cat([x.loss_fct(p, y[None].float()) for p, y in zip(logits, labels)])
        loss = per_sample_loss.mean()
        loss.backward()
        out.append({"per_sample_loss": per_sample(per_sample_loss.detach()), **training_outputs(x.model, loss)})
    return tuple(out)


slow_fixes = {"one_sample_at_a_time": one_sample_at_a_time}
