"""A padded query row of attention is fully masked: its softmax is NaN, and so is the backward.

Upstream: https://github.com/dmlc/dgl/issues/2657 ("The paddings in multihead attention model", lsyysl9711,
    2021-02-13, labels bug and triage; DGL 0.6): "When I use set_transformer model on graphs implemented by DGL, the
    model will output NaN just after one training epoch." DGL's `MultiHeadAttention` (python/dgl/nn/pytorch/glob.py)
    packs each graph's nodes into a padded batch and masks with -inf every score whose query or key is padding, so
    "the rows consist of only zeros will consist of "-inf" only. When these rows are sent to softmax function later,
    they will generate many rows consist of "NaN"". Fixed by DGL in PR #2658 (commit 174dd18, "[hotfix] A bunch of fix
    for SetTransformer", 2021-02-23). The same rows in PyG: https://github.com/pyg-team/pytorch_geometric/issues/7899
    ("SetTransformerAggregation returns `nan` for an unconnected node", torch.nn.MultiheadAttention over an empty set),
    fixed in https://github.com/pyg-team/pytorch_geometric/pull/7902 by `x = x.nan_to_num()` on the output (a bad fix
    here, below). In PyTorch: https://github.com/pytorch/pytorch/issues/41508 (nn.MultiheadAttention's NaN gradients
    from fully masked rows, open), https://github.com/pytorch/pytorch/issues/160064 (need_weights=True still NaN).

Fidelity: faithful in the function that fails: DGL 0.6's `MultiHeadAttention` at the commit before 174dd18 (the
    projections, `pad_packed_tensor` of queries, keys and values, the einsum scores, `masked_fill_` with -inf,
    softmax, the einsum with the values, `pack_padded_tensor`, the two layer norms and the FFN; the unused `dropa`
    kept), DGL's `pad_packed_tensor` / `pack_padded_tensor` of dgl.backend.pytorch (copied, so that DGL need not be
    installed), and the readout it was used in: the SetTransformerEncoder's set attention blocks, then the
    SetTransformerDecoder's PMA layer and set attention block. Changed, none of it in the failing lines: the masking,
    softmax and weighted sum are passed in (`attend`), so buggy and fixed differ in that one function; the mask is
    built by DGL's own `_gen_mask` of the fix's commit (the same mask as the loop over the graphs it replaced,
    vectorised); and the helpers take the maximum and the sum of the lengths from the Python list rather than by a
    tensor round trip (`.item()`). The last two because compiled, the loop and the round trips took minutes to
    compile on this CPU (170 s for the buggy step with the loop and the graph breaks, 95 s without). Synthetic: the
    sizes (the thread gives none: 32 graphs of 8 to 40 nodes, the sizes of small molecules, d_model 64, 4 heads of
    16, FFN 128, 2 encoder and 1 decoder blocks, 4 seed vectors), the node features, the linear head to one property
    per graph, the targets and the MSE loss (seeded draws), all stand-ins for the user's training, whose code the
    thread does not publish. The stored copy of the thread holds its description only (truncated at "And we need to
    mult"); the fix is read from DGL's commit.

Symptom on CUDA: the same NaN gradients, nothing device-specific (not run here: no GPU in this task). The thread
    prints no log; its words:
        the model will output NaN just after one training epoch.

Symptom on CPU: nothing raises and nothing is printed (torch 2.13.0, 2.9.1, 2.6.0 and 2.4.1, run here: the same on
    each, the softmax is DGL's own). The predictions and the loss are finite and right (the padded rows are dropped
    by `pack_padded_tensor` before anything reads them); of the 55 parameter gradients, 14 are NaN (41408 elements):
    every one of the first encoder block, and the second block's proj_v and proj_o, whose backward multiplies the
    padded rows' NaN weights by their zero gradient. The optimizer step then writes NaN into those weights, and the
    next forward outputs NaN: the thread's "NaN just after one training epoch". Compiled (inductor, torch 2.13.0):
    the same 14 NaN gradients. The step takes minutes to compile on this loaded CPU (a cold compile outlasted the
    harness's 300 s phase timeout), so its record ran with `timeout_s=900` on a warm kernel cache: speed 1.050x
    [0.863, 1.278], the slow control 6.965x [4.393, 11.043] (its loop eager under `torch.compiler.disable`).
    PyTorch's own attention, measured here on the same fully masked rows (tests/test_attention_fully_masked_rows.py):
    `F.scaled_dot_product_attention` returns NaN on torch 2.4.1 and zeros (finite gradients) on 2.6.0, 2.9.1 and 2.13.0
    (2.5 not run); `nn.MultiheadAttention` with `key_padding_mask` masking a whole sequence returns NaN with the
    default `need_weights=True` on all four, and with `need_weights=False` NaN on 2.4.1, zeros in training and NaN in
    eval (the fast path) on 2.6.0, 2.9.1 and 2.13.0.

Cause: a padded query row has every score masked to -inf, so its softmax is exp(-inf) / sum(exp(-inf)) = 0/0 = NaN.
    The row's output is dropped before the loss, so the forward is right, but the backward of the weighted sum
    multiplies the NaN weights by the row's zero gradient (0 x NaN = NaN) and adds it into the values' gradient, and
    from there into every parameter before it.

Fix: DGL's (#2658, "the following line addresses the NaN issue, see https://github.com/dmlc/dgl/issues/2657"):
    `alpha = alpha.masked_fill(mask == 0, 0.)` after the softmax: a fully masked row's weights become 0, and in the
    backward the masked_fill stops the NaN (its gradient is 0 where it filled). Also correct (the alternative in
    tests/fixes/alternatives/): unmask one key in every fully masked row, so that no softmax row is empty (transformers' `_unmask_unattended`
    does the same for SDPA, https://github.com/huggingface/transformers/pull/26572; graded: accepted, 0.942x
    [0.804, 1.103] against the buggy code).
    The reference is independent of both: float64, one graph at a time with no padding and so no mask, the attention
    written apart from DGL's module with the same parameters, one `torch.autograd.grad`; `correct` compares the
    predictions, the loss, all 55 gradients and the count of non-finite gradient elements (0 for the reference,
    41408 for the buggy code).
    Wrong ones, each rejected: `nan_to_num` of each attention's output, after PyG's merged fix
    (https://github.com/pyg-team/pytorch_geometric/pull/7902): the output rows it zeroes were dropped anyway, 13
    gradients stay NaN (37312 elements); PyG's fix as written (commit deff5a46: one `x = x.nan_to_num()` after the
    decoder blocks, tests/fixes/upstream/), graded: the decoders' output holds no NaN (the padded rows were packed
    away), so all 14 NaN gradients (41408 elements) stay, the buggy code's. It mends PyG's own symptom, the NaN
    output of an empty set (#7899), which this readout, every graph with nodes, does not have; filling the mask
    with -1e-9 instead of -inf
    (https://github.com/sooftware/kospeech/issues/37: "Using `-1e-9` in `masked_fill_`: False"): no NaN, but -1e-9 is
    almost 0, not a large negative number, so every node attends to its graph's padding: the predictions 294% off the
    reference's norm, all 55 gradients off (265% together); `nan_to_num` of the gradients (a generic attempt): the 14
    become 0, 100% of each off (21% of all 55 together), and the first encoder block stops learning.
    Its cost: one masked_fill on the weights against the buggy step on the same padded batch: 1.062x [0.789, 1.429]
    eager (torch 2.13.0, this loaded 2-core CPU; budget 1.5). The slow control, correct: the readout run on one graph
    at a time (a Python loop over the batch's 32 graphs, no padding; marked `torch.compiler.disable`): 6.532x
    [4.857, 8.785] eager (its interval's low end 3.2x the budget, 1.3x asked).
"""

