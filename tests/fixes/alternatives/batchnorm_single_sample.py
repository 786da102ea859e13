"""A correct fix of batchnorm_single_sample written differently from the case's own `fixed`: a grade must accept it, every
time. It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

from cases import batchnorm_single_sample as bn_case


def batchnorm_single_sample(x):
    """scVI's own first fix (commit c0fa60d, "Fixes #426 * Skip minibatches of size < 3"): the loader as it was, and
    the training loop passing over a minibatch too small for BatchNorm's statistics, here the epoch's last."""
    model, step_model, optimizer = bn_case.fresh_model(x)
    model.train()
    for step, batch in enumerate(bn_case.train_loader(x)):
        if batch["X"].shape[0] < 3:
            continue
        loss = bn_case.training_step(step_model, optimizer, batch["X"], x, step)
    return bn_case.trained(model, loss, x)
