"""loss_broadcast: an alternative correct fix, written differently from the case's own `fixed`."""

import torch.nn.functional as F

from cases.loss_broadcast import train_epoch


def loss_broadcast(x):
    """Both sides flattened to one value per sample, (n,), and F.mse_loss without reduction: for every batch size."""
    return train_epoch(x, lambda x, logits, labels: F.mse_loss(logits.reshape(-1), labels.float().reshape(-1), reduction="none"))
