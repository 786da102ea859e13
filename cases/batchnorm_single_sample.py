"""scVI's training epoch ends on a minibatch of one cell, and its BatchNorm1d refuses to train on it.

Upstream: https://github.com/scverse/scvi-tools/issues/3035 (scvi-tools 1.2.0, Python 3.12, CPU or unstated; the
    torch version is not stated, its functional.py raises at line 2478): `SCVI.setup_anndata`,
    `SCVI(adata)`, `model.train()` on 143 simulated cells x 1000 genes; model.train() keeps ceil(0.9 * 143) = 129
    training cells, 129 % 128 == 1, and the epoch's last minibatch holds one cell. The first report,
    https://github.com/scverse/scvi-tools/issues/426 (scVI 0.x, 2019): "My dataset has 57345 cells and it so happens
    that 57345%128 == 1". The project's fixes, in order: commit c0fa60d ("Fixes #426 * Skip minibatches of size
    < 3", the trainer's loop); https://github.com/scverse/scvi-tools/pull/915 (scvi-tools 0.10, 2021: the training
    loaders get `drop_last=3`, "do not remove drop_last=3, skips over small minibatches"); #1975 (scvi-tools 1.0.0,
    2023: `drop_last` as an int removed, the loaders built with drop_last=False, so the failure came back: #2214,
    #2314); https://github.com/scverse/scvi-tools/issues/2448 (asks for `drop_last=True` on the training loader)
    answered by https://github.com/scverse/scvi-tools/pull/2929 (scvi-tools 1.2.0: `model.train(...,
    datasplitter_kwargs={"drop_last": True})`, default still False, which is why #3035 still failed on 1.2.0); and
    https://github.com/scverse/scvi-tools/pull/3036 (scvi-tools 1.2.2, closing #3035: when train_size is left
    unset, a last minibatch of 1-2 cells is moved to the validation set).

Fidelity: faithful in the module, the sizes, the optimiser and the loader: scvi-tools 1.2.0's `VAE` as `SCVI`
    builds it by default, written out here (scvi-tools is not installed): the z encoder Linear(1000, 128),
    BatchNorm1d(128, momentum=0.01, eps=0.001), ReLU, Dropout(0.1), then mean and variance heads (exp + 1e-4),
    `Normal(...).rsample()`; the decoder Linear(10, 128), BatchNorm1d, ReLU, softmax scale, zero-inflation logits; a
    gene-wise dispersion; the observed library size; scvi's `log_zinb_positive` line for line; the unused library
    encoder and `px_r_decoder` built as scVI builds them. The TrainingPlan's Adam (lr 1e-3, eps 0.01, weight decay
    1e-6), the loss of epoch 0 (`kl_weight` 0: the KL warm-up over 400 epochs starts at 0); a step as Lightning's
    automatic optimisation takes it (the loss, zeroed gradients, backward, the optimizer's step). The loader is
    scvi's AnnDataLoader: `DataLoader(dataset, sampler=BatchSampler(..., batch_size=128, drop_last=False),
    batch_size=None)`, one `__getitem__` per minibatch; the split is the DataSplitter's
    (`np.random.RandomState(0).permutation`, validation first). One call is one
    epoch on fresh copies of the module and the optimiser, so every call fails at the same step, as the thread's
    first epoch does: one step per call would need the call that fails to be told apart from the calls before it,
    and the failure is a property of the epoch (its length modulo the batch size). Synthetic: the counts (#3035's
    Poisson counts of Gamma(2, 1) rates, drawn by a seeded numpy generator), the initial weights (seeded), the
    epoch's shuffled order (drawn once in make_inputs and handed to the BatchSampler as a list, where scvi passes a
    RandomSampler that draws it), and a `torch.manual_seed(seed + step)` before each step, so that the step's
    dropout masks and z noise are the same in the DataLoader loop and in the reference's loop (a DataLoader's
    iterator draws its base seed from the same global generator). The dataset returns SCVI's registry, X with the
    batch and labels columns (zeros without covariates, which the module ignores), from tensors on the device.

Symptom on CUDA: not shown by the scvi-tools threads. From the source: the check is Python,
    `_verify_batch_size(input.size())` in torch.nn.functional.batch_norm, run before `torch.batch_norm` dispatches
    to any kernel, so on CUDA it raises the CPU's text at the layer, synchronously, with no device-side assert:
        ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 128])
    Not run on a GPU here. https://github.com/nv-tlabs/GSCNN/issues/40 shows the same text on GPUs (a batch split by
    DataParallel: "ValueError: Caught ValueError in replica 0 on device 0.", the title's `torch.Size([1, 256, 1, 1])`).

Symptom on CPU: raised by the z encoder's first BatchNorm1d at the epoch's last step. #3035's traceback ends
        File ".../site-packages/torch/nn/functional.py", line 2478, in _verify_batch_size
          raise ValueError(f"Expected more than 1 value per channel when training, got input size {si
    (cut there in the stored thread), and https://github.com/scverse/scvi-tools/issues/2314 (scvi-tools 1.0.4)
    shows the line that follows:
        ValueError: Expected more than 1 value per channel when training, got input size torch.Size([1, 128])
    [1, 128]: one cell, the encoder's 128 hidden units. torch 2.13.0 prints that line (run here). Older releases,
    from the threads, not run: the check arrived in torch 0.3 (pytorch/pytorch#2961, after #1381: the statistics of
    one sample turned everything NaN) and printed the size as a list, `got input size [1, 128]`
    (pytorch/pytorch#4534); torch 1.0 raised it from batch_norm itself with `torch.Size([1, 192, 1, 1])`
    (huaifeng1993/DFANet#9, an environment named cxs_torch1.0), later releases from `_verify_batch_size`
    (kbressem/faimed3d#68).

Cause: in training mode BatchNorm normalises each channel by the minibatch's own mean and variance, and a
    minibatch of one cell has one value per channel: its variance is 0 and its normalised value 0, so torch refuses
    rather than train on it. The training set's size is 1 modulo the batch size, and a loader that keeps the last
    incomplete minibatch (drop_last=False) ends every epoch on one cell.

Fix: drop the incomplete last minibatch of the training loader: `drop_last=True` (scvi-tools 1.2.0's
    datasplitter_kwargs={"drop_last": True}; 0.10-0.20's `drop_last=3` and #426's "skip minibatches of size < 3"
    drop the same minibatch here). The epoch trains on the full minibatches only, each normalised with its own
    statistics, and the lone cell is trained on after a later epoch's shuffle. The reference walks the epoch's order
    by hand, without a DataLoader, slicing the counts for each full minibatch, and trains a copy of the module
    there; `correct` compares the last step's loss and gradients, every parameter, BatchNorm's running statistics
    and the latent representation of all 143 cells in eval mode (`get_latent_representation`). Also correct (the
    alternative in tests/fixes/alternatives/): #426's own fix, the loop passing over minibatches of fewer than 3
    cells. Not so a loop that catches the ValueError and goes on: BatchNorm's forward counts the batch before
    F.batch_norm checks it, so the first layer's num_batches_tracked ends one ahead
    (tests/test_batchnorm_single_sample.py).
    scvi-tools 1.2.2's own fix for #3035 (PR #3036: with train_size left unset, a last minibatch of 1-2 cells moves from the training set to the validation set) is rejected graded as a submission (tests/fixes/upstream/batchnorm_single_sample.py): DataSplitter cuts its seeded permutation again, so the cell that moves is the training set's first, never trained on in any epoch, not the epoch's last; another split and another training run: the parameters 0.76x the epoch's update from the reference's (0.80% of their norm), the latent representation 17.5% of its norm apart, the running statistics 0.03%. Wrong ones, measured on the yaml's inputs against the reference (torch 2.13.0, CPU):
    `model.eval()` for the one-cell minibatch (MCG-NKU/SCNet#8's advice for a batch of one): the step runs, the cell
    normalised by running statistics that one step (momentum 0.01) has barely moved from (0, 1), and Adam moves every
    parameter as far for it as for the 128 before: the parameters end 0.73x the epoch's own update away from the
    reference's (0.77% of their norm), the latent representation 108% of its norm away, the running statistics equal.
    BatchNorm1d(track_running_stats=False) (a generic attempt, not from the threads: normalise by the batch in eval
    too): it still raises the same ValueError on the one-cell minibatch, since the check reads `training`, not the
    running statistics (and it would raise in eval too: pytorch/pytorch#156051). A batch size chosen so that the
    remainder is not 1 (#2314's maintainer: "passing in a `batch_size` to the `train` method that is different than
    the default one"; calico/solo#37's loop, `while num_cells % batch_size == 1: batch_size = round(1.25 *
    batch_size)`, gives 160, one minibatch of all 129 cells): another training run, the parameters 0.78x the epoch's
    update apart, the latent representation 17% apart, the running statistics 0.06%. Duplicating the lone cell into
    a minibatch of two (yassouali/pytorch-segmentation#8: "test if the batch == 1 in trainer and duplicate the
    input"): two equal values per channel have variance 0, BatchNorm outputs its offsets and the step trains on a
    degenerate minibatch; parameters 0.80x the epoch's update apart, latent 9.4%, running statistics 0.9% (and
    num_batches_tracked 2, not 1).
    Its cost: the fix changes which minibatches the loader yields, and the steps trained on them are the same work
    as in the code that worked, so the speed phase times the loader's epoch (`speed_candidate`) against the same
    loader over a training set that the batch size divides: 0.97-1.00x (0.2-0.4 ms a call); whole epochs, the fix
    against that baseline, 1.00-1.02x (17 ms a call unloaded); torch 2.13.0 on this loaded 2-core CPU. Correct but
    slow, the control: the loader as PyTorch's tutorials write it, `DataLoader(dataset, batch_size=128,
    drop_last=True)` over single cells, which fetches and collates a minibatch one cell at a time: 4.1-5.1x the
    loader's time (scvi's AnnDataLoader fetches a minibatch in one call because "retrieving single observations and
    then collating is inefficient").

Compiled: as scvi-tools compiles it (>= 1.2.2: `model.train(plan_kwargs={"compile": True})`, whose TrainingPlan
    sets `torch._dynamo.config.suppress_errors = True` and calls `torch.compile(module, dynamic=False)`; fresh_model
    leaves `dynamic` at its default, which changes nothing here: a one-cell shape is specialised either way), each
    call's copy compiled where it is made (compiles_itself). Dynamo runs the layer on fake tensors while tracing the
    one-cell step (a new shape, so a recompile), the check raises there, dynamo logs that it will not convert the
    frame, runs it eagerly, and eager raises the ValueError above, text unchanged (torch 2.13.0, CPU). Without
    suppress_errors (a plain `torch.compile(module)`), dynamo raises its own error with the ValueError inside:
        torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call
          Explanation: Dynamo failed to run FX node with fake tensors: call_function <function batch_norm at 0x...>(...): got ValueError('Expected more than 1 value per channel when training, got input size torch.Size([1, 128])')
"""

