"""grad_accum_normalization: an alternative correct fix, written differently from the case's own `fixed`."""

import torch

from cases.grad_accum_normalization import IGNORE_INDEX, causal_lm_loss
from harness.measure.compare import training_outputs


def grad_accum_normalization(x):
    """torchtune's way (#1875, then #1917's `scale_grads`): each micro-batch's mean loss multiplied back by its own
    count of shifted labels that are not -100, backpropagated unnormalised; at the step the gradients and the logged
    loss are divided by the window's total count."""
    x.model.zero_grad(set_to_none=True)
    running_loss, num_tokens = 0.0, 0
    for input_ids, labels in x.micro_batches:
        tokens = labels[..., 1:].ne(IGNORE_INDEX).sum()  # what the shifted loss averages over
        loss = causal_lm_loss(x.model(input_ids), labels) * tokens
        loss.backward()
        running_loss, num_tokens = running_loss + loss.detach(), num_tokens + tokens
    with torch.no_grad():
        for p in x.model.parameters():
            if p.grad is not None:
                p.grad.div_(num_tokens)
    return training_outputs(x.model, running_loss / num_tokens)
