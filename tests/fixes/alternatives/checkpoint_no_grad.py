"""checkpoint_no_grad: a correct fix written differently from the case's `fixed` (a grade must accept it)."""

from cases import checkpoint_no_grad as case


def checkpoint_no_grad(x):
    """Keep the reentrant checkpoint (passed explicitly) and make the hidden states entering the first layer require
    grad: a forward hook on the embeddings module, removed after the step (PEFT hooks the word embeddings instead)."""
    hook = x.model.embeddings.register_forward_hook(lambda module, args, output: output.requires_grad_())
    try:
        return case.trainer_step(x, {"use_reentrant": True})
    finally:
        hook.remove()