import copy
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal, kl_divergence
from torch.utils.data import BatchSampler, DataLoader, Dataset

from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.measure.compare import training_outputs
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom("ValueError", r"Expected more than 1 value per channel when training, got input size torch\.Size\(\[1, 128\]\)"),
    "cuda": Symptom("ValueError", r"Expected more than 1 value per channel when training, got input size torch\.Size\(\[1, 128\]\)"),
}

# F.batch_norm's check on a BatchNorm layer in training mode that sees one value per channel (a minibatch of one sample,
# or of one sample of 1x1 features): the same text on every device. Not instance norm's check (old releases raised the
# same words from F.instance_norm; newer ones say "spatial element"), nor a BatchNorm of the wrong width.
triage_signs = TriageSigns(
    family="BatchNorm in training mode given one value per channel",
    cause="a minibatch of one sample (the epoch's last, incomplete batch) reaching a BatchNorm layer in training mode",
    confirm="the failing batch has one sample (input size (1, C) or (1, C, 1, 1)); drop_last=True or eval mode makes it pass",
    also="a feature map pooled to 1x1 with batch size 1 at inference without model.eval()",
    signs=(
        Sign(
            "failure",
            r"Expected more than 1 value per channel",
            0.9,
            "F.batch_norm's check: a BatchNorm layer in training mode saw one value per channel, a minibatch of one sample",
            family=True,
        ),
        Sign(
            "failure",
            r"\bin _verify_batch_size\b|raise ValueError\(f?\"Expected more than 1 value per channel",
            0.5,
            "the frame of F.batch_norm's check itself, where the log was cut before its message",
            family=True,
        ),
        Sign(
            "context",
            r"in _verify_batch_size\b|in batch_norm\b|batchnorm\.py|BatchNorm[123]d",
            0.3,
            "raised in F.batch_norm, called by a BatchNorm layer",
        ),
        Sign(
            "context",
            r"got input size (?:torch\.Size\()?\[1, \d+(?:, 1)*\]",
            0.3,
            "the input is one sample: (1, C), or (1, C, 1, 1) after global pooling",
        ),
        Sign(
            "support",
            r"drop_last|last (?:mini)?batch|Last batch will have a small size",
            0.2,
            "the epoch's last, incomplete minibatch in play (scvi-tools >= 1.2 warns of it)",
        ),
        Sign(
            "veto",
            r"in instance_norm\b|instancenorm\.py|F\.instance_norm\(",
            0,
            "instance normalisation's check (one spatial element per instance), which old releases worded as batch norm's: not a minibatch of one",
        ),
    ),
)

