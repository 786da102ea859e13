"""LayerDrop skips encoder layers under DDP: "Expected to have finished reduction in the prior iteration".

Upstream: https://github.com/speechbrain/speechbrain/issues/2340 (SpeechBrain fine-tuning HuggingFace's
    WavLM-large, `microsoft/wavlm-large`, for 4-class emotion recognition, launched with DDP on GPUs;
    January 2024; the reporter's torch and transformers versions are in a pip list not read here:
    not established). The same failure for wav2vec2 under HF's Trainer:
    https://github.com/huggingface/transformers/issues/11452, #17116 and #30113.

Fidelity: faithful in the mechanism and the model's structure: 24 encoder layers named as HF's
    WavLM layers (`encoder.layers.N.attention.{q,k,v,out}_proj`, `layer_norm`,
    `feed_forward.{intermediate,output}_dense`, `final_layer_norm`), pre-LayerNorm as wavlm-large
    (`do_stable_layer_norm`), then the encoder's LayerNorm, mean pooling over time and a 4-way linear
    head (SpeechBrain's emotion recipes, `out_n_neurons: 4`), cross entropy, Adam (SpeechBrain's
    wav2vec2 emotion recipes; the thread's optimiser lines are not in the part read). LayerDrop as
    HF's WavLM encoder: in training, layer i > 0 is skipped when a uniform draw is below
    `layerdrop` (0.1 in wavlm-large's config). DDP over gloo, two ranks under torch elastic
    (`cases/_ddp_worker.py`, as multigpu_segfault). Synthetic: the width (16 for 1024, heads 2 for 16,
    feed-forward 64 for 4096), no relative position bias, no convolutional feature encoder (its output,
    the frames, is seeded noise), no dropout (so DDP can equal one process), the labels, float64 for
    training (float32 in the speed phase; see the yaml's `dtype` for why); and the
    draws: each step's skip decisions come from a generator seeded with (seed, step) on every rank
    (`layerdrop_draws: shared`; SpeechBrain seeds every rank alike, `torch.manual_seed(12)` in the
    thread's yaml, but whether the ranks' draws stayed equal is not established) or with (seed, step,
    rank) (`independent`).

Symptom on CUDA: the thread (NCCL; the reporter set TORCH_DISTRIBUTED_DEBUG to get names), verbatim:
        RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by
        making sure all `forward` function outputs participate in calculating loss.
        [...]
        Parameters which did not receive grad for rank 0: model.encoder.layers.22.final_layer_norm.bias, model.encoder.layers.22.final_layer_norm.weight, model.encoder.layers.22.feed_forward.output_dense.bias, ...
    Seen on an H200 (torch 2.11.0+cu130, CUDA 13.0, driver 580.159), two gloo ranks on one GPU: the CPU's text, rank 0 first
    (`Parameters which did not receive grad for rank 0: encoder.layers.12.final_layer_norm.bias, ...`).
    `[...]` marks a cut: the thread's message has one more paragraph there ("If you already have done the above,
    then the distributed data parallel module wasn't able to locate the output tensors ...").

Symptom on CPU: both ranks raise at the forward after the first step that skipped a layer, in DDP's
    `_pre_forward` (`self.reducer._rebuild_buckets()`); with TORCH_DISTRIBUTED_DEBUG=INFO the names follow:
        RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss. You can enable unused parameter detection by passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by
        making sure all `forward` function outputs participate in calculating loss.
        ...
        Parameters which did not receive grad for rank 0: encoder.layers.12.final_layer_norm.bias, encoder.layers.12.final_layer_norm.weight, ...
        Parameter indices which did not receive grad for rank 0: 32 33 ... 47 192 193 ... 207
    and the launcher reports `ChildFailedError`, exit code 1. (DETAIL, which the thread may have
    used, is not set here: on torch 2.13.0 CPU, DDP's constructor segfaults under
    TORCH_DISTRIBUTED_DEBUG=DETAIL with gloo, plain torchrun too, a `nn.Linear(4, 4)` is enough.)

Cause: DDP's reducer waits, during backward, for a gradient from every parameter it was built with;
    a layer LayerDrop skipped takes no part in the loss, its parameters never report ready, the
    gradient buckets of that iteration never finish, and the next forward finds the reduction
    unfinished. Which layers are skipped changes every step.

Fix: the maintainers' answers in #2340, on BenoitWang's explanation: "As explained by @BenoitWang, w2v2
    from HF is using a layer dropout strategy which causes issues with DDP (and that is why you really need
    to specify `--find_unused_parameters=True`)" (Adel-Moumen; BenoitWang's own comment is not in the part
    read); or "deactivate layer_drop in the config.json of the HuggingFace model ... this may result (or may
    not) in degraded downstream performance" (TParcollet). The first is `fixed`; the second changes the
    recipe (below). `fixed` is
    `DistributedDataParallel(model, find_unused_parameters=True)`: after each
    forward DDP walks the autograd graph from the outputs and marks every parameter it cannot reach
    as ready, and it leaves the gradient of a parameter no rank used untouched (None), so the ranks
    train exactly what one process computes from the same per-rank skips (max |diff| 1.1e-13 in
    float64). With `layerdrop_draws=independent` (each rank skips its own layers) it holds as well.
    What it costs, timed on a 1-rank group at this width (speed phase): the walk is cheap on CPU,
    1.02x best-of-30 against plain DDP over only the kept layers (0.4 ms of an 18.4 ms step; the
    harness's intervals read 1.02-1.08x), and the other way to keep the skipped layers out of DDP,
    a new DDP each step over that step's layers, costs more: the fix reads 0.83-0.91x of it
    (speed:wrap_kept_layers_each_step). At wavlm-large's width the step's arithmetic grows 4000-fold
    while the walk does not (the same nodes): its share can only shrink.
    Wrong fixes: `static_graph=True` (a generic attempt, not from a thread on this error), which PyTorch's
    DDP docs (DistributedDataParallel's `static_graph`)
    say may "Potentially improve performance when there are unused parameters, as DDP will not search
    graph in each iteration to detect unused parameters" (transformers PR
    https://github.com/huggingface/transformers/pull/45519, which exposes the flag, quotes those docs),
    assumes the same parameters go unused every step; LayerDrop changes them and DDP raises "Your training graph
    has changed in this iteration" at the second step. `loss + 0 * sum(skipped layers' parameters)` (the
    workaround in https://github.com/pytorch/pytorch/issues/43259, for the same error) trains, but gives a
    layer that no rank ran a gradient 0 instead of none, and Adam moves it with
    its running averages (max |diff| 1.7e-3 after 3 steps with shared draws); with independent
    draws and this seed no layer is skipped by both ranks in one step, and the trick matches the
    reference (the bad-fix phase then reports it accepted: it is wrong only where no rank ran a
    layer). `layerdrop: 0` is a maintainer's answer in #2340 (TParcollet's, above), and a user may well
    choose it; the case grades it wrong because it trains another recipe than the thread's: wavlm-large's
    config sets layerdrop 0.1, and without it every layer trains every step, so its weights are not those
    the recipe with LayerDrop gives (max |diff| 6.0e-3), at a cost to downstream performance that, as
    TParcollet says, may or may not come. Freezing the layers step 0's error named (`requires_grad=False`, a
    generic attempt) raises again at the next step, which skips others.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cases._ddp_worker import launch
from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

RANK_ERRORS = (
    RuntimeError,
)  # a bad fix's launch raises a rank's RuntimeError again, by its text (the buggy one keeps the launcher's report)
UNFINISHED_REDUCTION = r"Expected to have finished reduction in the prior iteration before starting a new one"

symptoms = {
    "cpu": Symptom(
        "ChildFailedError", UNFINISHED_REDUCTION, output=r"Parameters which did not receive grad for rank \d+: encoder\.layers\.\d+\."
    ),
    "cuda": Symptom(
        "ChildFailedError", UNFINISHED_REDUCTION, output=r"Parameters which did not receive grad for rank \d+: encoder\.layers\.\d+\."
    ),
}

# DDP's reducer found parameters that produced no gradient; a static graph that changed, or a parameter marked ready twice, is another failure.
triage_signs = TriageSigns(
    family="DDP's unfinished reduction: parameters that got no gradient",
    cause="parameters unused in some iterations (LayerDrop, a branch skipped) under DistributedDataParallel without find_unused_parameters",
    confirm="a layer or branch that the forward skips on some steps; TORCH_DISTRIBUTED_DEBUG=DETAIL lists the parameters",
    also="outputs of the forward not used in the loss, or a frozen part that still requires grad",
    signs=(
        Sign(
            "failure",
            r"Expected to have finished reduction in the prior iteration before starting a new one",
            0.9,
            "DDP's reducer: the previous iteration's gradient reduction never finished, as parameters unused in the loss never report ready",
        ),
        Sign(
            "failure",
            r"Parameters? (?:indices )?which did not receive grad for rank \d+",
            0.6,
            "DDP's list (TORCH_DISTRIBUTED_DEBUG) of the parameters that got no gradient on a rank",
        ),
        Sign(
            "failure",
            r"\[Rank \d+\] Parameter: [\w.]+ did not get gradient|\bParameter: [\w.]+ did not get gradient in backwards pass",
            0.6,
            "the reducer's own line per parameter (reducer.cpp, TORCH_DISTRIBUTED_DEBUG=DETAIL): a parameter that got no gradient on a rank",
        ),
        Sign("context", r"find_unused_parameters", 0.2, "DDP's unused-parameter detection is mentioned"),
        Sign("context", r"layerdrop|layer_drop|LayerDrop", 0.3, "LayerDrop in play: layers skipped at random in training"),
        Sign("context", r"DistributedDataParallel|nn/parallel/distributed\.py|_rebuild_buckets", 0.2, "raised in DistributedDataParallel"),
        Sign(
            "veto",
            r"(?i)training graph has changed in this iteration",
            0,
            "DDP with static_graph=True saw a different set of used parameters: a changed graph, not an unfinished reduction",
        ),
    ),
)

compiled_unit = "each rank's DDP model, `torch.compile(DistributedDataParallel(model))`, in the ranks: LayerDrop's skips are Python control flow, so dynamo guards on them and recompiles per skip pattern"
compiles_itself = True  # the harness cannot compile a launch: the ranks compile their model from cfg.compile (Job.compile)


class Attention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):  # (B, T, D)
        batch, frames, width = x.shape
        q, k, v = (proj(x).view(batch, frames, self.heads, -1).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, frames, width))


class FeedForward(nn.Module):
    def __init__(self, width, inner):
        super().__init__()
        self.intermediate_dense = nn.Linear(width, inner)
        self.output_dense = nn.Linear(inner, width)

    def forward(self, x):
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class EncoderLayer(nn.Module):
    """HF's WavLMEncoderLayerStableLayerNorm without the relative position bias and the dropouts."""

    def __init__(self, width, heads, inner):
        super().__init__()
        self.attention = Attention(width, heads)
        self.layer_norm = nn.LayerNorm(width)
        self.feed_forward = FeedForward(width, inner)
        self.final_layer_norm = nn.LayerNorm(width)

    def forward(self, x):
        x = x + self.attention(self.layer_norm(x))
        return x + self.feed_forward(self.final_layer_norm(x))


