"""ETHOS-ARES's inference runs on a model left in training mode: dropout 0.3 in every prediction.

Upstream: https://github.com/ipolharvard/ethos-ares/issues/20 ("Dropout active during inference and evaluation?",
    lukkch, 2026-02-16; ethos-ares as of the snapshot read here, 2d54383 of 2025-10-02; device and torch version not
    stated, the training script asks for 8 GPUs): "As i don't see a model.eval() call anywhere in the repo, i'm pretty
    sure the dropout units are active during inference as well as during loss estimation while training. The
    @torch.inference_mode() and @torch.no_grad() decorators only disable gradient computation/reduce resource
    utilization, and don't set the model to evaluation mode." The maintainer (prenc, 2026-02-17): "Good catch! This is
    definitely a bug. The code in this repo was used to generate the results reported in the ETHOS-ARES paper", with a
    spreadsheet of the downstream tasks "after fixing this and several other issues" (the fix itself is not in that
    snapshot). In that snapshot `scripts/run_training.sh` trains with `DROPOUT=0.3` (embedding, residual and attention
    dropout alike); `load_model_checkpoint` (src/ethos/utils.py) builds `GPT2LMNoBiasModel` and loads the state dict,
    nothing calls `eval()`; the inference worker (src/ethos/inference/inference.py) repeats each timeline `rep_num`
    times and calls `get_next_token`, decorated `@th.inference_mode`, whose softmax of the last position's logits is the
    distribution each next token is drawn from. The fix, as https://github.com/meta-pytorch/torchtune/pull/1049 ("Put
    model in eval mode for evaluation", merged 2024) made it for torchtune's eval recipe: `model.eval()` ("model.eval
    only acts on specific layers that act different between training and eval, like `Dropout`"), with its caveat: "SPDA
    dropout is not able to be turned off by `model.eval()` as per" pytorch/pytorch issue 124464
    (https://github.com/pytorch/pytorch/issues/124464).

Fidelity: faithful in the model and the call: ETHOS-ARES's `GPT2LMNoBiasModel` (src/ethos/model.py, re-typed:
    token and position embeddings, embedding dropout, pre-LayerNorm blocks without biases, SDPA attention with
    `dropout_p=self.dropout if self.training else 0`, residual dropout, a GELU MLP with dropout, the LM head tied to
    the token embedding and applied to the last position only, its own init), at the sizes of the repository's
    training.yaml (1 layer, 4 heads, n_embd 64, n_positions 2048) with run_training.sh's dropout 0.3, loaded in
    training mode as `load_model_checkpoint` leaves it, each timeline repeated `rep_num` times and its next-token
    distribution computed under `inference_mode` as the worker and `get_next_token` do, float32 on the CPU (the
    worker's autocast is CUDA only). Synthetic: the weights (ETHOS's init, seeded, untrained: no checkpoint is
    public here, so the distribution is near uniform, entropy 6.918 nats of log 1024 = 6.931), the vocabulary of
    1024 tokens, the timelines (4 patients, 32 random token ids each; ETHOS's reach 2048), rep_num 20 (the thread
    discusses 20 and 100), the first generated token only (the worker then samples and appends; the sampling is random
    by design, the distribution is not). The output is that distribution, (patients, rep_num, vocab), and the mode the
    model is handed back in (ETHOS's `estimate_loss` evaluates the same model during training, which goes on after it).

Symptom on CUDA: the same, silent: nn.Dropout and SDPA drop on every device in training mode. The thread states no
    device for its inference; the published numbers were computed this way ("The code in this repo was used to
    generate the results reported in the ETHOS-ARES paper"). Not run on a GPU here.

Symptom on CPU: nothing raises and nothing is printed (torch 2.13.0, run here). Every probability is a dropout draw's:
    against the model's distribution, relative error 0.10 on each patient, total variation 0.04 (max 0.055) per
    repetition, and the 20 repetitions of one timeline, equal in eval mode, differ from each other by 9.5% (std over
    mean, per probability); the most likely token is another for 31% of the repetitions (of a near-uniform
    distribution: on a trained model the figures are the checkpoint's, unknown here). Compiled (inductor, torch
    2.13.0): as wrong.

Cause: every nn.Module starts in training mode, and only `eval()` (`train(False)`) clears the flag that nn.Dropout
    and ETHOS's attention read; `torch.inference_mode()` and `torch.no_grad()` switch off autograd, not the module's
    mode. So a model built and loaded for inference, never put in eval mode, zeroes 30% of its embeddings, attention
    weights and residual activations at random and scales the rest by 1/0.7 at every call: each prediction comes
    from another random sub-network.

Fix: `model.eval()` once the model is loaded, before inference (torchtune #1049's line, what #20 asks for): every
    nn.Dropout an identity, the attention's `dropout_p` 0, the repetitions of a timeline equal; then `model.train()`,
    for the training that goes on. Also correct (the alternative in tests/fixes/alternatives/): only the modules that
    read the flag (each nn.Dropout, the attention) set out of training for the inference and back after it. The
    reference is independent of both: the forward written out in float64 from the parameters with no dropout at all
    (LayerNorm, the causal softmax attention and the erf GELU by hand), the softmax of the last position's logits,
    repeated rep_num times, and training mode after. Wrong ones, each rejected: `torch.no_grad()` around the inference
    (what the thread says does not help): the buggy code's error, relative 0.10; `model.eval()` with the MLP's dropout
    written `F.dropout(x, p)` (its default `training=True` ignores the module's mode; the line of
    https://github.com/facebookresearch/DME/issues/3, "It seems that this line will trigger dropout during inference"):
    relative error 0.05; `model.eval()` with the attention passing `dropout_p=self.dropout` to SDPA unconditionally
    (torchtune #1049's caveat; SDPA drops whenever `dropout_p` > 0): relative error 0.011; `model.eval()` and never
    `train()` after (the review of https://github.com/udacity/deep-learning-v2-pytorch/pull/397: "The `model.train()`
    needs to be added back if we're going to use `model.eval()`"): the predictions right, the model handed back in eval
    mode, where the next training step runs without dropout; torchtune #1049's own line, graded as an upstream fix, is
    rejected the same way (its eval recipe ends there; docs/history/upstream_fixes.md). Its cost: against the same
    inference with every dropout rate 0 (ETHOS's training.yaml default, `dropout: 0`), the fix is free; against the
    buggy call it is faster (dropout's masks, and attention with dropout leaves SDPA's fused CPU kernel for its math
    path: the buggy call 2.7x the fix's time here): 1.002x [0.898, 1.117] and 0.995x [0.881, 1.124] eager, 0.990x
    [0.862, 1.137] compiled (torch 2.13.0, a loaded 2-core CPU, one thread; budget 1.2). The slow control, correct:
    model.eval(), then each of the 80 repetitions through the model alone, a batch of 1: 2.635x [2.551, 2.721] and
    2.665x [1.915, 3.708] eager, 1.917x [1.722, 2.134] compiled.

Compiled: the model, as the worker compiles it (`th.compile(model)` once loaded), called under `inference_mode`
    (compiles_itself: `loaded` compiles it where the run compiles); in training mode inductor generates the dropout
    masks from its own random stream, as wrong, and eval mode recompiles once. The whole call cannot be compiled from
    outside: dynamo fails on the `inference_mode` inside it (torch 2.13.0: `BackendCompilerFailed: backend='inductor'
    raised: RuntimeError: Cannot set version_counter for inference tensor`, at the timelines' indexing).
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from harness import compiled as compile_axis
from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: every probability is a dropout draw's

# A silent failure: what users post is prose. The signs are their words for it: dropout still on at inference or
# evaluation, eval mode forgotten or missing, eval() needed for a correct test because of dropout, a functional dropout
# or an attention dropout rate that eval mode does not reach; each needs dropout named around it. Not another framework's
# dropout (Gluon, Keras), not dropout kept on on purpose (Monte Carlo dropout), not BatchNorm's batch of one.
triage_signs = TriageSigns(
    family="dropout (or another training-mode layer) active at inference or evaluation",
    cause="a model used for inference or evaluation without model.eval(), or a dropout that eval mode does not reach",
    confirm="nothing calls model.eval() before the inference; or the forward calls F.dropout(x, p) without training=self.training, or hands dropout_p to scaled_dot_product_attention whatever the mode",
    also="BatchNorm updating its running statistics at evaluation; model.eval() never undone with model.train() before training goes on",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:different|random|non-?deterministic|inconsistent|varying|changing)\b[^.?!]{0,20}\b(?:outputs?|results?|predictions?|scores?)\b[^.?!]{0,80}\b(?:because of|due to|caused by)\b[^.?!]{0,30}\bdropout|\bF\.dropout\w*\([^)]*\btraining ?= ?True",
            0.45,
            "outputs that change from run to run because of dropout, or a functional dropout forced on (training=True)",
        ),
        Sign(
            "failure",
            r"(?i)\bdropouts?\b[^.?!]{0,60}\b(?:still|also|is|are|remains?|stays?|being|gets?|keeps?)\b[^.?!]{0,30}\b(?:active|enabled|on|applied|used|triggered|working|at \d)\b[^.?!]{0,50}\b(?:inference|evaluat\w*|eval\b|test(?:ing)?\b|predict\w*|validat\w*|demo)|\b(?:inference|evaluation|eval|test(?:ing)?|predict\w*|validation)\b[^.?!]{0,40}\bdropouts?\b[^.?!]{0,30}\b(?:still|also)\b[^.?!]{0,15}\b(?:active|enabled|on|applied|used|set|working)\b|\b(?:trigger|appl(?:y|ies)|enable|keep)s?\w*\b[^.?!]{0,10}\bdropouts?\b[^.?!]{0,20}\b(?:during|at|in)\b[^.?!]{0,10}\b(?:inference|evaluation|eval|test(?:ing)?|prediction)",
            0.45,
            "dropout still active at inference or evaluation",
        ),
        Sign(
            "failure",
            r"(?i)(?:\bforg[eo]t\w*|\bmiss(?:ed|ing)|\bwithout|\bnever (?:call\w*|set\w*|put\w*|switch\w*)|\bdon't see|\bdo(?:es)? not (?:use|call|set)|\bdoesn't (?:use|call|set)|\bnot (?:in|set to|called?|switched to|put in(?:to)?))\b[^.?!]{0,40}(?:\b(?:\w+\.)?eval\(\)|\beval(?:uation)? mode\b|\btrain\(False\))",
            0.45,
            "the model never put in eval mode for inference",
        ),
        Sign(
            "failure",
            r"(?i)\bforg[eo]t\w*\b|\bmissed\b",
            0.45,
            "forgot to call `.eval()`, its line shown after the sentence",
            near=(r"(?:\w|\]|\))\.eval\(\)|\btrain\(False\)",),
        ),
        Sign(
            "failure",
            r"(?i)\bdropout\b[^.?!]{0,60}\b(?:use|call|need\w*|requires?|add)\b[^.?!]{0,15}\b(?:\w+\.)?eval\(\)|\beval\(\)[^.?!]{0,40}\b(?:turns? off|disabl\w*|deactivat\w*|switch\w* off|ban)\b[^.?!]{0,20}\bdropout|\bdropout\b[^.?!]{0,40}\b(?:test|evaluation|eval|inference|predictions?|accuracy|results?)\b[^.?!]{0,20}\b(?:won't|will not|isn't|is not|aren't|are not)\b[^.?!]{0,10}\b(?:be )?(?:correct|right|deterministic|reproducible)|\b(?:evaluation|eval|inference) mode\b[^.?!]{0,40}\b(?:turns? off|disabl\w*|deactivat\w*|switch\w* off)\b[^.?!]{0,20}\bdropout|\bdropout\b[^.?!]{0,30}\b(?:when|while) (?:the )?(?:model|module|net\w*) is (?:not training|in eval\w*|evaluat\w*)",
            0.45,
            "eval() (eval mode) is needed for a correct evaluation because of dropout",
        ),
        Sign(
            "failure",
            r"(?i)\beval\(\)[^.?!]{0,20}\b(?:does not|doesn't|won't|cannot|can't|is not able to)\b[^.?!]{0,20}\b(?:turn\w* off|disabl\w*|shut\w* off|affect\w*)\b[^.?!]{0,30}\b(?:dropout\w*|F\.dropout|SDPA|SPDA|scaled_dot_product_attention|dropout_p)\b|\bF\.dropout\([^)]*\)[^.?!]{0,60}\b(?:inference|evaluation|eval\b|test)",
            0.45,
            "a dropout that eval mode does not reach: functional, or a rate handed to attention",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:predict\w*|inference|infer(?:red|ring)?|evaluat\w*|test(?:ing)?|model(?:'s)? outputs?)\b|预测|推理|测试",
            0.5,
            "a report in words: predictions or evaluations of the same input that differ from call to call",
            family=True,
            near=(
                r"(?i)\b(?:different|differs?|vary|varies|varying|random(?:ly)?|inconsistent|non-?deterministic|not (?:the )?same|not reproducible|chang(?:es|ed|ing))\b|不同|不一样|随机",
                r"(?i)\bsame (?:input|image|picture|sample|data|text|sentence|audio|example|batch)s?\b|\b(?:twice|each time|every time|multiple times|repeatedly|two (?:calls|runs|times))\b|同一|多次|两次",
            ),
        ),
        Sign(
            "context",
            r"(?i)\bdropout\w*\b|nn\.Dropout|F\.dropout|dropout_p\b",
            0.3,
            "dropout in the model",
        ),
        Sign(
            "context",
            r"(?i)\bmodel\.eval\(\)|\.eval\(\)|\btrain\(False\)|self\.training|\btraining ?=|inference_mode|no_grad|\beval(?:uation)? mode\b",
            0.3,
            "the module's mode, or autograd switched off for inference",
        ),
        Sign(
            "support",
            r"(?i)\b(?:inference|evaluat\w*|predict\w*|test set|validation)\b",
            0.1,
            "an inference or an evaluation",
        ),
        Sign(
            "veto",
            r"(?i)\bgluon\b|autograd\.record|\bmxnet\b|\bkeras\b|tensorflow|\btf\.nn\b|Expected more than 1 value per channel|Monte ?Carlo dropout|\bMC[- ]?dropout\b|lora_dropout",
            0,
            "another framework's dropout, dropout kept on at inference on purpose (Monte Carlo), BatchNorm's batch of one, or a LoRA dropout never applied",
        ),
    ),
)

compiled_unit = (
    "the model, as ETHOS-ARES's inference worker compiles it (`th.compile(model)` once loaded; compiles_itself: `loaded` "
    "compiles it where the run compiles), called under `inference_mode` as `get_next_token` calls it; the harness cannot "
    "compile the whole call from outside: dynamo fails on `inference_mode` inside the compiled function (torch 2.13.0, "
    "BackendCompilerFailed: Cannot set version_counter for inference tensor)"
)
compiles_itself = True


class Config(NamedTuple):
    """The part of transformers' GPT2Config that ETHOS's GPT2LMNoBiasModel reads."""

    vocab_size: int
    n_positions: int
    n_layer: int
    n_head: int
    n_embd: int
    resid_pdrop: float
    embd_pdrop: float
    attn_pdrop: float
    bias: bool = False


class CausalSelfAttention(nn.Module):
    """ETHOS-ARES's src/ethos/model.py, its flash path (the one inference takes): SDPA with `dropout_p` only in training."""

    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.resid_pdrop)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.attn_pdrop

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.resid_pdrop)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))  # transformers' "gelu": the exact erf GELU


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2LMNoBiasModel(nn.Module):
    """ETHOS-ARES's decoder: token and position embeddings, embedding dropout, the blocks, a final LayerNorm, an LM
    head tied to the token embedding; without labels the logits of the last position only, (B, 1, vocab)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.n_positions, config.n_embd),
                drop=nn.Dropout(config.embd_pdrop),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        self.register_buffer("pos", torch.arange(0, config.n_positions, dtype=torch.long), persistent=False)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids):
        _, t = input_ids.size()
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(self.pos[:t]))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x[:, [-1], :])  # (B, 1, V)


class Inputs(NamedTuple):
    model: GPT2LMNoBiasModel  # as load_model_checkpoint returns it: a module just built, in training mode
    timelines: torch.Tensor  # (patients, T) long: each patient's token timeline
    rep_num: int  # each timeline repeated rep_num times, as the worker does
    compile: dict  # the run's compile mode: the worker compiles the model it loaded (compiles_itself)


def make_inputs(cfg, device):
    sizes = cfg.sizes
    torch.manual_seed(cfg.seed)  # the weights' init draws from the global generator
    config = Config(
        vocab_size=sizes.vocab,
        n_positions=sizes.n_positions,
        n_layer=sizes.n_layer,
        n_head=sizes.n_head,
        n_embd=sizes.n_embd,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
    )
    model = GPT2LMNoBiasModel(config)
    generator = torch.Generator().manual_seed(cfg.seed)
    timelines = torch.randint(0, sizes.vocab, (sizes.patients, sizes.timeline), generator=generator)
    return Inputs(
        model=model.to(device).train(),
        timelines=timelines.to(device),
        rep_num=sizes.rep_num,
        compile={"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")},
    )


def loaded(x):
    """The model as ETHOS's `load_model_checkpoint` hands it to the worker: a module it has just built, whose
    `training` flag is True (every nn.Module starts in training mode), nothing in the repository calls eval(); then
    `model = th.compile(model, disable=no_compile)` as the worker does, where the run compiles."""
    return compile_axis.compiled(x.model.train(), x.compile)


@torch.inference_mode()
def next_token_probs(model, x):
    """ETHOS's worker and `get_next_token` (temperature 1): each timeline repeated `rep_num` times, the logits of its
    last position, their softmax: the distribution its next token is drawn from. (patients, rep_num, vocab)."""
    out = []
    for timeline in x.timelines:
        timeline = timeline[None].repeat(x.rep_num, 1)  # (rep_num, T)
        logits = model(timeline)[:, -1, :]
        out.append(F.softmax(logits, dim=-1))
    return {"probs": torch.stack(out)}


def handed_back(model, out):
    """The evaluation's output and the mode it hands the model back in: ETHOS estimates the loss during training with
    the same model (#20: "as well as during loss estimation while training"), and training goes on from that mode. The
    mode is the compiled model's own module's, which its forward follows: torch 2.4's `torch.compile` wrapper kept its
    `training` True through `.eval()` while the module beneath it was switched (pytorch/pytorch#132986, fixed in 2.5)."""
    return {**out, "training_after": torch.tensor(getattr(model, "_orig_mod", model).training)}


def buggy(x):
    """ETHOS-ARES: under `@th.inference_mode`, the model as loaded, in training mode."""
    model = loaded(x)
    return handed_back(model, next_token_probs(model, x))


def fixed(x):
    """model.eval() once the model is loaded (torchtune #1049's line, what #20 asks for): every nn.Dropout an
    identity, SDPA's `dropout_p` 0; then back to training mode, for the training that goes on."""
    model = loaded(x)
    model.eval()
    try:
        out = next_token_probs(model, x)
    finally:
        model.train()
    return handed_back(model, out)


def reference(x):
    """The forward written out in float64 from the parameters, with no dropout anywhere: embeddings, per block
    LayerNorm, causal softmax attention by hand, the exact GELU by hand, the final LayerNorm, the tied head on the last
    position, the softmax; each patient's distribution repeated rep_num times (in eval mode the repetitions are equal)."""
    p = {name: t.detach().double() for name, t in x.model.named_parameters()}
    cfg = x.model.config
    n_head, hs = cfg.n_head, cfg.n_embd // cfg.n_head

    def layer_norm(h, weight):
        centred = h - h.mean(-1, keepdim=True)
        return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + 1e-5) * weight

    ids = x.timelines
    P, T = ids.shape
    h = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][:T]  # (P, T, C)
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    for i in range(cfg.n_layer):
        pre = f"transformer.h.{i}."
        a = layer_norm(h, p[pre + "ln_1.weight"]) @ p[pre + "attn.c_attn.weight"].T
        q, k, v = (t.reshape(P, T, n_head, hs).transpose(1, 2) for t in a.split(cfg.n_embd, dim=-1))  # (P, nh, T, hs)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(hs)).masked_fill(~causal, -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(P, T, cfg.n_embd)
        h = h + y @ p[pre + "attn.c_proj.weight"].T
        u = layer_norm(h, p[pre + "ln_2.weight"]) @ p[pre + "mlp.c_fc.weight"].T
        h = h + (0.5 * u * (1 + torch.erf(u / math.sqrt(2)))) @ p[pre + "mlp.c_proj.weight"].T
    last = layer_norm(h[:, -1], p["transformer.ln_f.weight"])  # (P, C)
    probs = (last @ p["transformer.wte.weight"].T).softmax(-1)  # (P, V): the head is tied to the token embedding
    return {
        "probs": probs.float()[:, None].expand(P, x.rep_num, cfg.vocab_size),
        "training_after": torch.tensor(True),  # loaded in training mode, handed back in it
    }