compiled_unit = (
    "the scVI module, `torch.compile(module)` as a user compiles a model; the DataLoader, the backward and the "
    "optimizer step run around it as they do around a compiled model (scvi-tools compiles nothing itself). Not the "
    "epoch whole: it builds and iterates a DataLoader in Python, and each call trains a fresh copy with a fresh Adam"
)
compiles_itself = True  # fresh_model compiles the copy of the module as cfg says (Inputs.compile)


# -- scVI's module: scvi-tools 1.2.0's VAE as SCVI builds it by default --------------------------------------------


def fc_layers(n_in, n_out, dropout_rate):
    """scvi.nn.FCLayers with one layer: Linear, BatchNorm1d(momentum=0.01, eps=0.001), ReLU, Dropout."""
    layers = [nn.Linear(n_in, n_out), nn.BatchNorm1d(n_out, momentum=0.01, eps=0.001), nn.ReLU()]
    return nn.Sequential(*layers, *([nn.Dropout(p=dropout_rate)] if dropout_rate > 0 else []))


class Encoder(nn.Module):
    """scvi.nn.Encoder with a normal latent distribution: the mean and the variance of q(z | x)."""

    def __init__(self, n_input, n_output, n_hidden, dropout_rate, var_eps=1e-4):
        super().__init__()
        self.encoder = fc_layers(n_input, n_hidden, dropout_rate)
        self.mean_encoder = nn.Linear(n_hidden, n_output)
        self.var_encoder = nn.Linear(n_hidden, n_output)
        self.var_eps = var_eps

    def forward(self, x):
        q = self.encoder(x)
        return self.mean_encoder(q), torch.exp(self.var_encoder(q)) + self.var_eps


