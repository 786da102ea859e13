"""tied_weights_meta_init: an alternative correct fix, written differently from the case's own `fixed`."""

from operator import attrgetter

from cases.tied_weights_meta_init import initialise, on_meta, train


def tied_groups(model):
    """accelerate's `find_tied_parameters`, by identity: the names under which one Parameter object appears more than
    once, found on the meta model before anything is materialised."""
    names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def tied_weights_meta_init(x):
    """accelerate's way in general (#1204, `retie_parameters`): the tied groups read on meta, the model materialised,
    then every name of a group set to the Parameter its first name now holds; initialised and trained as the case does."""
    model = on_meta(x)
    groups = tied_groups(model)
    model.to_empty(device=x.device)
    for first, *others in groups:
        parameter = attrgetter(first)(model)
        for name in others:
            owner, _, attribute = name.rpartition(".")
            setattr(attrgetter(owner)(model) if owner else model, attribute, parameter)
    return train(initialise(model, x), x)
