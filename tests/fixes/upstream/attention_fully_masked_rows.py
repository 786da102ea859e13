"""Upstream's fixes of attention_fully_masked_rows as submissions, in the order upstream applied them.

The readout and the step are the case's (DGL's `MultiHeadAttention` with `attend` passed in, `outputs`); only what
upstream changed is upstream's: DGL's masking and softmax after #2658 (read in DGL's history, commit 174dd18), and
PyG's `nan_to_num` after the decoders (read in PyG's history, commit deff5a46). Graded by tests/test_upstream_fixes.py;
the grades are in docs/history/upstream_fixes.md.
"""

import torch

from cases.attention_fully_masked_rows import attend_buggy, outputs, train_step


def _attend_dgl_2658(e, mask, values):
    """DGL's `MultiHeadAttention.forward` after 174dd18, from the mask on: `e = e.masked_fill(mask == 0,
    -float('inf'))` (no longer in place), the softmax, then "the following line addresses the NaN issue, see
    https://github.com/dmlc/dgl/issues/2657": `alpha = alpha.masked_fill(mask == 0, 0.)`, and the weighted sum."""
    e = e.masked_fill(mask == 0, -float("inf"))
    alpha = torch.softmax(e, dim=-1)
    alpha = alpha.masked_fill(mask == 0, 0.0)
    return torch.einsum("bhxy,byhd->bxhd", alpha, values)


def dgl_pr_2658_masked_fill_after_softmax(x):
    """https://github.com/dmlc/dgl/pull/2658 (commit 174dd18, "[hotfix] A bunch of fix for SetTransformer",
    2021-02-23): the masked attention weights set to 0 after the softmax. Its other changes (`_gen_mask`, which the
    case already uses; InducedSetAttentionBlock's docstring) are not on this path."""
    return train_step(x, _attend_dgl_2658)


def _readout_nan_to_num(model, feat, lengths, attend):
    """The case's `SetTransformerReadout.forward` with PyG's line: `x = x.nan_to_num()` after the decoder blocks,
    before the seeds are flattened into the head (PyG: `return x.flatten(1, 2) if self.concat else x.mean(dim=1)`)."""
    for sab in model.encoder:
        feat = sab(feat, feat, lengths, lengths, attend)
    batch_size = len(lengths)
    feat = model.pma(feat, lengths, attend)
    for sab in model.decoder:
        feat = sab(feat, feat, [model.k] * batch_size, [model.k] * batch_size, attend)
    feat = feat.nan_to_num()
    return model.head(feat.view(batch_size, model.k * model.d_model)).squeeze(-1)


def pyg_pr_7902_nan_to_num(x):
    """https://github.com/pyg-team/pytorch_geometric/pull/7902 (commit deff5a46, "Fix `NaN` issue in
    `SetTransformerAggregation`", rusty1s, 2023-08-18, for https://github.com/pyg-team/pytorch_geometric/issues/7899):
    one line in `SetTransformerAggregation.forward`, `x = x.nan_to_num()` after `for decoder in self.decoders: x =
    decoder(x)`. Put in DGL's readout, whose attention is still the buggy one (PyG's fix touches nothing else)."""
    names, params = zip(*x.model.named_parameters())
    pred = _readout_nan_to_num(x.model, x.feat, x.lengths, attend_buggy)
    loss = torch.nn.functional.mse_loss(pred, x.target)
    return outputs(pred, loss, dict(zip(names, torch.autograd.grad(loss, params))))
