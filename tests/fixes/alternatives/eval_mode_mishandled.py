"""eval_mode_mishandled, fixed differently from the case's `fixed`: a grade must accept it, every time. It uses only what
the buggy code already uses from its case (`loaded`, `next_token_probs`, `handed_back`)."""

from torch import nn

from cases import eval_mode_mishandled as case


def eval_mode_mishandled(x):
    """Only the modules that read the flag, each nn.Dropout and the attention (its SDPA `dropout_p`), set out of
    training for the inference and set back after it, in place of the whole model's eval() and train()."""
    model = case.loaded(x)
    readers = [m for m in model.modules() if isinstance(m, (nn.Dropout, case.CausalSelfAttention))]
    for m in readers:
        m.training = False
    try:
        out = case.next_token_probs(model, x)
    finally:
        for m in readers:
            m.training = True
    return case.handed_back(model, out)
