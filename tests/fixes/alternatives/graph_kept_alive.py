"""A correct fix of graph_kept_alive written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch
import torch.nn.functional as F

from cases import graph_kept_alive as graph_case


@torch.inference_mode()
def graph_kept_alive(x):
    """The whole batch in inference mode (a decorator, not a no_grad block); the loss by the functional form, summed
    into a fresh tensor rather than in place."""
    images, labels = x.next_batch()
    batch_loss = F.binary_cross_entropy(x.network(images), labels)
    epoch = x.epoch
    epoch.losstensorMean = batch_loss + epoch.losstensorMean
    epoch.lossVal += float(batch_loss)
    epoch.lossValNorm += 1
    return graph_case.running_means(epoch)