from typing import NamedTuple

import numpy as np
import torch
import torch.nn as th_nn

from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: the loss is right, the gradients NaN

# A silent failure: what users post is NaN outputs, losses or gradients with a padding mask in the code, where a whole
# row (a padded sequence, an empty set, a causal row with nothing before it) is masked: softmax over only -inf. Not NaN
# from fp16 overflow, a learning rate, or a where's untaken branch.
triage_signs = TriageSigns(
    needs_context=True,
    family="NaN from attention whose mask leaves a row with no key",
    cause="a fully masked row of an attention mask (a padded query, an empty sequence or set): softmax over only -inf is 0/0",
    confirm="a batch element or query row whose mask hides every key (all padding, no neighbours, an empty set); the NaN sits in those rows' attention weights",
    also="fp16 overflow in the scores, a mask of the wrong polarity (True meaning keep), or NaN already in the inputs give NaN attention too",
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:masked_fill\w*|mask\w*|fill\w*)\b[^\n]{0,80}['\"`]? ?-(?:np\.|math\.|float\(['\"])?inf\b[^\n]{0,80}\bnan\b|\bmask\w*\b[^\n]{0,80}\b(?:sdpa|scaled_dot_product_attention|attention|softmax)\b[^\n]{0,80}\bnan\b",
            0.5,
            "a report in words: an attention mask (filled with -inf) giving NaN",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\b(?:fully|entirely|completely|all)[- ](?:masked|padded)\b|\b(?:whole|entire) (?:input|sequence|row|set) is (?:masked|padded)|\bfull of (?:<pad>|True|padding)|\brows? (?:that )?(?:consist|are made) (?:of )?(?:only )?(?:-inf|zeros)|\battends? to (?:nothing|no key)|unattended (?:rows?|tokens?)\b|_unmask_unattended\b|\bzero[- ]length sequences?\b|\bempty (?:sequence|set|scene|graph)s?\b|\b(?:unconnected|isolated|disconnected) nodes?\b",
            0.45,
            "a row of the mask that hides every key: a padded or empty sequence",
        ),
        Sign(
            "failure",
            r"(?i)\bsoftmax\b.{0,80}\b(?:-inf|inf)\b.{0,80}\bnan\b|\b(?:-inf|inf)\b.{0,80}\bsoftmax\b.{0,80}\bnan\b|\bnan\b.{0,60}\bsoftmax\b.{0,40}-inf",
            0.4,
            "softmax over -inf scores gives NaN",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:key_padding_mask|src_key_padding_mask|attn_mask|padding[_ ]mask|attention[_ ]mask)\b.{0,200}\bnan\b|\bnan\b.{0,200}\b(?:key_padding_mask|src_key_padding_mask|padding[_ ]mask)\b",
            0.3,
            "NaN with an attention or padding mask",
        ),
        Sign(
            "failure",
            r"(?i)\bnans?\b",
            0.5,
            "a report in words: NaN from attention where a whole row is masked",
            family=True,
            near=(
                r"(?i)\b(?:attention|attn|softmax|MultiheadAttention|scaled_dot_product_attention|SDPA)\b",
                r"(?i)\b(?:all|entire|whole|fully|every|completely)\b[^.]{0,30}\b(?:masked|padd\w*|-inf)\b|\b(?:masked|padd\w*)\b[^.]{0,30}\b(?:all|entire|whole|fully|every|completely)\b|\bempty (?:rows?|sequences?|masks?)\b|\bno (?:valid |unmasked )?(?:keys?|tokens?|positions?)\b",
            ),
        ),
        Sign(
            "context",
            r"(?i)\bMultihead ?Attention\b|\bscaled_dot_product_attention\b|\bSDPA\b|\bsdpa_mask\b|\bTransformer(?:Encoder|Decoder)(?:Layer)?\b|\bmasked_fill_?\(.{0,60}-(?:float\(['\"]inf['\"]\)|np\.inf|inf)|\bsoftmax\(",
            0.35,
            "attention with a mask filled with -inf",
        ),
        Sign(
            "support",
            r"(?i)\bpad(?:ded|ding)?\b.{0,80}\bnan\b|\bnan\b.{0,80}\bpad(?:ded|ding)?\b",
            0.1,
            "NaN near padding",
        ),
        Sign(
            "veto",
            r"(?i)GradScaler|found_inf|\boverflow\w*\b|\bnan values? in (?:the |my )?inputs?\b|\bwhere\b.{0,60}\buntaken\b",
            0,
            "NaN from an overflow (fp16 scores, a loss scaler), NaN already in the inputs, or a where's untaken branch rather than a fully masked row",
        ),
    ),
)

