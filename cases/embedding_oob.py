"""An Embedding sized by a feature dimension, fed continuous features cast to long.

Upstream: https://github.com/open-mmlab/Amphion/issues/193 (a user-written EmotionEncoder
    in an Amphion diffusion TTS recipe). Why index checks are not recoverable on CUDA:
    https://github.com/pytorch/pytorch/issues/19120

Fidelity: faithful in the layer, sizes and order of ops: `nn.Embedding(1583, 384)` (1583 was the
    emotion feature's dimension, not a vocabulary), input [64, 136] long-cast, output
    [64, 136, 384], then a cuDNN `conv1d` of the diffusion network with no host sync in between.
    Synthetic: the feature values (seeded uniform over `feature_range`, as the user's real
    features are not published) and the single conv standing in for the diffusion network.

Symptom on CUDA: many lines of a device-side assertion, then a later op's error:
        .../Indexing.cu: indexSelectLargeIndex: ... Assertion `srcIndex < srcSelectDimSize` failed.
        RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR
    The kernel error is asynchronous and sticky: whichever op synchronises next reports it, so the
    final line depends on the torch/cuDNN version (cuDNN error, or CUDA error: device-side assert
    triggered). The record says which one was seen and where. Seen on an H200 (torch 2.11.0+cu130, CUDA
    13.0, driver 580.159): the kernel is now the vectorized gather,
        /pytorch/aten/src/ATen/native/cuda/IndexKernelUtils.cu:16: vectorized_gather_kernel: block: [189,0,0], thread: [5,0,0] Assertion `ind >=0 && ind < ind_dim_size && "vectorized gather kernel index out of bounds"` failed.
    and the error, as upstream's, `RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR` at the
    diffusion conv; an unrelated op afterwards fails too. Compiled (inductor), triton's check prints
    `Assertion `index out of bounds: 0 <= tmp5 < 1583` failed` and the process survives, poisoned.

Symptom on CPU: raised at the lookup itself:
        IndexError: index out of range in self

Cause: `features.long()` turns continuous values into row numbers; any value >= 1583 indexes past
    the table. An Embedding is a table lookup, valid only for integer ids in [0, num_embeddings).

Fix: Amphion's own practice for continuous inputs: quantise the feature into `n_bins` with
    `torch.bucketize` before an `nn.Embedding(n_bins, 384)` (or use a Linear layer), so every
    index is in range by construction; guard that construction where it is free, on shapes (the
    table has a row for every bin), never with a `.item()` check in the training step. Where ids come
    from data, `torch._assert_async` guards the values without a host sync, at a few kernels a call
    (on an H200 it made this lookup 2.46x as slow, and its leanest form 1.76x: launch overhead, not work). Wrong ones, both generic
    attempts (from the article the case was seeded from, not a public thread):
    clamping the indices (the crash goes, every value past the table lands on its last row) and a
    range check with `.item()` alone (a clear error and a host sync, and the batch still cannot be
    encoded).
"""

import bisect
from typing import NamedTuple

import torch
import torch.nn.functional as F

from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom("IndexError", r"index out of range in self"),
    "cuda": Symptom(
        "RuntimeError",
        r"CUDA error|cuDNN error|CUDNN_STATUS|CUBLAS_STATUS|device-side assert",
        output=r"srcIndex < srcSelectDimSize|index out of bounds",
    ),
}

compiled_unit = "the model's forward: the emotion encoder's lookup and the diffusion network's conv"