class DecoderSCVI(nn.Module):
    """scvi.nn.DecoderSCVI: the decoded cell's expression shares (softmax) and zero-inflation logits."""

    def __init__(self, n_input, n_output, n_hidden):
        super().__init__()
        self.px_decoder = fc_layers(n_input, n_hidden, dropout_rate=0)
        self.px_scale_decoder = nn.Sequential(nn.Linear(n_hidden, n_output), nn.Softmax(dim=-1))
        self.px_r_decoder = nn.Linear(n_hidden, n_output)  # built by scVI, used only with dispersion "gene-cell"
        self.px_dropout_decoder = nn.Linear(n_hidden, n_output)

    def forward(self, z):
        px = self.px_decoder(z)
        return self.px_scale_decoder(px), self.px_dropout_decoder(px)


def log_zinb_positive(x, mu, theta, pi, eps=1e-8):
    """scvi.distributions' zero-inflated negative binomial log-likelihood, line for line."""
    theta = theta.view(1, theta.size(0))
    softplus_pi = F.softplus(-pi)
    log_theta_eps = torch.log(theta + eps)
    log_theta_mu_eps = torch.log(theta + mu + eps)
    pi_theta_log = -pi + theta * (log_theta_eps - log_theta_mu_eps)
    case_zero = F.softplus(pi_theta_log) - softplus_pi
    mul_case_zero = torch.mul((x < eps).type(torch.float32), case_zero)
    case_non_zero = (
        -softplus_pi
        + pi_theta_log
        + x * (torch.log(mu + eps) - log_theta_mu_eps)
        + torch.lgamma(x + theta)
        - torch.lgamma(theta)
        - torch.lgamma(x + 1)
    )
    mul_case_non_zero = torch.mul((x > eps).type(torch.float32), case_non_zero)
    return mul_case_zero + mul_case_non_zero