class Encoder(nn.Module):
    def __init__(self, layers, width, heads, inner):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(width, heads, inner) for _ in range(layers))
        self.layer_norm = nn.LayerNorm(width)

    def forward(self, x, keep):
        for layer, kept in zip(self.layers, keep):
            if kept:  # LayerDrop: HF skips layer i > 0 when its draw is below config.layerdrop
                x = layer(x)
        return self.layer_norm(x)


class EmotionModel(nn.Module):
    """WavLM's encoder, then SpeechBrain's emotion head: mean over time, a linear layer to 4 classes."""

    def __init__(self, layers, width, heads, inner, classes):
        super().__init__()
        self.encoder = Encoder(layers, width, heads, inner)
        self.output_mlp = nn.Linear(width, classes)

    def forward(self, frames, keep):  # (B, T, D), (layers,) bool
        return self.output_mlp(self.encoder(frames, keep).mean(dim=1))  # (B, classes)


class Job(NamedTuple):
    ranks: int
    device: str
    steps: int
    lr: float
    dtype: str  # the model's and the frames' dtype
    sizes: tuple  # (layers, width, heads, inner, classes)
    frames: torch.Tensor  # (B, T, D): the full batch, split evenly over the ranks
    labels: torch.Tensor  # (B,)
    keep: torch.Tensor  # (steps, ranks, layers) bool: which layers each rank runs at each step
    init: dict  # initial parameters, the same on every rank
    pg_timeout_s: float
    deadline_s: float
    compile: str = "off"