def speed_baseline(x):
    """The same inference with nothing to drop: the model as loaded (training mode), every dropout rate 0 for the call,
    as ETHOS's own training.yaml builds it (`dropout: 0`). Not the buggy call: its dropout masks and the attention
    that dropout sends down SDPA's math path cost more than the fix (see Fix)."""
    model = loaded(x)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    attns = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    rates = [m.p for m in dropouts], [m.dropout for m in attns]
    for m in dropouts:
        m.p = 0.0
    for m in attns:
        m.dropout = 0.0
    try:
        return handed_back(model, next_token_probs(model, x))
    finally:
        for m, p in zip(dropouts, rates[0]):
            m.p = p
        for m, p in zip(attns, rates[1]):
            m.dropout = p


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def no_grad_only(x):
    """`torch.no_grad()` around the inference, the model left as loaded: the decorator the thread names, which
    "only disable[s] gradient computation [...] and don't set the model to evaluation mode"
    (https://github.com/ipolharvard/ethos-ares/issues/20); ETHOS already ran under inference_mode."""
    model = loaded(x)
    with torch.no_grad():
        return handed_back(model, next_token_probs(model, x))


def mlp_forward_functional_dropout(self, x):
    """ETHOS's MLP with its dropout written functionally, `F.dropout(x, p)`: the default `training=True` ignores
    `self.training` (https://github.com/facebookresearch/DME/issues/3: "out = F.dropout(out, p=self.args.emb_dropout)
    It seems that this line will trigger dropout during inference")."""
    return F.dropout(self.c_proj(F.gelu(self.c_fc(x))), self.dropout.p)


