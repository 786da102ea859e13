"""A model tied on the meta device and materialised with `to_empty()` trains its embedding and LM head apart.

Upstream: https://github.com/pytorch/torchtitan/issues/2252 ("Weight tying not working", francesco-bertolotti,
    2026-01-19, Qwen3 in torchtitan at 09c6d74b; device and torch version not stated): "The weight tying logic would
    work as expected if the model were already materialized on a device. However, at this point the model is still on
    the `meta` device. When materialization later occurs, both `model.output` and `model.tok_embeddings` are
    independently materialized, which breaks the intended weight tying. I verified this by printing
    `self.output.weight` and `self.tok_embeddings.weight` during the forward pass and confirmed that the two tensors
    are different"; "As an experiment, I moved the application of parallelization to occur *after* model
    materialization. With this change, the expected behavior is restored". The tie is `model.output.weight =
    model.tok_embeddings.weight` at the end of `parallelize_qwen3` (torchtitan/models/qwen3/infra/parallelize.py), run
    on the meta model; the trainer then calls `model.to_empty(device=...)` and `model.init_weights(...)`. Its fix,
    https://github.com/pytorch/torchtitan/pull/2253 (merged, commit 4f5512fb, read in torchtitan's history), describes
    computing the tied head functionally from `tok_embeddings.weight` (`F.linear`); as merged it ties in the model's
    `__init__` and again at the end of `init_weights`, in place of the head's init (its loss curves are an image, not
    read here). The same loss elsewhere: https://github.com/Modalities/modalities/issues/357 ("Weight tying breaks with
    meta device initialisation", 2025-04-18): `model.transformer.lm_head.weight is model.transformer.wte.weight`
    printed `False` with `meta_device=true`, two different tensors in the state dict. The fix pattern: re-tie after
    materialising, as https://github.com/huggingface/accelerate/pull/1204 did for loading ("Fix tied weights load",
    sgugger, opened 2023-03-16, merged: "Since loading a checkpoint in a model that was instantiated on the meta
    device recreates the tensors, it breaks the connection between tied weights. This PR fixes that"; accelerate's
    `find_tied_parameters` and `retie_parameters` do it today, the latter fixed in
    https://github.com/huggingface/accelerate/pull/2137), and https://github.com/huggingface/accelerate/pull/3154
    ("Models With Tied Weights Need Re-Tieing After FSDP Param Init", 2024-10-11, merged): with `param_init_fn =
    lambda x: x.to_empty(device=device, recurse=False)`, "`A.to_empty()` is called, then `A.weight` will be reassigned
    to a new tensor. Similarly `B.empty()` is called, and then now `A.weight != B.weight`".

Fidelity: faithful in what fails: the module layout and names of torchtitan's Qwen3 `Transformer` (`tok_embeddings`,
    `layers` of pre-norm blocks with grouped-query attention, RMSNorm on q and k, RoPE from a non-persistent
    `rope_cache` buffer, SwiGLU `feed_forward` w1/w2/w3, the final `norm`, `output` a bias-free Linear), its
    `init_weights` (the rope cache recomputed on the buffer device, `tok_embeddings` normal with std 1, every block's
    linears truncated normal with std 0.02 and the output projections of each block scaled by depth, norms reset, then
    `output` truncated normal with std dim**-0.5 cut at 3 std), and the call order of the trainer: built under
    `torch.device("meta")`, tied at the end of parallelisation (no FSDP/TP here: one process), `to_empty`,
    `init_weights` under no_grad, AdamW over `model.parameters()`, training steps. Synthetic: the sizes (vocab 512,
    dim 64, 2 layers, 4 heads of 16 with 2 KV heads, FFN 192, for Qwen3-0.6B's 151,936 / 1,024 / 28 / 16 of 128 with 8
    / 3,072), the token ids (seeded draws: no data set), 3 AdamW steps (lr 1e-3, betas (0.9, 0.95), weight decay 0.1)
    on batches of 16 sequences of 32 tokens, CPU and float32. The output: every parameter by each of its names after
    the steps, the losses of the steps, the number of distinct parameters the optimizer steps and of their elements,
    and whether `output.weight` is `tok_embeddings.weight`.

Symptom on CUDA: the same, silent: `Module._apply` builds a new Parameter for each module that holds the tied one,
    whatever the target device (not run on a GPU here). torchtitan #2252 shows no log; Modalities #357's, on CUDA:
        model.transformer.lm_head.weight is model.transformer.wte.weight
        False

Symptom on CPU: nothing raises or warns (torch 2.13.0, run here; the same on 2.4.1 to 2.11.0. On 2.3.1 the model
    cannot be built: torchtitan's blocks use `nn.RMSNorm`, which arrived in torch 2.4). After `to_empty` the model
    holds 25 distinct parameters, not 24, and 164,224 parameter elements, not 131,456: `output.weight` is a second
    512 x 64 tensor, the state dict holds two tensors for the two names, and AdamW steps them apart. After
    `init_weights` the embedding holds its normal(0, 1) draw and the head its truncated normal(0, 1/8), where the
    tied model's one tensor holds the latter; after 3 steps every parameter differs from the tied model's: the
    embedding by 8.3x the tied weight's norm, the head by 2%, the first block's attention weights by 14-19%, and the
    losses read 6.69, 6.76, 6.71 for 8.01, 8.14, 7.99.

Cause: `Module.to_empty` is `_apply(lambda t: torch.empty_like(t, device=device))`; a meta tensor and a CPU (or CUDA)
    tensor are not of compatible shallow-copy types, so `_apply` does not set `.data` in place but stores a new
    `Parameter` in each module's `_parameters`, module by module. The one Parameter that `tok_embeddings` and `output`
    shared becomes two, one per module, and nothing ties them again: initialisation, the optimizer and the checkpoint
    see two parameters.

Fix: re-tie after materialising, before initialising and before the optimizer is built: assign the Parameter object
    itself again, `model.output.weight = model.tok_embeddings.weight` (accelerate's `retie_parameters` after #1204,
    transformers' `tie_weights()`). Initialisation then writes the one tensor twice as on a model built on the CPU
    (the head's init last), and AdamW steps one parameter with the summed gradient of both uses. Also correct (the
    alternative in tests/fixes/alternatives/): accelerate's way in general, the tied groups found by name on the meta
    model (`find_tied_parameters`: parameters that are the same object under several names) and each group's names set
    to its first parameter after `to_empty`; graded, it is accepted (1.002x [0.945, 1.063] of `fixed`, torch 2.13.0,
    CPU). torchtitan #2253 as merged (tests/fixes/upstream/, graded) re-ties at the end of `init_weights` instead of
    initialising the head: one parameter, as here, but it keeps the embedding's normal init (std 1) where this
    reference, tied in the constructor, ends with the head's truncated normal (std dim**-0.5, cut at 3 std): another
    initialisation, not a broken tie, rejected by correct (relative error 6.93 over the output after the steps, max
    |diff| 56, the losses apart). The reference is independent of the meta
    device: the same model built on the CPU with the tie (`output.weight = tok_embeddings.weight` in its constructor's
    place), initialised and trained the same way; `correct` compares every parameter by name after the steps, the
    losses, and, exactly, the number of distinct parameters, their elements and the identity of head and embedding.
    Wrong ones, each rejected (figures torch 2.13.0, CPU): re-tying with `.data` (`output.weight.data =
    tok_embeddings.weight.data`, a generic attempt, not from the cited threads): the storage is shared, the parameters
    stay two, so the values stay equal but AdamW steps the one storage twice with two states, each from one use's
    gradient alone (25 parameters; the tied weight 1.3% off after 3 steps, max |diff| 6.9e-3, 34x the tolerance);
    copying the values after init (a generic attempt: `tok_embeddings.weight.copy_(output.weight)`): equal at the
    start, two parameters trained apart (25 parameters; the embedding 1.8% off, the head 1.2%, max |diff| 7.5e-3, 66x
    the tolerance). Its cost: one attribute assignment, and one tensor fewer for AdamW to step: 1.020x [0.985, 1.056]
    of the buggy run eager (torch 2.13.0, this loaded 2-core CPU, one thread; budget 1.15; at 20 s of timing one run
    came out 1.038x [0.849, 1.270] at a batch of 4, undecided, hence `speed.max_s` 60). The slow control, correct: each step's 16
    sequences through the model one at a time, each loss over the batch size backpropagated (the batch's gradient in
    16 forwards and backwards for 1): 2.752x [2.422, 3.127] eager, its low end 2.1x the budget.

Compiled: the model's forward and loss compiled (`compiles_itself`: each call builds its own model), as a user
    `torch.compile`s the model; building on meta, `to_empty`, the tie and the optimizer stay Python around it. The
    same silent result: the parameters are two before anything is compiled (torch 2.13.0, inductor: the same wrong
    numbers as eager; the fix 0.970x [0.821, 1.146] of the buggy run; the slow control 1.754x [1.573, 1.957], its low
    end 1.37x the budget: a compiled forward costs less per sequence than an eager one)."""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from harness import compiled as compile_axis
