"""A correct fix of embedding_oob written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch
import torch.nn.functional as F


def embedding_oob(x):
    """searchsorted for the bins, index_select for the rows."""
    bins = torch.searchsorted(x.bin_edges, x.features.contiguous())
    emotion = x.table_by_bins.index_select(0, bins.reshape(-1)).reshape(*bins.shape, -1)  # (B, T, D)
    return F.conv1d(emotion.transpose(1, 2), x.conv_weight, padding=1)