# An out-of-range lookup in any embedding or index_select; a codebook's is the more specific codebook_oob.
triage_signs = TriageSigns(
    family="an index past an embedding table (index_select)",
    cause="token ids past the embedding table: tokens added to the tokenizer, the table not resized",
    confirm="the largest id in the batch against the table's num_embeddings (vocab_size, len(tokenizer))",
    also="any index_select past its source: negative ids, padding ids of another tokenizer",
    signs=(
        Sign(
            "failure",
            r"Indexing\.cu.*srcIndex < srcSelectDimSize|indexSelect(?:Large|Small)Index.*Assertion|Assertion `srcIndex < srcSelectDimSize` failed",
            0.9,
            "CUDA's index_select kernel, which an embedding lookup runs, asserted an index past the table",
            family=True,
        ),
        Sign(
            "failure",
            r"vectorized gather kernel index out of bounds",
            0.7,
            "CUDA's vectorized gather kernel (index_select in newer torch) asserted an index past the table",
        ),
        Sign(
            "failure",
            r"IndexError: index out of range in self",
            0.8,
            "the CPU error of an embedding / index_select lookup past the table",
            family=True,
        ),
        Sign(
            "failure",
            r"index out of range: Tried to access index -?\d+|\bindex out of range at \S*THTensor(?:EvenMore)?Math\.cpp\b",
            0.8,
            "torch 1.x's CPU error of an embedding lookup past the table (before 1.3, only where TH raised it)",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)(?<!list )(?<!string )(?<!tuple )(?<!str )\bindex out of range\b",
            0.5,
            "a report in words (or a traceback cut before its last line): an index out of range beside an embedding table",
            near=(r"(?i)nn\.Embedding\(|\bembeddings?\b",),
        ),
        Sign(
            "failure",
            r"CUBLAS_STATUS_(?:NOT_INITIALIZED|EXECUTION_FAILED|INTERNAL_ERROR)|CUDNN_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED|MAPPING_ERROR)",
            0.25,
            "a later op's cuBLAS / cuDNN error, as the lookup's assert surfaces at the next library call; alone it says nothing",
        ),
        Sign(
            "failure",
            r"index out of bounds: 0 <= \S*tmp<n>",
            0.3,
            "the bounds check of torch.compile's generated code (inductor on CPU or triton) fired; alone it does not say which op: the kernel's name or the bound does",
        ),
        Sign(
            "support",
            r"_fused_\w*?(?:embedding|index_select)",
            0.5,
            "the failing kernel is torch.compile's fusion of an embedding lookup (its name lists the fused ops)",
        ),
        Sign(
            "context",
            r"tmp<n>(?:, \[[\w, ]+\]\))? < 1583L?\b",
            0.35,
            "the bound is this case's table: 1583 rows, the emotion feature's dimension (triton may broadcast the index first)",
        ),
        Sign(
            "support",
            r"functional\.py.*\bin embedding\b|torch\.embedding\(|F\.embedding\(",
            0.5,
            "raised in an embedding lookup (torch.nn.functional.embedding)",
        ),
        Sign("support", r"_embeddings?\b|modules/sparse\.py|nn\.Embedding\(|embed_tokens\b", 0.3, "an Embedding module in the frames"),
        Sign(
            "context",
            r"add_special_tokens|add_tokens\(|resize_token_embeddings|len\(tokenizer\)|vocab_size\b",
            0.3,
            "the vocabulary changed size (tokens added, the table resized or not)",
        ),
        Sign(
            "support",
            r"CUDA error: device-side assert triggered",
            0.1,
            "an asynchronous CUDA error, as a device-side assert surfaces later",
        ),
        Sign(
            "support",
            r"terminate called recursively",
            0.1,
            "a C++ exception thrown by several threads at once, as a bounds check in torch.compile's parallel CPU kernel does; alone it names no op",
        ),
        Sign(
            "veto",
            r"^(?:cpp|triton_\w+?)_fused_(?!\w*(?:embedding|index_select))\w*_\d+\(",
            0,
            "the compiled kernel that failed does no embedding lookup (its name lists the ops it fuses)",
        ),
    ),
)


class Inputs(NamedTuple):
    features: torch.Tensor  # (B, T) continuous emotion feature values
    table_by_feature_dim: torch.Tensor  # (1583, D): the user's nn.Embedding(1583, 384)
    bin_edges: torch.Tensor  # (n_bins - 1,) quantisation edges over the feature range
    table_by_bins: torch.Tensor  # (n_bins, D): nn.Embedding(n_bins, 384)
    conv_weight: torch.Tensor  # (D, D, 3): the diffusion network's conv


def make_inputs(cfg, device):
    generator = torch.Generator().manual_seed(cfg.seed)
    sizes = cfg.sizes
    low, high = cfg.feature_range
    features = low + (high - low) * torch.rand(sizes.batch, sizes.frames, generator=generator)
    return Inputs(
        features=features.to(device),
        table_by_feature_dim=torch.randn(sizes.feature_dim, sizes.embed_dim, generator=generator).to(device),
        bin_edges=torch.linspace(low, high, sizes.n_bins + 1)[1:-1].to(device),
        table_by_bins=torch.randn(sizes.n_bins, sizes.embed_dim, generator=generator).to(device),
        conv_weight=(torch.randn(sizes.embed_dim, sizes.embed_dim, 3, generator=generator) / sizes.embed_dim**0.5).to(device),
    )


