"""recompile_limit: an alternative correct fix, written differently from the case's own `fixed`."""

from cases.recompile_limit import compiled_block, denoise, next_prompt


def recompile_limit(x):
    """Leave `dynamic` at torch.compile's default: the second length recompiles once with the lengths symbolic
    (automatic dynamic shapes, which dynamic=False turned off), and every later prompt reuses that graph."""
    return denoise(compiled_block(x, "automatic"), next_prompt(x))