def make_inputs(cfg, device):
    sizes = cfg.sizes
    if sizes.batch % sizes.ranks:
        raise ValueError(f"need batch % ranks == 0; got batch {sizes.batch}, ranks {sizes.ranks}")
    if cfg.layerdrop_draws not in ("shared", "independent"):
        raise ValueError(f"layerdrop_draws={cfg.layerdrop_draws}: choose shared or independent")
    compiled = compile_axis.mode_of(cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    shape = (sizes.layers, sizes.width, sizes.heads, sizes.inner, sizes.classes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        init = {name: p.detach().clone() for name, p in EmotionModel(*shape).named_parameters()}
    return Job(
        ranks=sizes.ranks,
        device=device,
        steps=sizes.steps,
        lr=cfg.lr,
        dtype=cfg.dtype,
        sizes=shape,
        frames=torch.randn(sizes.batch, sizes.frames, sizes.width, generator=generator),
        labels=torch.randint(0, sizes.classes, (sizes.batch,), generator=generator),
        keep=layerdrop_draws(cfg, sizes),
        init=init,
        pg_timeout_s=float(cfg.pg_timeout_s if compiled == "off" else cfg.compiled_pg_timeout_s),
        deadline_s=float(cfg.deadline_s if compiled == "off" else cfg.compiled_deadline_s),
        compile=compiled,
    )


def layerdrop_draws(cfg, sizes):
    """(steps, ranks, layers) bool, True where the layer runs: one uniform draw per layer, as HF draws them."""
    keep = torch.ones(sizes.steps, sizes.ranks, sizes.layers, dtype=torch.bool)
    for step in range(sizes.steps):
        for rank in range(sizes.ranks):
            seed = cfg.seed * 1_000_003 + step * 1009 + (rank if cfg.layerdrop_draws == "independent" else 0)
            draws = torch.rand(sizes.layers, generator=torch.Generator().manual_seed(seed))
            keep[step, rank, 1:] = draws[1:] >= cfg.layerdrop  # layer 0 always runs (HF: `i > 0`)
    return keep


# -- in each rank --------------------------------------------------------------------------


def start_rank(job, debug="OFF"):
    """Join the gloo process group; `debug` is TORCH_DISTRIBUTED_DEBUG's level (INFO names the unused parameters)."""
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug
    dist.set_debug_level_from_env()
    dist.init_process_group("gloo", timeout=timedelta(seconds=job.pg_timeout_s))
    return int(os.environ["RANK"])


def build_model(job):
    model = EmotionModel(*job.sizes)
    model.load_state_dict(job.init)
    return model.to(getattr(torch, job.dtype))


def rank_batch(job, rank):
    per_rank = len(job.frames) // job.ranks
    return job.frames[rank * per_rank : (rank + 1) * per_rank].to(getattr(torch, job.dtype)), job.labels[
        rank * per_rank : (rank + 1) * per_rank
    ]


def train(job, rank, model, ddp, *, extra_loss=None):
    """Adam steps over this rank's shard, each with this rank's LayerDrop skips; the parameters it ends with."""
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=job.lr)
    ddp = compile_axis.under(job.compile, ddp)
    frames, labels = rank_batch(job, rank)
    for step in range(job.steps):
        keep = job.keep[step, rank].tolist()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(frames, keep), labels)
        if extra_loss is not None:
            loss = loss + extra_loss(model, keep)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
    return {name: p.detach().cpu().numpy() for name, p in model.named_parameters()}