class VAE(nn.Module):
    """scvi.module.VAE with SCVI's defaults: ZINB likelihood, gene-wise dispersion, the observed library size,
    batch norm in encoder and decoder. `forward` is the training step's loss (inference, generative, loss)."""

    def __init__(self, n_input, n_hidden, n_latent, dropout_rate):
        super().__init__()
        self.px_r = nn.Parameter(torch.randn(n_input))
        self.z_encoder = Encoder(n_input, n_latent, n_hidden, dropout_rate)
        self.l_encoder = Encoder(n_input, 1, n_hidden, dropout_rate)  # built by scVI, unused with the observed library size
        self.decoder = DecoderSCVI(n_latent, n_input, n_hidden)

    def forward(self, x, kl_weight):
        library = torch.log(x.sum(1)).unsqueeze(1)
        qz_m, qz_v = self.z_encoder(torch.log1p(x))  # (cells, n_latent) each
        qz = Normal(qz_m, qz_v.sqrt())
        z = qz.rsample()
        px_scale, px_dropout = self.decoder(z)
        px_rate = torch.exp(library) * px_scale
        reconst_loss = -log_zinb_positive(x, px_rate, torch.exp(self.px_r), px_dropout).sum(-1)
        kl_divergence_z = kl_divergence(qz, Normal(torch.zeros_like(z), torch.ones_like(z))).sum(dim=-1)
        return torch.mean(reconst_loss + kl_weight * kl_divergence_z)

    @torch.no_grad()
    def latent(self, x):
        """What `SCVI.get_latent_representation()` returns: the mean of q(z | x), in eval mode."""
        return self.z_encoder(torch.log1p(x))[0]


class CellsDataset(Dataset):
    """scvi's AnnTorchDataset over the training cells: SCVI's registry (X, batch, labels) at the given positions, one
    `__getitem__` per minibatch with a list of positions under scvi's loader."""

    def __init__(self, x):
        self.x = x

    def __len__(self):
        return len(self.x.train_idx)

    def __getitem__(self, positions):
        cells = self.x.train_idx[positions]
        return {"X": self.x.counts[cells], "batch": self.x.obs[cells, :1], "labels": self.x.obs[cells, 1:]}


class Inputs(NamedTuple):
    model: VAE  # as initialised; every call trains a fresh copy
    counts: torch.Tensor  # (cells, genes) float32 counts: the AnnData's X
    obs: torch.Tensor  # (cells, 2) int64: setup_anndata's _scvi_batch and _scvi_labels columns, 0 without covariates
    train_idx: torch.Tensor  # (n_train,) long: the DataSplitter's training cells
    epoch_order: list  # positions 0..n_train-1 in the order this epoch's RandomSampler visits them
    batch_size: int
    lr: float
    weight_decay: float
    eps: float
    kl_weight: float
    seed: int
    compile: dict


