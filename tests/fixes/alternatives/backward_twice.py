"""A correct fix of backward_twice written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch

from cases import backward_twice as twice_case


def backward_twice(x):
    """pytorch/examples' word_language_model placement: the carried state repackaged (detached) before each window's
    forward, rather than after the forward that made it."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = twice_case.next_window(x)
        repackaged = None if x.h_state is None else x.h_state.detach()
        prediction, x.h_state = x.model(inputs, repackaged)
        loss = torch.nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return twice_case.trained(x, predictions)
