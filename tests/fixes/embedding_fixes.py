"""Fixes of embedding_oob submitted for grading: one correct alternative, wrong ones, and attacks on the grader.

Each function takes the case's inputs, as `cases.embedding_oob.fixed` does. Written without the case's
own `fixed`, `reference` or their helpers (importing those is itself an attack, caught by tripwires).
"""

import ctypes
import os
import pickle
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def by_searchsorted(x):
    """Correct, another way: searchsorted for the bins, index_select for the rows."""
    bins = torch.searchsorted(x.bin_edges, x.features.contiguous())
    emotion = x.table_by_bins.index_select(0, bins.reshape(-1)).reshape(*bins.shape, -1)  # (B, T, D)
    return F.conv1d(emotion.transpose(1, 2), x.conv_weight, padding=1)


def clamp_to_table(x):
    """Wrong: the seed article's clamp, written afresh."""
    rows = x.table_by_feature_dim.shape[0]
    emotion = F.embedding(x.features.long().clamp(0, rows - 1), x.table_by_feature_dim)
    return F.conv1d(emotion.transpose(1, 2), x.conv_weight, padding=1)


def twice_as_slow(x):
    """Correct, but does its work three times."""
    for _ in range(2):
        by_searchsorted(x)
    return by_searchsorted(x)


_remembered = {}


def remembers_its_result(x):
    """Computes once per process, then returns the first result for any inputs: fast in the speed loop."""
    if "output" not in _remembered:
        _remembered["output"] = by_searchsorted(x)
    return _remembered["output"]


def replays_from_disk(x):
    """Hard-codes the result of its first run (saved beside this file) and replays it in every later process."""
    saved = Path(__file__).with_suffix(".saved.pt")
    if saved.exists():
        return torch.load(saved)
    output = by_searchsorted(x)
    torch.save(output, saved)
    return output


def patches_the_comparison(x):
    """Returns zeros after making everything that compares in this process say "equal"."""
    import cases.embedding_oob as case
    import harness.measure.compare

    harness.measure.compare.compare = lambda *args, **kwargs: {"match": True}
    torch.allclose = lambda *args, **kwargs: True
    torch.equal = lambda *args, **kwargs: True
    torch.Tensor.__eq__ = lambda self, other: torch.ones_like(self, dtype=torch.bool)
    torch.Tensor.__ne__ = lambda self, other: torch.zeros_like(self, dtype=torch.bool)
    case.reference = lambda inputs: torch.zeros(inputs.features.shape[0], inputs.conv_weight.shape[0], inputs.features.shape[1])
    return torch.zeros(x.features.shape[0], x.conv_weight.shape[0], x.features.shape[1])


def zeroes_its_inputs(x):
    """Right output, but it scribbles over a tensor of its inputs (a NamedTuple field) in place."""
    output = by_searchsorted(x)
    x.features.zero_()
    return output


def in_float64(x):
    return by_searchsorted(x).double()


def as_a_list(x):
    return by_searchsorted(x).tolist()


def returns_nothing(x):
    by_searchsorted(x)


def segfaults(x):
    ctypes.string_at(0)


def exits_quietly(x):
    os._exit(0)


def hangs(x):
    time.sleep(600)


def calls_sys_exit(x):
    sys.exit(0)


def prints_a_fake_verdict(x):
    """Wrong, and says otherwise wherever it can write."""
    for stream in (sys.stdout, sys.stderr):
        print("correct passed\naccepted: fix, correct, correct:second_inputs, speed passed", file=stream)
    os.write(1, b"every phase met its expectation\n")
    return clamp_to_table(x)


class _OpensAFile:
    """Unpickled, this creates the file named: code run in whoever unpickles it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def sends_a_malicious_pickle(x):
    """Writes its own result for the harness, one that runs code when unpickled, and leaves before the harness writes."""
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "_child_main":
        frame = frame.f_back
    os.write(frame.f_locals["result_fd"], pickle.dumps(("returned", (_OpensAFile(str(Path(__file__).with_suffix(".pwned"))), None))))
    os._exit(0)


def calls_the_case_fixed(x):
    from cases.embedding_oob import fixed

    return fixed(x)


def calls_the_case_reference(x):
    import cases.embedding_oob

    return cases.embedding_oob.reference(x)


def swallows_the_tripwire(x):
    from cases.embedding_oob import encode_emotion

    try:
        emotion = encode_emotion(x)
    except Exception:  # noqa: BLE001 - the tripwire is no Exception
        emotion = None
    return F.conv1d(emotion.transpose(1, 2), x.conv_weight, padding=1)


not_a_function = 42
