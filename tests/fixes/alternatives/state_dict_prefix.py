"""state_dict_prefix, fixed differently from the case's `fixed`: a grade must accept it."""

from torch import nn

from cases import state_dict_prefix as case


def state_dict_prefix(x):
    """Load through the wrapper the keys were saved from (its `module` is the plain model), rather than renaming keys."""
    model = case.build_model(x)
    nn.DataParallel(model).load_state_dict(x.checkpoint["model_state_dict"])
    return case.predicted(model, x)
