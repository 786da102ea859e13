"""state_dict_aliasing, fixed differently from the case's `fixed`: a grade must accept it, every time. It uses only what
the buggy code already uses from its case (`fit`)."""

from cases import state_dict_aliasing as case


def state_dict_aliasing(x):
    """Each improvement keeps a clone of every tensor of the state, detached, in a new dict: storage that the
    optimizer's in-place steps never touch (rather than `copy.deepcopy` of the whole dict)."""
    return case.fit(x, lambda model: {name: tensor.detach().clone() for name, tensor in model.state_dict().items()})
