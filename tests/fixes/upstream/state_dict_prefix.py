"""Upstream's fix of state_dict_prefix, and the threads' workarounds the case cites, each as a submission.

The model, its load and the prediction are the case's (`build_model`, `predicted`, which the buggy code uses too).
tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import io

import torch
import torch.nn as nn

from cases.state_dict_prefix import build_model, predicted


def pr_63_save_the_wrapped_module(x):
    """https://github.com/wolny/pytorch-3dunet/pull/63 (commit 891e932a, 2020-02-14), `UNet3DTrainer._save_checkpoint`:
    `if isinstance(self.model, nn.DataParallel): state_dict = self.model.module.state_dict()`. It fixes checkpoints
    still to be written; applied to the one the user holds, that is its trainer resuming from it (the DataParallel
    model, whose keys the checkpoint's are, loaded by `utils.load_checkpoint`), saving it again through the fixed
    `_save_checkpoint` and `utils.save_checkpoint` (`torch.save`; here into memory, not a folder), and predict.py
    reading that as before (`torch.load(path, map_location='cpu')`, `model.load_state_dict(...)`)."""
    trainer_model = nn.DataParallel(build_model(x))  # train.py on more than one GPU
    trainer_model.load_state_dict(x.checkpoint["model_state_dict"])  # utils.load_checkpoint(resume, self.model)
    if isinstance(trainer_model, nn.DataParallel):  # remove `module` prefix from layer names when using `nn.DataParallel`
        state_dict = trainer_model.module.state_dict()
    else:
        state_dict = trainer_model.state_dict()
    saved = {key: value for key, value in x.checkpoint.items() if key != "model_state_dict"}
    buffer = io.BytesIO()
    torch.save({**saved, "model_state_dict": state_dict}, buffer)  # utils.save_checkpoint
    state = torch.load(io.BytesIO(buffer.getvalue()), map_location="cpu")  # utils.load_checkpoint in predict.py
    model = build_model(x)
    model.load_state_dict(state["model_state_dict"])
    return predicted(model, x)


def zsgnet_issue_14_strict_false(x):
    """https://github.com/TheShadow29/zsgnet-pytorch/issues/14 (the user's load, which its maintainer replaced) and
    https://github.com/nyu-mll/jiant-v1-legacy/issues/1087 (jiant loaded so: "The run will print warnings but will not
    fail"): `model.load_state_dict(state_dict, strict=False)`."""
    model = build_model(x)
    model.load_state_dict(x.checkpoint["model_state_dict"], strict=False)
    return predicted(model, x)


def crop_classification_issue_11_replace(x):
    """https://github.com/ClarkCGA/multi-temporal-crop-classification-baseline/issues/11 (and NVIDIA/tacotron2#74's
    user): every key rewritten with `k.replace("module.", "")` before a strict load."""
    state_dict = {k.replace("module.", ""): v for k, v in x.checkpoint["model_state_dict"].items()}
    model = build_model(x)
    model.load_state_dict(state_dict)
    return predicted(model, x)