compiled_unit = (
    "a training step of the set-transformer readout as a user compiles it: the encoder's set attention blocks over a "
    "padded batch of graphs, the pooling decoder, the prediction head, the loss and its backward"
)


# -- DGL's code (python/dgl/backend/pytorch/tensor.py and nn/pytorch/glob.py before 174dd18, #2658) --------------------


def pad_packed_tensor(input, lengths, value):
    """dgl.backend.pytorch's `pad_packed_tensor` (lengths a list): (sum(lengths), ...) -> (batch, max_len, ...)."""
    old_shape = input.shape
    device = input.device
    max_len = max(lengths)  # DGL: as_scalar(lengths.max()) of the tensor below; the list's max, without a graph break
    lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
    batch_size = len(lengths)
    x = input.new(batch_size * max_len, *old_shape[1:])
    x.fill_(value)
    index = torch.ones(len(input), dtype=torch.int64, device=device)
    cum_lengths = torch.cumsum(lengths, 0)
    index[cum_lengths[:-1]] += max_len - lengths[:-1]
    index = torch.cumsum(index, 0) - 1
    x[index] = input
    return x.view(batch_size, max_len, *old_shape[1:])


def pack_padded_tensor(input, lengths):
    """dgl.backend.pytorch's `pack_padded_tensor`: (batch, max_len, ...) -> (sum(lengths), ...), the padding dropped."""
    max_len = input.shape[1]
    device = input.device
    out_len = sum(lengths)  # DGL: lengths.sum().item() of the tensor below; the list's sum, without a graph break
    lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
    input = input.view(-1, *input.shape[2:])
    index = torch.ones(out_len, dtype=torch.int64, device=device)
    cum_lengths = torch.cumsum(lengths, 0)
    index[cum_lengths[:-1]] += max_len - lengths[:-1]
    index = torch.cumsum(index, 0) - 1
    return input[index]