def buggy_rank(job):
    rank = start_rank(job, debug="INFO")  # as the reporter did, to get the parameters' names (DETAIL: see the docstring)
    model = build_model(job)
    return train(job, rank, model, DistributedDataParallel(model))


def fixed_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    return train(job, rank, model, DistributedDataParallel(model, find_unused_parameters=True))


# -- the three sides -----------------------------------------------------------------------


def buggy(job):
    return every_rank(launch(buggy_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s))


def fixed(job):
    return every_rank(launch(fixed_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s))


def reference(job):
    """One process, no DDP: each step's loss is the mean over ranks of each rank's shard through its own
    kept layers (DDP averages the ranks' gradients); a parameter no shard used keeps no gradient."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank runs: at this width a second thread only waits (12.5 s against 0.47 s on a busy 2-core machine)
    try:
        return _reference(job)
    finally:
        torch.set_num_threads(threads)


def _reference(job):
    model = build_model(job)
    optimizer = torch.optim.Adam(model.parameters(), lr=job.lr)
    for step in range(job.steps):
        optimizer.zero_grad(set_to_none=True)
        losses = [
            F.cross_entropy(model(*rank_batch(job, rank)[:1], job.keep[step, rank].tolist()), rank_batch(job, rank)[1])
            for rank in range(job.ranks)
        ]
        torch.stack(losses).mean().backward()
        optimizer.step()
    return {name: p.detach().expand(job.ranks, *p.shape) for name, p in model.named_parameters()}


def every_rank(results):
    """{name: (N, *shape)}: each parameter as every rank ended with it, by rank."""
    return {name: torch.stack([torch.from_numpy(results[rank][name]) for rank in sorted(results)]) for name in results[0]}


# -- bad fixes -----------------------------------------------------------------------------


def static_graph_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    return train(job, rank, model, DistributedDataParallel(model, static_graph=True))


def static_graph(job):
    """`static_graph=True` (a generic attempt, read from PyTorch's DDP docs, not from a thread on this error): by those
    docs it spares the search for unused parameters each step, but it assumes the same parameters go unused every
    step."""
    return every_rank(launch(static_graph_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s, refusals=RANK_ERRORS))


def zero_times_skipped(model, keep):
    return 0.0 * sum(p.sum() for layer, kept in zip(model.encoder.layers, keep) if not kept for p in layer.parameters())


def zero_times_skipped_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    return train(job, rank, model, DistributedDataParallel(model), extra_loss=zero_times_skipped)


def multiply_skipped_by_zero(job):
    """`loss + 0 * (skipped layers' parameters).sum()`, the workaround for this error in
    https://github.com/pytorch/pytorch/issues/43259 ("If you add all the parameters into the loss, though with a
    multiply factor of zero, all parameters are technically used"): every parameter in the graph, the skipped ones
    with gradient 0 instead of none, and Adam moves a parameter with gradient 0 (its running averages)."""
    return every_rank(launch(zero_times_skipped_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s, refusals=RANK_ERRORS))


def no_layerdrop_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    return train(job._replace(keep=torch.ones_like(job.keep)), rank, model, DistributedDataParallel(model))


def disable_layerdrop(job):
    """TParcollet, a maintainer, in https://github.com/speechbrain/speechbrain/issues/2340: `layerdrop: 0` in the
    model's config. It trains, but another recipe than the thread's (wavlm-large's layerdrop 0.1): every layer every
    step."""
    return every_rank(launch(no_layerdrop_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s, refusals=RANK_ERRORS))


def freeze_reported_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    for index in torch.nonzero(~job.keep[0].all(dim=0)).flatten().tolist():  # the layers step 0's error named
        model.encoder.layers[index].requires_grad_(False)
    return train(job, rank, model, DistributedDataParallel(model))


def freeze_reported_layers(job):
    """`requires_grad=False` on the layers the error named (a generic attempt, not from the cited threads): DDP
    ignores them, but the next step skips others."""
    return every_rank(launch(freeze_reported_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s, refusals=RANK_ERRORS))


bad_fixes = {
    "static_graph": static_graph,
    "multiply_skipped_by_zero": multiply_skipped_by_zero,
    "disable_layerdrop": disable_layerdrop,
    "freeze_reported_layers": freeze_reported_layers,
}


# -- speed ---------------------------------------------------------------------------------
# The harness times functions called in one process, so both sides run on a 1-rank gloo group there:
# one forward and backward (no optimiser step, so every call sees the same parameters) with the first
# step's skips, returning the gradients of the kept layers.

_speed_state = {}


def speed_candidate(job):
    """The fix's step: DDP with find_unused_parameters=True over the whole model, the skipped layers idle."""
    model, ddp, _, keep = _one_rank(job)
    return _step(model, ddp, job, keep)


def speed_baseline(job):
    """Plain DDP over a model of only the kept layers: the same arithmetic, no walk, nothing unused."""
    _, _, (kept_model, kept_ddp), _ = _one_rank(job)
    return _step(kept_model, kept_ddp, job, [True] * len(kept_model.encoder.layers))


def speed_reference(job):
    """The kept layers' gradients, from plain autograd on the whole model (a 1-rank all-reduce averages over 1)."""
    model = build_model(job)
    keep = job.keep[0, 0].tolist()
    frames, labels = rank_batch(job._replace(ranks=1), 0)
    F.cross_entropy(model(frames, keep), labels).backward()
    return kept_gradients(model, keep)


def _step(model, ddp, job, keep):
    model.zero_grad(set_to_none=True)
    frames, labels = rank_batch(job._replace(ranks=1), 0)
    F.cross_entropy(ddp(frames, keep), labels).backward()
    return kept_gradients(model, keep)


def kept_gradients(model, keep):
    kept = [p for layer, used in zip(model.encoder.layers, keep) if used for p in layer.parameters()]
    rest = [*model.encoder.layer_norm.parameters(), *model.output_mlp.parameters()]
    return torch.cat([p.grad.flatten() for p in kept + rest])


def _one_rank(job):
    if id(job) not in _speed_state:
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        keep = job.keep[0, 0].tolist()
        model = build_model(job)
        kept_model = copy.deepcopy(model)
        kept_model.encoder.layers = nn.ModuleList(layer for layer, used in zip(kept_model.encoder.layers, keep) if used)
        ddp = compile_axis.under(job.compile, DistributedDataParallel(model, find_unused_parameters=True))
        kept_ddp = compile_axis.under(job.compile, DistributedDataParallel(kept_model))
        _speed_state[id(job)] = (model, ddp, (kept_model, kept_ddp), keep)
        _speed_state[("plain", id(job))] = build_model(job)  # for the slow fix: a model no DDP hooks into
    return _speed_state[id(job)]


def wrap_kept_layers_each_step(job):
    """Leave the skipped layers out of DDP: a new DDP each step over a module of only this step's layers."""
    _, _, _, keep = _one_rank(job)
    model = _speed_state[("plain", id(job))]
    model.zero_grad(set_to_none=True)
    frames, labels = rank_batch(job._replace(ranks=1), 0)
    F.cross_entropy(DistributedDataParallel(KeptLayers(model, keep))(frames), labels).backward()
    return kept_gradients(model, keep)


class KeptLayers(nn.Module):
    """`model` with only the kept layers, sharing its parameters."""

    def __init__(self, model, keep):
        super().__init__()
        self.layers = nn.ModuleList(layer for layer, used in zip(model.encoder.layers, keep) if used)
        self.layer_norm = model.encoder.layer_norm
        self.output_mlp = model.output_mlp

    def forward(self, frames):
        for layer in self.layers:
            frames = layer(frames)
        return self.output_mlp(self.layer_norm(frames).mean(dim=1))


# -- slow fixes: correct, but costlier than the budget allows ------------------------------


def allreduce_by_hand(job):
    """No DDP: after backward, every parameter's gradient all-reduced on its own (zeros where unused) and averaged."""
    _, _, _, keep = _one_rank(job)
    model = _speed_state[("plain", id(job))]
    model.zero_grad(set_to_none=True)
    frames, labels = rank_batch(job._replace(ranks=1), 0)
    F.cross_entropy(model(frames, keep), labels).backward()
    world = dist.get_world_size()
    for p in model.parameters():
        used = torch.tensor([float(p.grad is not None)])
        dist.all_reduce(used)
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        dist.all_reduce(grad)
        p.grad = grad / world if used.item() else None
    return kept_gradients(model, keep)


slow_fixes = {"allreduce_by_hand": allreduce_by_hand}