def make_inputs(cfg, device):
    sizes = cfg.sizes
    rng = np.random.default_rng(cfg.seed)  # #3035's simulation: Poisson counts with Gamma(2, 1) rates
    counts = torch.from_numpy(rng.poisson(rng.gamma(2.0, 1.0, size=(sizes.cells, sizes.genes))).astype(np.float32))
    n_train = int(np.ceil(cfg.train_size * sizes.cells))  # scvi's validate_data_split
    permutation = np.random.RandomState(seed=cfg.split_seed).permutation(sizes.cells)  # DataSplitter, settings.seed
    n_val = sizes.cells - n_train
    train_idx = torch.from_numpy(permutation[n_val : n_val + n_train].copy())
    torch.manual_seed(cfg.seed)  # nn.Linear's default init and px_r draw from the global generator
    model = VAE(sizes.genes, sizes.hidden, sizes.latent, cfg.dropout_rate)
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    return Inputs(
        model=model.to(device),
        counts=counts.to(device),
        obs=torch.zeros(sizes.cells, 2, dtype=torch.int64, device=device),
        train_idx=train_idx.to(device),
        epoch_order=order,
        batch_size=sizes.batch,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        eps=cfg.adam_eps,
        kl_weight=cfg.kl_weight,
        seed=cfg.seed,
        compile={"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")},
    )


def fresh_model(x):
    """A copy of the module and scvi's TrainingPlan optimizer for it, compiled where the run compiles, as the
    TrainingPlan compiles it (scvi-tools >= 1.2.2, `plan_kwargs={"compile": True}`)."""
    model = copy.deepcopy(x.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=x.lr, eps=x.eps, weight_decay=x.weight_decay)
    if compile_axis.mode_of(x.compile) != "off":
        torch._dynamo.config.suppress_errors = True  # the TrainingPlan's own setting: a frame dynamo cannot trace runs eagerly
    return model, compile_axis.compiled(model, x.compile), optimizer


def train_loader(x, drop_last=False, order=None, batch_size=None):
    """scvi's AnnDataLoader for the training set: a BatchSampler over the epoch's order (or `order`), one fetch per
    minibatch (batch_size=None turns off the DataLoader's own batching)."""
    sampler = BatchSampler(x.epoch_order if order is None else order, batch_size=batch_size or x.batch_size, drop_last=drop_last)
    return DataLoader(CellsDataset(x), sampler=sampler, batch_size=None)


def training_step(step_model, optimizer, counts, x, step):
    """TrainingPlan.training_step under Lightning's automatic optimisation: the loss, zero_grad, backward, step."""
    torch.manual_seed(x.seed + step)  # the step's dropout masks and z's noise, the same whoever runs the step
    loss = step_model(counts, x.kl_weight)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def trained(model, loss, x):
    """What the epoch leaves: the last step's loss and gradients, the parameters, BatchNorm's running statistics,
    and the latent representation of every cell that the trained model gives in eval mode."""
    model.eval()
    return {
        **training_outputs(model, loss, parameters=True),
        "buffer": {name: buffer.detach().clone() for name, buffer in model.named_buffers()},
        "latent": model.latent(x.counts),
    }