def _gen_mask(lengths_x, lengths_y, max_len_x, max_len_y, device):
    """DGL's `_gen_mask` (#2658, with the lengths as lists): the same mask as the loop over the graphs it replaced, 1
    where both the query and the key are a real node; (batch, 1, max_len_x, max_len_y)."""
    lengths_x = torch.tensor(lengths_x, dtype=torch.int64, device=device)
    lengths_y = torch.tensor(lengths_y, dtype=torch.int64, device=device)
    x_mask = torch.arange(max_len_x, device=device).unsqueeze(0) < lengths_x.unsqueeze(1)
    y_mask = torch.arange(max_len_y, device=device).unsqueeze(0) < lengths_y.unsqueeze(1)
    return (x_mask.unsqueeze(-1) & y_mask.unsqueeze(-2)).unsqueeze(1)


def attend_buggy(e, mask, values):
    """DGL's masking and softmax before #2658, verbatim: a padded query row has every score -inf, so its softmax is 0/0."""
    e.masked_fill_(mask == 0, -float("inf"))
    # apply softmax
    alpha = torch.softmax(e, dim=-1)
    # sum of value weighted by alpha
    return torch.einsum("bhxy,byhd->bxhd", alpha, values)


def attend_fixed(e, mask, values):
    """DGL's fix (#2658, "the following line addresses the NaN issue"): the masked weights set to 0 after the softmax,
    which makes a fully masked row 0 and, in the backward, stops the NaN at the masked_fill."""
    e = e.masked_fill(mask == 0, -float("inf"))
    alpha = torch.softmax(e, dim=-1)
    alpha = alpha.masked_fill(mask == 0, 0.0)
    return torch.einsum("bhxy,byhd->bxhd", alpha, values)


