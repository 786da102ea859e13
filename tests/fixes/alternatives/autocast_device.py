"""A correct fix of autocast_device written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

from cases import autocast_device as autocast_case


def autocast_device(x):
    """The device type as the text before the colon, not through torch.device."""
    return autocast_case.train(x, lambda brain: setattr(brain, "device_type", brain.device.partition(":")[0]))
