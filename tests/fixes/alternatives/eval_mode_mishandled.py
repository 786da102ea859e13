"""eval_mode_mishandled, fixed differently from the case's `fixed`: a grade must accept it, every time. It uses only what
the buggy code already uses from its case (`loaded`, `next_token_probs`)."""

from contextlib import contextmanager

from cases import eval_mode_mishandled as case


@contextmanager
def evaluating(model):
    """The model in evaluation mode for the block, then back in the mode it was found in (`train(was)`): an evaluation
    inside a training loop must not leave training without its dropout."""
    was = model.training
    model.train(False)
    try:
        yield model
    finally:
        model.train(was)


def eval_mode_mishandled(x):
    with evaluating(case.loaded(x)) as model:
        return case.next_token_probs(model, x)