class MultiHeadAttention(th_nn.Module):
    """DGL's `MultiHeadAttention` (dgl.nn.pytorch.glob, 0.6), verbatim but for `attend`: the masking, softmax and
    weighted sum, passed in so that buggy and fixed share every other line."""

    def __init__(self, d_model, num_heads, d_head, d_ff, dropouth=0.0, dropouta=0.0):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_head = d_head
        self.d_ff = d_ff
        self.proj_q = th_nn.Linear(d_model, num_heads * d_head, bias=False)
        self.proj_k = th_nn.Linear(d_model, num_heads * d_head, bias=False)
        self.proj_v = th_nn.Linear(d_model, num_heads * d_head, bias=False)
        self.proj_o = th_nn.Linear(num_heads * d_head, d_model, bias=False)
        self.ffn = th_nn.Sequential(th_nn.Linear(d_model, d_ff), th_nn.ReLU(), th_nn.Dropout(dropouth), th_nn.Linear(d_ff, d_model))
        self.droph = th_nn.Dropout(dropouth)
        self.dropa = th_nn.Dropout(dropouta)
        self.norm_in = th_nn.LayerNorm(d_model)
        self.norm_inter = th_nn.LayerNorm(d_model)
        for p in self.parameters():
            if p.dim() > 1:
                th_nn.init.xavier_uniform_(p)

    def forward(self, x, mem, lengths_x, lengths_mem, attend):
        batch_size = len(lengths_x)
        max_len_x = max(lengths_x)
        max_len_mem = max(lengths_mem)

        queries = self.proj_q(x).view(-1, self.num_heads, self.d_head)
        keys = self.proj_k(mem).view(-1, self.num_heads, self.d_head)
        values = self.proj_v(mem).view(-1, self.num_heads, self.d_head)

        # padding to (B, max_len_x/mem, num_heads, d_head)
        queries = pad_packed_tensor(queries, lengths_x, 0)
        keys = pad_packed_tensor(keys, lengths_mem, 0)
        values = pad_packed_tensor(values, lengths_mem, 0)

        # attention score with shape (B, num_heads, max_len_x, max_len_mem)
        e = torch.einsum("bxhd,byhd->bhxy", queries, keys)
        # normalize
        e = e / np.sqrt(self.d_head)

        # generate mask
        mask = _gen_mask(lengths_x, lengths_mem, max_len_x, max_len_mem, e.device)

        out = attend(e, mask, values)  # (B, max_len_x, num_heads, d_head)
        # project to output
        out = self.proj_o(out.contiguous().view(batch_size, max_len_x, self.num_heads * self.d_head))
        # pack tensor
        out = pack_padded_tensor(out, lengths_x)

        # intra norm
        x = self.norm_in(x + out)
        # inter norm
        x = self.norm_inter(x + self.ffn(x))
        return x


class PMALayer(th_nn.Module):
    """DGL's `PMALayer` (pooling by multihead attention): `k` seed vectors attend to each graph's nodes."""

    def __init__(self, k, d_model, num_heads, d_head, d_ff):
        super().__init__()
        self.k = k
        self.seed_vectors = th_nn.Parameter(torch.empty(k, d_model))
        self.mha = MultiHeadAttention(d_model, num_heads, d_head, d_ff)
        self.ffn = th_nn.Sequential(th_nn.Linear(d_model, d_ff), th_nn.ReLU(), th_nn.Dropout(0.0), th_nn.Linear(d_ff, d_model))
        th_nn.init.xavier_uniform_(self.seed_vectors)

    def forward(self, feat, lengths, attend):
        batch_size = len(lengths)
        query = self.seed_vectors.repeat(batch_size, 1)
        return self.mha(query, self.ffn(feat), [self.k] * batch_size, lengths, attend)


class SetTransformerReadout(th_nn.Module):
    """DGL's SetTransformerEncoder (SAB blocks) then SetTransformerDecoder (PMA, SAB blocks), as a graph readout, and a
    linear head to one property per graph (the head is synthetic)."""

    def __init__(self, s):
        super().__init__()
        self.k = s.seeds
        self.d_model = s.d_model
        self.encoder = th_nn.ModuleList(MultiHeadAttention(s.d_model, s.heads, s.d_head, s.d_ff) for _ in range(s.enc_layers))
        self.pma = PMALayer(s.seeds, s.d_model, s.heads, s.d_head, s.d_ff)
        self.decoder = th_nn.ModuleList(MultiHeadAttention(s.d_model, s.heads, s.d_head, s.d_ff) for _ in range(s.dec_layers))
        self.head = th_nn.Linear(s.seeds * s.d_model, 1)

    def forward(self, feat, lengths, attend):
        for sab in self.encoder:  # SetAttentionBlock: self.mha(feat, feat, lengths, lengths)
            feat = sab(feat, feat, lengths, lengths, attend)
        batch_size = len(lengths)
        feat = self.pma(feat, lengths, attend)
        for sab in self.decoder:
            feat = sab(feat, feat, [self.k] * batch_size, [self.k] * batch_size, attend)
        return self.head(feat.view(batch_size, self.k * self.d_model)).squeeze(-1)


