"""A correct fix of clip_before_unscale written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case."""

from torch import nn

from cases.clip_before_unscale import train


def clip_before_unscale(x):
    """Leave the gradients scaled and clip them at max_norm times the scaler's current scale, read at each step
    (the faster way an MXNet maintainer gave for the same order, https://github.com/apache/mxnet/issues/15738:
    "change the value of your gradient clipping to `args.clip * trainer._amp_loss_scaler.loss_scale`"): the clip
    coefficient is the fix's, and scaler.step divides by the same scale afterwards. Not a constant 65536: the scale
    moves."""
    return train(x, lambda model, optimizer, scaler, batch: nn.utils.clip_grad_norm_(model.parameters(), x.max_norm * scaler.get_scale()))
