"""lr_scheduler_verbose: an alternative correct fix, written differently from the case's own `fixed`."""

import inspect

from torch.optim.lr_scheduler import ReduceLROnPlateau

from cases.lr_scheduler_verbose import train

SPOTIFLOW_KEYWORDS = {"factor": 0.5, "threshold": 1e-4, "min_lr": 3e-6, "cooldown": 5, "verbose": True}


def accepted_keywords(scheduler_class, keywords):
    """The keywords the constructor of this torch names, the rest dropped: what
    https://github.com/microsoft/qlib/pull/2095 does ("detecting whether `verbose` is supported instead of comparing
    version strings"). `verbose` is kept on torch < 2.7, where it still only warns."""
    accepted = inspect.signature(scheduler_class.__init__).parameters
    return {name: value for name, value in keywords.items() if name in accepted}


def lr_scheduler_verbose(x):
    """spotiflow's keywords as data, filtered through the constructor's signature; trained as the case trains."""
    return train(
        x,
        lambda optimizer, patience: ReduceLROnPlateau(
            optimizer, patience=patience, **accepted_keywords(ReduceLROnPlateau, SPOTIFLOW_KEYWORDS)
        ),
    )
