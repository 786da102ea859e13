"""A correct fix of class_weight_index written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch.nn.functional as F


def class_weight_index(x):
    """PyTorch's own weighted mean, written from its documentation."""
    return x.loss_weight * F.cross_entropy(x.pred, x.label, weight=x.class_weight, ignore_index=x.ignore_index)