from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: two parameters where one was tied

# Prose, not a log: nothing is printed. What users write: the tied weights are not tied (not the same tensor, `is`
# False, different values, two copies in the state dict) after a meta-device init / to_empty / materialisation, and
# that they must be re-tied. Not a tie never made by the config (a checkpoint without lm_head), nor "Cannot copy out of
# meta tensor" (a meta tensor used as data), nor tied weights that break sharding or loading.
triage_signs = TriageSigns(
    family="tied weights untied: an embedding and an output head that should share one parameter hold two",
    cause="a model built on the meta device and materialised with to_empty() (or loaded module by module), which gives each module its own new parameter",
    confirm="model.output.weight is not model.tok_embeddings.weight (their data_ptr differ) after to_empty() or a meta-device load; the parameter count is larger by the vocabulary times the width",
    also="a tie made before a layer is replaced or resized (resize_token_embeddings), or a checkpoint holding the two weights apart",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:load\w*|to_empty|meta|sharding|fsdp|checkpoint|state_dict)\b[^\n]{0,80}\b(?:embeddings?|weights?|lm[_ ]head|output (?:layer|projection)|head)\b[^\n]{0,40}\b(?:were|are|is|got|get|became|become|come) (?:not|no longer|un)[- ]?tied\b|\b(?:untied|not tied|no longer tied)\b[^\n]{0,60}\b(?:after|when|once)\b[^\n]{0,40}\b(?:load\w*|to_empty|meta|init\w*|sharding|fsdp)\b",
            0.5,
            "a report in words: tied weights found untied (after loading, init or sharding)",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\b(?:word |token )?(?:embs?|embeddings?|weights?) (?:are|is|were) tied\b[^.?!]{0,40}\b(?:lm[_ ]head|head|output)\b[^.?!]{0,40}\b(?:copied|duplicated|separated|untied|wrong value)",
            0.45,
            "tied embeddings whose LM head ends up a copy",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:weight[- ]?tying|tied (?:weights?|embeddings?|parameters?|params?)|tie[_ ]weights?|weight sharing|shared weights?)\b.{0,80}\b(?:not (?:working|preserved|tied|kept|shared|the same)|is(?:n't| not) (?:working|preserved)|breaks?|broken|lost|no longer)|\b(?:undo(?:es)?|undid|breaks?|broke|loses|lost) (?:the |our |my )?(?:weight[- ]?tying|tied weights|tie)\b|\bweights? (?:is|are|was|were|stays?|remain) (?:not|no longer|un)[- ]?tied\b",
            0.45,
            "the tie between embedding and head is lost",
        ),
        Sign(
            "failure",
            r"(?i)(?:independently|separately) materiali[sz]ed|recreates the tensors|breaks? the (?:connection|link|tie) between (?:the )?tied|stops? aliasing|no longer alias(?:es|ing)?\b|(?:relationship|connection|link|tie) between (?:the )?(?:tied )?weights (?:getting |gets |got |is |was )?lost|(?:lm_head|head|output)\S* (?:is|are) not (?:the same (?:tensor|object|parameter) as|aliasing)",
            0.5,
            "head and embedding are two tensors after materialising",
        ),
        Sign(
            "failure",
            r"(?i)\bre-?ti(?:e|ing)\b.{0,60}\b(?:after|once)\b.{0,40}\b(?:to_empty|materiali[sz]\w*|param_init_fn|init(?:iali[sz]\w*)?|load\w*)|need re-?tie?ing",
            0.4,
            "the weights have to be tied again after materialising",
        ),
        Sign(
            "failure",
            r"(?i)\btied (?:embeddings?|weights?|param(?:eter)?s?)\b|\bshared param(?:eter)?s?\b|权重绑定|绑定的权重|共享参数",
            0.5,
            "a report in words, in any language: tied weights, materialised (to_empty, the meta device), found two objects or stale",
            family=True,
            near=(
                r"(?i)\bto_empty\b|materiali[sz]\w*|\bmeta[ _]device|init_device=\W?meta\b|物化",
                r"(?i)\bstale\b|no longer the same|not the same (?:object|parameter|tensor)|\.weight is not \S+\.weight|不再是同一个|不是同一个|对象会变化|解绑",
            ),
        ),
        Sign(
            "failure",
            r"(?i)\btied?[_ ](?:weights?|embeddings?|word_embeddings)\b|\bweight[- ]tying\b",
            0.5,
            "a report in words: tied weights found two separate parameters (after loading or materialising)",
            family=True,
            near=(
                r"(?i)\btwo (?:separate |independent |different |distinct )?(?:weights|parameters|params|copies|tensors|objects)\b|\bseparate (?:nn\.)?Parameter objects\b|\bindependently per key\b",
            ),
        ),
        Sign(
            "context",
            r"(?i)\bmeta[ _]device|device=?\(?[\"']meta[\"']|torch\.device\([\"']meta[\"']\)|to_empty|init_empty_weights|low_cpu_mem_usage|param_init_fn|materiali[sz]",
            0.35,
            "a model built on the meta device and materialised",
        ),
        Sign(
            "support",
            r"(?i)tok_embeddings|embed_tokens|\bwte\b|lm_head|output\.weight|tie_word_embeddings|enable_weight_tying|weight_tying",
            0.15,
            "an input embedding and an output head",
        ),
        Sign(
            "veto",
            r"(?i)Cannot copy out of meta tensor|Missing key\(s\)|Unexpected key\(s\)|size mismatch for|find_tied_parameters`? miss|shared parameters",
            0,
            "another meta-device or tied-weight failure: a meta tensor used as data, a load that fails, sharding refusing shared parameters",
        ),
    ),
)