def buggy(x):
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(train_loader(x)):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def fixed(x):
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(train_loader(x, drop_last=True)):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def reference(x):
    """The epoch by hand, without a DataLoader: the epoch's order cut into full minibatches, sliced from the counts."""
    model = copy.deepcopy(x.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=x.lr, eps=x.eps, weight_decay=x.weight_decay)
    model.train()
    order = torch.tensor(x.epoch_order, device=x.train_idx.device)
    for step in range(len(order) // x.batch_size):
        cells = x.train_idx[order[step * x.batch_size : (step + 1) * x.batch_size]]
        torch.manual_seed(x.seed + step)
        loss = model(x.counts[cells], x.kl_weight)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return trained(model, loss, x)


def speed_candidate(x):
    """The part of the fix that differs from the code that worked: the epoch's minibatches, from the loader that drops
    the incomplete last one. The steps trained on them are the same work in the fix and in the baseline."""
    return [batch["X"] for batch in train_loader(x, drop_last=True)]


def speed_baseline(x):
    """The same loader over a training set that the batch size divides: the code as it ran before the lone cell."""
    full = len(x.epoch_order) // x.batch_size * x.batch_size
    return [batch["X"] for batch in train_loader(x, order=x.epoch_order[:full])]


def speed_reference(x):
    """The epoch's full minibatches, sliced from the counts by hand."""
    order = torch.tensor(x.epoch_order, device=x.train_idx.device)
    return [x.counts[x.train_idx[order[start : start + x.batch_size]]] for start in range(0, len(order) - x.batch_size + 1, x.batch_size)]


def memory_baseline(x):
    """The whole epoch over a training set that the batch size divides (the memory phase weighs the fix's epoch)."""
    model, step_model, optimizer = fresh_model(x)
    model.train()
    full = len(x.epoch_order) // x.batch_size * x.batch_size
    for step, batch in enumerate(train_loader(x, order=x.epoch_order[:full])):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


# -- bad fixes ----------------------------------------------------------------------------------------------------


def eval_mode_for_the_lone_cell(x):
    """`model.eval()` for a batch of one, as advised in https://github.com/MCG-NKU/SCNet/issues/8, here for the epoch's
    last: BatchNorm normalises the cell with its running statistics, and the step trains on it."""
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(train_loader(x)):
        if batch["X"].shape[0] == 1:
            model.eval()
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def track_running_stats_off(x):
    """BatchNorm1d(track_running_stats=False) everywhere, as if built so: no running statistics, the batch's own in eval
    too. A generic attempt, not from the cited threads."""
    model, step_model, optimizer = fresh_model(x)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d):
            module.track_running_stats = False
            module.running_mean = module.running_var = module.num_batches_tracked = None
    model.train()
    for step, batch in enumerate(train_loader(x)):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def batch_size_without_remainder_one(x):
    """The maintainer's advice in https://github.com/scverse/scvi-tools/issues/2314, a batch size other than the
    default, by the rule of https://github.com/calico/solo/pull/37: while n % batch_size == 1, batch_size =
    round(1.25 * batch_size) (here 160: one minibatch of all 129 cells)."""
    model, step_model, optimizer = fresh_model(x)
    batch_size = x.batch_size
    while len(x.epoch_order) % batch_size == 1:
        batch_size = int(np.round(1.25 * batch_size))
    model.train()
    for step, batch in enumerate(train_loader(x, batch_size=batch_size)):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def duplicate_the_lone_cell(x):
    """A batch of one trained as two copies of the cell, as the maintainer of
    https://github.com/yassouali/pytorch-segmentation/issues/8 offers ("test if the batch == 1 in trainer and
    duplicate the input")."""
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(train_loader(x)):
        counts = batch["X"] if batch["X"].shape[0] > 1 else batch["X"].repeat(2, 1)
        loss = training_step(step_model, optimizer, counts, x, step)
    return trained(model, loss, x)


bad_fixes = {
    "eval_mode_for_the_lone_cell": eval_mode_for_the_lone_cell,
    "track_running_stats_off": track_running_stats_off,
    "batch_size_without_remainder_one": batch_size_without_remainder_one,
    "duplicate_the_lone_cell": duplicate_the_lone_cell,
}


# -- slow fixes ---------------------------------------------------------------------------------------------------


def cell_by_cell(x):
    """The fix as PyTorch's tutorials write a loader: `DataLoader(dataset, batch_size=128, drop_last=True)` over single
    cells, so each minibatch is fetched one cell at a time and collated. Correct; scvi's loader fetches a minibatch in
    one call because "retrieving single observations and then collating is inefficient"."""
    return [batch["X"] for batch in DataLoader(CellsDataset(x), sampler=x.epoch_order, batch_size=x.batch_size, drop_last=True)]


slow_fixes = {"cell_by_cell": cell_by_cell}