def eval_with_functional_dropout(x):
    """The fix's eval() and train(), the MLPs calling `F.dropout(x, p)` (the line of
    https://github.com/facebookresearch/DME/issues/3): eval mode does not reach a functional call, whose default is
    `training=True`."""
    model = loaded(x)
    mlps = [block.mlp for block in model.transformer.h]
    for mlp in mlps:
        mlp.forward = mlp_forward_functional_dropout.__get__(mlp)
    model.eval()
    try:
        out = next_token_probs(model, x)
    finally:
        model.train()
        for mlp in mlps:
            del mlp.forward
    return handed_back(model, out)


def attention_forward_unconditional_dropout_p(self, x):
    """ETHOS's attention with `dropout_p=self.dropout`, not `self.dropout if self.training else 0`: SDPA drops
    whenever dropout_p > 0, whatever the module's mode (https://github.com/meta-pytorch/torchtune/pull/1049: "Caveat:
    SPDA dropout is not able to be turned off by `model.eval()`", citing pytorch/pytorch#124464)."""
    B, T, C = x.size()
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(self.n_embd, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout, is_causal=True)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def eval_with_sdpa_dropout_p(x):
    """The fix's eval() and train(), the attention passing its dropout rate to SDPA unconditionally: the caveat of
    https://github.com/meta-pytorch/torchtune/pull/1049, "SPDA dropout is not able to be turned off by `model.eval()`"."""
    model = loaded(x)
    attns = [block.attn for block in model.transformer.h]
    for attn in attns:
        attn.forward = attention_forward_unconditional_dropout_p.__get__(attn)
    model.eval()
    try:
        out = next_token_probs(model, x)
    finally:
        model.train()
        for attn in attns:
            del attn.forward
    return handed_back(model, out)