compiled_unit = (
    "the model's forward and loss, `torch.compile` of the model as a user compiles it (compiles_itself: each call builds, "
    "materialises and ties its own model); building on meta, `to_empty`, the tie, the init and the optimizer are Python "
    "around it, and the parameters are two before anything is compiled"
)
compiles_itself = True


# -- torchtitan's Qwen3 Transformer (torchtitan/models/qwen3/model/model.py), small -------------------------------


def precompute_rope_cache(head_dim, max_seq_len, theta):
    """cos and sin of RoPE's angles, (max_seq_len, head_dim), concatenated as torchtitan's Qwen3 keeps them."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len).float(), freqs)  # (T, head_dim / 2)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x, rope_cache):
    """x (B, T, H, D) rotated by halves (rotate_half), as Qwen3 does."""
    T, half = x.shape[1], x.shape[-1] // 2
    cos, sin = rope_cache[:T, :half], rope_cache[:T, half:]
    cos, sin = torch.cat([cos, cos], -1)[None, :, None], torch.cat([sin, sin], -1)[None, :, None]
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)

    def init_weights(self, init_std):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=init_std)
        self.q_norm.reset_parameters()
        self.k_norm.reset_parameters()

    def forward(self, x, rope_cache):
        B, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(B, T, self.n_heads, self.head_dim))
        k = self.k_norm(self.wk(x).view(B, T, self.n_kv_heads, self.head_dim))
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, rope_cache), apply_rope(k, rope_cache)
        repeat = self.n_heads // self.n_kv_heads  # grouped-query attention
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))  # (B, T, dim)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def init_weights(self, init_std):
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=0.02)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=init_std)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id, args):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5  # depth_init

    def init_weights(self):
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        self.attention.init_weights(self.weight_init_std)
        self.feed_forward.init_weights(self.weight_init_std)

    def forward(self, x, rope_cache):
        h = x + self.attention(self.attention_norm(x), rope_cache)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """torchtitan's Qwen3 `Transformer`: no tie in the constructor; `parallelize_qwen3` ties it afterwards."""

    def __init__(self, args):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("rope_cache", precompute_rope_cache(args.head_dim, args.max_seq_len, args.rope_theta), persistent=False)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def init_weights(self, buffer_device):
        """torchtitan's `init_weights`: the rope cache on the buffer device, then each module, the head last."""
        with torch.device(buffer_device):
            self.rope_cache = precompute_rope_cache(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta)
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        self.norm.reset_parameters()
        final_out_std = self.args.dim**-0.5
        cutoff_factor = 3
        nn.init.trunc_normal_(
            self.output.weight, mean=0.0, std=final_out_std, a=-cutoff_factor * final_out_std, b=cutoff_factor * final_out_std
        )

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)  # (B, T, dim)
        for layer in self.layers.values():
            h = layer(h, self.rope_cache)
        return self.output(self.norm(h))  # (B, T, vocab)


