"""Upstream's fix of torch_load_weights_only, and the other threads' loads the case cites, each as a submission.

Each is the predictor's `torch.load` of fold 0's checkpoint as the change writes it, handed to the case's `restore`
(which the buggy code uses too: the trusted checkpoint read as nnU-Net reads it, then the crafted one through the
same load). tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import os

import torch

from cases.torch_load_weights_only import restore


def commit_dadc00d8_weights_only_false(x):
    """https://github.com/MIC-DKFZ/nnUNet/commit/dadc00d842b4c82ea6e1f3a419e708d165fadd50 ("set weights_only=False in
    torch.load", 2025-01-30, for https://github.com/MIC-DKFZ/nnUNet/issues/2681; still the predictor's load at the
    stored HEAD 0e495086; https://github.com/MIC-DKFZ/nnUNet/pull/2717 did the same for v1),
    nnUNetPredictor.initialize_from_trained_model_folder: `torch.load(join(model_training_output_dir, f'fold_{f}',
    checkpoint_name), map_location=torch.device('cpu'), weights_only=False)`."""

    def load(file):
        return torch.load(file, map_location=torch.device("cpu"), weights_only=False)

    return restore(x, load)


def deepmd_pr_4147_weights_only_true(x):
    """https://github.com/deepmodeling/deepmd-kit/pull/4147, its first try (for
    https://github.com/deepmodeling/deepmd-kit/issues/4143's FutureWarning, as the warning recommends):
    `torch.load(..., weights_only=True)` with no allowlist."""

    def load(file):
        return torch.load(file, map_location=torch.device("cpu"), weights_only=True)

    return restore(x, load)


def comfyui_issue_102_force_no_weights_only_load(x):
    """A comment's advice in https://github.com/ZHO-ZHO-ZHO/ComfyUI-YoloWorld-EfficientSAM/issues/102:
    `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` in the environment, the predictor's bare `torch.load` unchanged (set around
    the load here, so that the process's environment is left as it was)."""

    def load(file):
        os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
        try:
            return torch.load(file, map_location=torch.device("cpu"))
        finally:
            del os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]

    return restore(x, load)
