"""Upstream's fixes of autocast_device, in the order speechbrain applied them, each as a submission.

Each is the device-type line of one attempt or release, re-typed from its source, then the case's Brain and step
(`train`, which the buggy code uses too). tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md
has the verdicts.
"""

from cases.autocast_device import train


def pr_2882_first_commit(x):
    """https://github.com/speechbrain/speechbrain/pull/2882, its first commit, as the reporter quotes it in
    https://github.com/speechbrain/speechbrain/issues/2881 (2025-04-10): "cuda:0" -> `self.device[-1]`, i.e. '0'."""

    def device_type(brain):
        if brain.device == "cpu":
            brain.device_type = "cpu"
        elif "cuda" in brain.device:
            brain.device_type = "cuda" if brain.device == "cuda" else brain.device[-1]
        else:
            raise ValueError("Expected `self.device` to be `cpu` or `cuda`!")

    return train(x, device_type)


def pr_2882_merged(x):
    """https://github.com/speechbrain/speechbrain/pull/2882 as merged (commit e2c4ba47, 2025-04-11, "Attempt to fix
    `self.device` for AMP"): "cpu" -> cpu, any "cuda..." -> cuda, anything else raises ValueError."""

    def device_type(brain):
        if brain.device == "cpu":
            brain.device_type = "cpu"
        elif "cuda" in brain.device:
            brain.device_type = "cuda"
        else:
            raise ValueError("Expected `self.device` to be `cpu` or `cuda`!")

    return train(x, device_type)


def speechbrain_1_1_0(x):
    """speechbrain 1.1.0's Brain.__init__ (after https://github.com/speechbrain/speechbrain/pull/2855; reported in
    https://github.com/speechbrain/speechbrain/issues/3054): the same mapping without the raise, so "cpu:0", "mps",
    "xpu:0" get no `device_type` at all."""

    def device_type(brain):
        if brain.device == "cpu":
            brain.device_type = "cpu"
        elif "cuda" in brain.device:
            brain.device_type = "cuda"

    return train(x, device_type)


def pr_3055(x):
    """https://github.com/speechbrain/speechbrain/pull/3055 ("Fix device handling for MPS", fixes #3054; released in
    speechbrain 1.1.1, core.py read from its wheel): 1.1.0's two branches kept, and an `else` that takes the text
    before the colon, `self.device_type = self.device.split(":")[0]`, for every other string."""

    def device_type(brain):
        if brain.device == "cpu":
            brain.device_type = "cpu"
        elif "cuda" in brain.device:
            brain.device_type = "cuda"
        else:
            brain.device_type = brain.device.split(":")[0]

    return train(x, device_type)