class ModelArgs(NamedTuple):
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    max_seq_len: int
    norm_eps: float
    rope_theta: float


class Inputs(NamedTuple):
    args: ModelArgs
    batches: torch.Tensor  # (steps, batch, seq_len + 1) token ids: each step's inputs and shifted labels
    device: str
    seed: int
    lr: float
    weight_decay: float
    compile: dict


def make_inputs(cfg, device):
    sizes = cfg.sizes
    args = ModelArgs(
        vocab_size=sizes.vocab,
        dim=sizes.dim,
        n_layers=sizes.n_layers,
        n_heads=sizes.n_heads,
        n_kv_heads=sizes.n_kv_heads,
        head_dim=sizes.head_dim,
        hidden_dim=sizes.hidden_dim,
        max_seq_len=sizes.seq_len,
        norm_eps=1e-6,
        rope_theta=1000000.0,
    )
    generator = torch.Generator().manual_seed(cfg.seed)
    batches = torch.randint(0, sizes.vocab, (sizes.steps, sizes.batch, sizes.seq_len + 1), generator=generator)
    return Inputs(
        args=args,
        batches=batches.to(device),
        device=str(device),
        seed=cfg.seed,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        compile={"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")},
    )


def tie(model):
    """`parallelize_qwen3`'s last lines with `enable_weight_tying`: the head's Parameter is the embedding's."""
    model.output.weight = model.tok_embeddings.weight