def diffusion_conv(emotion, conv_weight):
    return F.conv1d(emotion.transpose(1, 2), conv_weight, padding=1)  # (B, D, T)


def buggy(x):
    emotion = F.embedding(x.features.long(), x.table_by_feature_dim)  # (B, T, D): rows >= 1583 do not exist
    return diffusion_conv(emotion, x.conv_weight)


def fixed(x):
    return diffusion_conv(encode_emotion(x), x.conv_weight)


def encode_emotion(x):
    check_bins_fit_table(x.bin_edges, x.table_by_bins)
    bins = torch.bucketize(x.features, x.bin_edges)  # (B, T), each in [0, len(bin_edges)] by construction
    return F.embedding(bins, x.table_by_bins)


def check_bins_fit_table(bin_edges, table):
    """The range guard, on shapes: bucketize returns indices in [0, len(bin_edges)] for any value, so every one
    fits the table iff it has len(bin_edges) + 1 rows. Checked on the host: no kernel, no sync. The guard on the
    values it replaces (`torch._assert_async(((bins >= 0) & (bins < rows)).all())`) launched five kernels beside
    the lookup's two: on an H200 the guarded lookup took 2.83x the unguarded one (0.066 vs 0.024 ms,
    results/cuda_evidence/2026-11-25). After, on the same H200: 1.031x [1.015, 1.047] against 1.05x, and in one
    profiled run 0.92x where the value guard took 2.46x (results/cuda_evidence/2026-11-27); on CPU 1.000x
    [0.982, 1.019], against 1.15x allowed."""
    if bin_edges.shape[0] + 1 > table.shape[0]:
        raise ValueError(f"{bin_edges.shape[0]} bin edges make {bin_edges.shape[0] + 1} bins; the table has {table.shape[0]} rows")


def reference(x):
    return diffusion_conv(speed_reference(x), x.conv_weight)


def speed_reference(x):
    """The encoding alone, by counting the edges below each value: what `speed_candidate` must return."""
    bins = (x.features.unsqueeze(-1) > x.bin_edges).sum(-1)
    return x.table_by_bins[bins]


speed_candidate = encode_emotion


def speed_baseline(x):
    """The same lookup without the range guard: what validation costs."""
    return F.embedding(torch.bucketize(x.features, x.bin_edges), x.table_by_bins)


def clamp_indices(x):
    """Silence the crash by clamping the indices (a generic attempt, the clamp of the article the case was seeded
    from, not a public thread): every value past the table lands on its last row."""
    indices = x.features.long().clamp(0, x.table_by_feature_dim.shape[0] - 1)
    return diffusion_conv(F.embedding(indices, x.table_by_feature_dim), x.conv_weight)


def validate_only(x):
    """A range check with `.item()` (a generic attempt, the check of the article the case was seeded from, not a
    public thread): a clear error (and a host sync), but the batch still cannot be encoded."""
    indices = x.features.long()
    rows = x.table_by_feature_dim.shape[0]
    if indices.min().item() < 0 or indices.max().item() >= rows:
        raise ValueError(f"emotion index {indices.max().item()} outside Embedding({rows}, {x.table_by_feature_dim.shape[1]})")
    return diffusion_conv(F.embedding(indices, x.table_by_feature_dim), x.conv_weight)


bad_fixes = {"clamp_indices": clamp_indices, "validate_only": validate_only}


# -- slow fixes: correct encodings, slower than the budget allows ----------------------------


def bucketize_on_the_host(x):
    """Quantise in Python: the features as a list, `bisect` per value, back to a tensor."""
    edges = x.bin_edges.tolist()
    bins = [bisect.bisect_left(edges, value) for value in x.features.flatten().tolist()]
    check_bins_fit_table(x.bin_edges, x.table_by_bins)
    indices = torch.tensor(bins, device=x.features.device).view(x.features.shape)
    return F.embedding(indices, x.table_by_bins)


def encode_frame_by_frame(x):
    """The fix, one frame of the batch at a time, stacked afterwards."""
    frames = [F.embedding(torch.bucketize(x.features[:, t], x.bin_edges), x.table_by_bins) for t in range(x.features.shape[1])]
    return torch.stack(frames, dim=1)


slow_fixes = {"bucketize_on_the_host": bucketize_on_the_host, "encode_frame_by_frame": encode_frame_by_frame}
