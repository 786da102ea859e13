"""embedding_oob has no upstream fix: https://github.com/open-mmlab/Amphion/issues/193 is open, and the stored thread
holds the report and its traceback, no answer. What Amphion's own code does with a continuous feature it embeds is
graded instead, re-typed from its FastSpeech2 VarianceAdaptor and put in the case's terms (the feature's bin edges and
an `nn.Embedding(n_bins, 384)` table, which the inputs carry; `diffusion_conv`, which the buggy code uses too).
tests/test_upstream_fixes.py grades it; docs/history/upstream_fixes.md has the verdict.
"""

import torch
import torch.nn.functional as F

from cases.embedding_oob import diffusion_conv


def amphion_variance_adaptor_bucketize(x):
    """https://github.com/open-mmlab/Amphion/blob/main/models/tts/fastspeech2/fs2.py (VarianceAdaptor, read at
    0ab8bf19): a continuous pitch or energy value is quantised against `n_bins - 1` edges and looked up in an
    `nn.Embedding(n_bins, hidden)`, `self.pitch_embedding(torch.bucketize(target, self.pitch_bins))`, with no range
    check: bucketize returns an index in [0, n_bins) by construction."""
    emotion = F.embedding(torch.bucketize(x.features, x.bin_edges), x.table_by_bins)  # (B, T, D)
    return diffusion_conv(emotion, x.conv_weight)