def on_meta(x):
    """The trainer's build: the model under `torch.device("meta")`, then parallelised (here: tied)."""
    with torch.device("meta"):
        model = Transformer(x.args)
    tie(model)
    return model


def initialise(model, x):
    """`init_weights` under no_grad, from the seed, on the device's buffers."""
    torch.manual_seed(x.seed)
    with torch.no_grad():
        model.init_weights(buffer_device=x.device)
    return model


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def train(model, x, step=None):
    """AdamW over `model.parameters()` (what the trainer builds after init), one step per batch; `step(model,
    criterion, tokens)` computes the gradients and returns the loss (default: one forward and backward)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=x.lr, betas=(0.9, 0.95), weight_decay=x.weight_decay)
    criterion = compile_axis.under(x.compile["compile"], loss_of, kernel_threads=x.compile["kernel_threads"])
    losses = []
    for tokens in x.batches:
        optimizer.zero_grad()
        if step is None:
            loss = criterion(model, tokens)
            loss.backward()
        else:
            loss = step(model, criterion, tokens)
        optimizer.step()
        losses.append(loss.detach())
    return trained(model, losses)


def trained(model, losses):
    """Every parameter by each of its names (a tied one under both), the losses, how many distinct parameters the
    optimizer stepped and of how many elements, and whether the head's weight is the embedding's."""
    distinct = {id(p): p for p in model.parameters()}
    return {
        "param": {name: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)},
        "loss": torch.stack(losses),
        "distinct_parameters": torch.tensor(len(distinct)),
        "parameter_elements": torch.tensor(sum(p.numel() for p in distinct.values())),
        "head_is_embedding": torch.tensor(model.output.weight is model.tok_embeddings.weight),
    }


def buggy(x):
    """torchtitan at 09c6d74b: tied on meta, `to_empty`, `init_weights`, the optimizer: two parameters."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    return train(initialise(model, x), x)