class Inputs(NamedTuple):
    model: SetTransformerReadout
    feat: torch.Tensor  # (sum(lengths), d_model) the node features of the batch, packed as DGL batches them
    lengths: list  # nodes per graph (graph.batch_num_nodes())
    target: torch.Tensor  # (graphs,) one property per graph


def make_inputs(cfg, device):
    s = cfg.sizes
    g = torch.Generator().manual_seed(cfg.seed)
    lengths = torch.randint(s.min_nodes, s.max_nodes + 1, (s.graphs,), generator=g).tolist()
    torch.manual_seed(cfg.seed)
    model = SetTransformerReadout(s).to(device)
    feat = torch.randn(sum(lengths), s.d_model, generator=g).to(device)
    target = torch.randn(s.graphs, generator=g).to(device)
    return Inputs(model, feat, lengths, target)


def outputs(pred, loss, grads):
    """The predictions (every graph's, from valid rows only), the loss, every parameter's gradient by name, and the
    count of non-finite gradient elements (an integer: compared exactly)."""
    return {
        "pred": pred.detach(),
        "loss": loss.detach(),
        "grad": {name: gr.detach() for name, gr in grads.items()},
        "nonfinite_grads": sum((~torch.isfinite(gr)).sum() for gr in grads.values()),
    }


def train_step(x, attend, grads=None):
    """One step's forward, MSE loss and backward through the readout with `attend`; `grads` post-processes the
    gradients (a bad fix's)."""
    names, params = zip(*x.model.named_parameters())
    pred = x.model(x.feat, x.lengths, attend)
    loss = torch.nn.functional.mse_loss(pred, x.target)
    values = torch.autograd.grad(loss, params)
    if grads is not None:
        values = [grads(v) for v in values]
    return outputs(pred, loss, dict(zip(names, values)))


def buggy(x):
    """DGL's set transformer before #2658: the padded rows' NaN in the backward."""
    return train_step(x, attend_buggy)


def fixed(x):
    """DGL's set transformer after #2658: the masked weights zeroed after the softmax."""
    return train_step(x, attend_fixed)


def reference(x):
    """Float64, one graph at a time, no padding and so no mask: each graph's nodes attend to its own nodes (and the
    seeds to them), written apart from DGL's module with the same parameters; one autograd.grad; then float32."""
    names, params = zip(*x.model.named_parameters())
    p = {name: q.detach().double().requires_grad_() for name, q in zip(names, params)}
    feat = x.feat.double()

    def mha(prefix, xq, mem):
        def lin(name, t):
            return t @ p[f"{prefix}.{name}.weight"].T

        def ffn(t):
            h = torch.relu(t @ p[f"{prefix}.ffn.0.weight"].T + p[f"{prefix}.ffn.0.bias"])
            return h @ p[f"{prefix}.ffn.3.weight"].T + p[f"{prefix}.ffn.3.bias"]

        def norm(name, t):
            return torch.nn.functional.layer_norm(t, t.shape[-1:], p[f"{prefix}.{name}.weight"], p[f"{prefix}.{name}.bias"])

        m = x.model.encoder[0]
        h, d = m.num_heads, m.d_head
        q = lin("proj_q", xq).view(-1, h, d).transpose(0, 1)  # (h, n_q, d)
        k = lin("proj_k", mem).view(-1, h, d).transpose(0, 1)
        v = lin("proj_v", mem).view(-1, h, d).transpose(0, 1)
        w = torch.softmax(q @ k.transpose(1, 2) / d**0.5, dim=-1)  # (h, n_q, n_mem): every key a real node
        out = lin("proj_o", (w @ v).transpose(0, 1).reshape(len(xq), h * d))
        y = norm("norm_in", xq + out)
        return norm("norm_inter", y + ffn(y))

    preds = []
    for graph in feat.split(x.lengths):
        for i in range(len(x.model.encoder)):
            graph = mha(f"encoder.{i}", graph, graph)
        mem = torch.relu(graph @ p["pma.ffn.0.weight"].T + p["pma.ffn.0.bias"]) @ p["pma.ffn.3.weight"].T + p["pma.ffn.3.bias"]
        seeds = mha("pma.mha", p["pma.seed_vectors"], mem)
        for i in range(len(x.model.decoder)):
            seeds = mha(f"decoder.{i}", seeds, seeds)
        preds.append(seeds.reshape(-1) @ p["head.weight"][0] + p["head.bias"][0])
    pred = torch.stack(preds)
    loss = torch.nn.functional.mse_loss(pred, x.target.double())
    values = torch.autograd.grad(loss, [p[name] for name in names])
    dtype = x.feat.dtype
    return outputs(pred.to(dtype), loss.to(dtype), {name: v.to(dtype) for name, v in zip(names, values)})


