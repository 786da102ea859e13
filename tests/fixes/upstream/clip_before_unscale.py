"""Upstream's fixes of clip_before_unscale as submissions, in the order upstream applied them.

The loop is the case's (`train`: zero_grad, the scaled backward, the clipping, `scaler.step`, `scaler.update`); only
what runs between the backward and the step is upstream's, re-typed from each project's commit (read in its history).
The stored copy of https://github.com/pytorch/pytorch/issues/40907 ends before its answer, so no fix is taken from it.
Graded by tests/test_upstream_fixes.py; the grades are in docs/history/upstream_fixes.md.
"""

from torch import nn

from cases.clip_before_unscale import train


def everydream_pr_175_unscale_each_optimizer(x):
    """https://github.com/victorchall/EveryDream2trainer/pull/175 (commit 1939cd5, "apply clip_grad_scale to the
    unscaled gradients just before stepping the scaler", 2023-05-21), `EveryDreamOptimizer.step`: `for optimizer in
    self.optimizers: self.scaler.unscale_(optimizer)`, then `clip_grad_norm_` of the unet's and the text encoder's
    parameters; here one optimizer and one model's parameters."""

    def clip(model, optimizer, scaler, batch):
        for each in (optimizer,):
            scaler.unscale_(each)
        nn.utils.clip_grad_norm_(parameters=model.parameters(), max_norm=x.max_norm)

    return train(x, clip)


def pytorch_unet_pr_470_unscale_before_clip(x):
    """https://github.com/milesial/Pytorch-UNet/pull/470 (commit 52b4f14, "Unscale gradients before clipping",
    2023-12-08, for https://github.com/milesial/Pytorch-UNet/issues/468), train.py: one line,
    `grad_scaler.unscale_(optimizer)` between `grad_scaler.scale(loss).backward()` and
    `torch.nn.utils.clip_grad_norm_(model.parameters(), gradient_clipping)`."""

    def clip(model, optimizer, grad_scaler, batch):
        grad_scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), x.max_norm)

    return train(x, clip)


def returnn_pr_1595_unscale_in_updater(x):
    """https://github.com/rwth-i6/returnn/pull/1595 (commit 68848749, "Torch, unscale gradients before noise and
    clipping", 2024-07-22, for https://github.com/rwth-i6/returnn/issues/1590), `Updater.step`: `if grad_scaler is not
    None: grad_scaler.unscale_(self.optimizer)` before the gradient noise (none here) and the global-norm clipping."""

    def clip(model, optimizer, grad_scaler, batch):
        if grad_scaler is not None:
            grad_scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), x.max_norm)

    return train(x, clip)