def fixed(x):
    """Re-tied after `to_empty`, before `init_weights` and the optimizer: the head's Parameter is the embedding's again."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    tie(model)
    return train(initialise(model, x), x)


def reference(x):
    """No meta device: the model built on the device with its parameters, tied there, initialised and trained the
    same way, eager."""
    with torch.device(x.device):
        model = Transformer(x.args)
    model.output.weight = model.tok_embeddings.weight
    torch.manual_seed(x.seed)
    with torch.no_grad():
        model.init_weights(buffer_device=x.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=x.lr, betas=(0.9, 0.95), weight_decay=x.weight_decay)
    losses = []
    for tokens in x.batches:
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return trained(model, losses)


def speed_baseline(x):
    """The buggy run: the same build, init and steps with the head untied (what the fix's cost is against)."""
    return buggy(x)


# -- bad fixes: plausible, each wrong ------------------------------------------------------------------------


def retie_data(x):
    """`model.output.weight.data = model.tok_embeddings.weight.data` after `to_empty` (a generic attempt): one storage,
    two parameters, two optimizer states; the step is applied to the storage once per parameter."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    model.output.weight.data = model.tok_embeddings.weight.data
    return train(initialise(model, x), x)


def copy_values_after_init(x):
    """`tok_embeddings.weight.copy_(output.weight)` after `init_weights` (a generic attempt): the same values at the
    start, two parameters trained apart."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    initialise(model, x)
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(model.output.weight)
    return train(model, x)


bad_fixes = {"retie_data": retie_data, "copy_values_after_init": copy_values_after_init}


# -- slow fixes: correct, slower than the budget allows -------------------------------------------------------


def one_sequence_at_a_time(x):
    """Correct and careless: re-tied as the fix, then each step's sequences through the model one at a time, each
    sequence's mean loss over the batch size backpropagated: the batch's gradient, in `batch` forwards and backwards."""
    model = on_meta(x)
    model.to_empty(device=x.device)
    tie(model)

    def step(model, criterion, tokens):
        total = 0.0
        for sequence in tokens.split(1):
            loss = criterion(model, sequence) / len(tokens)
            loss.backward()
            total = total + loss.detach()
        return total

    return train(initialise(model, x), x, step)


slow_fixes = {"one_sequence_at_a_time": one_sequence_at_a_time}