def eval_never_switched_back(x):
    """model.eval() before the inference and nothing after: the predictions right, the model left in eval mode, so the
    training that goes on runs without dropout (https://github.com/udacity/deep-learning-v2-pytorch/pull/397, the
    review: "The `model.train()` needs to be added back if we're going to use `model.eval()`")."""
    model = loaded(x)
    model.eval()
    return handed_back(model, next_token_probs(model, x))


bad_fixes = {
    "no_grad_only": no_grad_only,
    "eval_with_functional_dropout": eval_with_functional_dropout,
    "eval_with_sdpa_dropout_p": eval_with_sdpa_dropout_p,
    "eval_never_switched_back": eval_never_switched_back,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def one_repetition_at_a_time(x):
    """Correct and careless: model.eval(), then each of the rep_num copies of a timeline through the model alone, a
    batch of 1: rep_num x patients forwards for patients."""
    model = loaded(x)
    model.eval()
    out = []
    with torch.inference_mode():
        for timeline in x.timelines:
            rows = [F.softmax(model(timeline[None])[:, -1, :], dim=-1) for _ in range(x.rep_num)]
            out.append(torch.cat(rows))
    model.train()
    return handed_back(model, {"probs": torch.stack(out)})


slow_fixes = {"one_repetition_at_a_time": one_repetition_at_a_time}
