"""Upstream's fix of lr_scheduler_verbose as a submission.

The training is the case's (`train`, which the buggy code uses too); only the scheduler's construction is upstream's.
Graded by tests/test_upstream_fixes.py; the grades are in docs/history/upstream_fixes.md.
"""

from torch.optim.lr_scheduler import ReduceLROnPlateau

from cases.lr_scheduler_verbose import train


def pr_30_drop_verbose(x):
    """https://github.com/weigertlab/spotiflow/pull/30, commit c6baf96f ("Remove verbosity argument in scheduler",
    2025-05-20, read in the repository's history): in `SpotiflowTrainingWrapper.configure_optimizers`
    (spotiflow/model/trainer.py) one line deleted, `verbose=True,`; the scheduler otherwise as before."""
    return train(
        x,
        lambda optimizer, patience: ReduceLROnPlateau(optimizer, factor=0.5, patience=patience, threshold=1e-4, min_lr=3e-6, cooldown=5),
    )
