"""class_weight_index fixes: a correct one written from PyTorch, and two that change what they were given."""

import torch.nn.functional as F


def weighted_mean(x):
    return x.loss_weight * F.cross_entropy(x.pred, x.label, weight=x.class_weight, ignore_index=x.ignore_index)


def returns_a_view_of_its_input(x):
    """The right value, written into the logits and handed back as a view of them."""
    flat = x.pred.view(-1)
    flat[0] = weighted_mean(x)
    return flat[0]


def retunes_the_loss_module(x):
    """The right value, but the loss module the caller passed in leaves with another loss_weight."""
    x.loss.loss_weight = 1.0
    return weighted_mean(x)