def speed_baseline(x):
    """The buggy step: the same padded batch, one masked_fill fewer."""
    return buggy(x)


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def attend_nan_to_num_output(e, mask, values):
    """The NaN rows of each attention's output replaced by 0, after PyG's merged fix for the same empty rows
    (https://github.com/pyg-team/pytorch_geometric/pull/7902, one `x = x.nan_to_num()` after the decoder blocks)."""
    return attend_buggy(e, mask, values).nan_to_num()


def nan_to_num_output(x):
    """`nan_to_num` of the attention output (https://github.com/pyg-team/pytorch_geometric/pull/7902): those rows were
    dropped by the packing anyway; the softmax's NaN is still multiplied by their zero gradient in the backward."""
    return train_step(x, attend_nan_to_num_output)


def attend_tiny_negative(e, mask, values):
    """The mask filled with -1e-9 instead of -inf, as https://github.com/sooftware/kospeech/issues/37 measured ("Using
    `-1e-9` in `masked_fill_`: False", no NaN): -1e-9 is not a large negative number but almost 0."""
    e.masked_fill_(mask == 0, -1e-9)
    alpha = torch.softmax(e, dim=-1)
    return torch.einsum("bhxy,byhd->bxhd", alpha, values)


def fill_minus_1e_minus_9(x):
    """Fill with -1e-9 (https://github.com/sooftware/kospeech/issues/37): no NaN, and every valid node now attends to
    its graph's padding too (zero keys, zero values) with the weight of a score of 0."""
    return train_step(x, attend_tiny_negative)


def nan_to_num_gradients(x):
    """`nan_to_num` of every gradient before the step (a generic attempt): the NaN gradients become 0, so the layers
    they belong to stop learning."""
    return train_step(x, attend_buggy, grads=torch.nan_to_num)


bad_fixes = {
    "nan_to_num_output": nan_to_num_output,
    "fill_minus_1e_minus_9": fill_minus_1e_minus_9,
    "nan_to_num_gradients": nan_to_num_gradients,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


@torch.compiler.disable  # compiled, dynamo would unroll the loop over the graphs: minutes of compiling
def one_graph_at_a_time_forward(x):
    """The readout called on each graph alone: a batch of one has no padding, so no row is fully masked."""
    starts = [0]
    for n in x.lengths:
        starts.append(starts[-1] + n)
    return torch.cat([x.model(x.feat[a:b], [b - a], attend_buggy) for a, b in zip(starts, starts[1:])])


def one_graph_at_a_time(x):
    """Correct and careless: skip the padding by running the readout on one graph at a time (a Python loop over the
    batch's graphs), the same arithmetic in `graphs` small calls for one. Marked `torch.compiler.disable`, as a user
    marks a loop whose compile takes minutes, so compiled it runs eager."""
    names, params = zip(*x.model.named_parameters())
    pred = one_graph_at_a_time_forward(x)
    loss = torch.nn.functional.mse_loss(pred, x.target)
    return outputs(pred, loss, dict(zip(names, torch.autograd.grad(loss, params))))


slow_fixes = {"one_graph_at_a_time": one_graph_at_a_time}
