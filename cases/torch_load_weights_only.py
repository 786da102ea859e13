r"""A bare `torch.load` of an nnU-Net checkpoint: silent before torch 2.4, a FutureWarning in 2.4-2.5, an error from 2.6.

Upstream: https://github.com/MIC-DKFZ/nnUNet/issues/2681 (spinalcordtoolbox's CI on Linux after torch 2.6: its
    `sct_deepseg` tests of downloaded nnU-Net models, `seg_sc_lesion_t2w_sci` and `seg_ms_lesion_mp2rage`, fail
    in `torch.load`). The code is nnU-Net v2's
    `nnUNetPredictor.initialize_from_trained_model_folder` (nnunetv2/inference/predict_from_raw_data.py), which
    read each fold's checkpoint with `torch.load(join(model_training_output_dir, f'fold_{f}', checkpoint_name),
    map_location=torch.device('cpu'))` until commit dadc00d8 (2025-01-30) added `weights_only=False`. The
    FutureWarning torch 2.4 printed for the same bare call, from deepmd-kit's checkpoint loader
    (deepmd/pt/infer/inference.py): https://github.com/deepmodeling/deepmd-kit/issues/4143 (2024-09-19, when
    2.4 was the one release that warns; device not stated), whose maintainers then saved plain
    types and loaded weights-only (https://github.com/deepmodeling/deepmd-kit/pull/4148 and
    https://github.com/deepmodeling/deepmd-kit/pull/4147). When each release did what is read from torch's
    own source (torch/serialization.py of the 2.3.1, 2.4.0, 2.5.1 and 2.6.0 wheels; run here: 2.13.0 only).

Fidelity: faithful in the checkpoint's layout and types and in the call: nnU-Net's `save_checkpoint` dict
    (`network_weights`, `optimizer_state` of its SGD with momentum 0.99 and nesterov, `grad_scaler_state`
    None as on CPU, `logging` with nnU-Net's eight per-epoch series, `_best_ema`, `current_epoch`,
    `init_args` with `plans`, `configuration`, `fold`, `dataset_json` and a `torch.device`,
    `trainer_name`, `inference_allowed_mirroring_axes`), numpy float64 wherever nnU-Net's logger stores
    `np.nanmean`/`np.mean` results (dice, EMA dice, per-class dice, losses, `_best_ema`) and Python floats where it
    stores floats (learning rates, timestamps), 1000 epochs (nnU-Net's default), two foreground classes
    (#2681's `seg_sc_lesion_t2w_sci`: spinal cord and lesion); read as the predictor reads it, then its values
    taken as the trainer's `load_checkpoint` would. Synthetic: the network (the first two stages of a
    PlainConvUNet encoder and a 1x1x1 head: 195k parameters, not nnU-Net's 30M), every value (seeded), the
    plans and dataset.json trimmed to a few keys, and the checkpoint kept in memory rather than in a folder
    (each harness child ends with os._exit, which would leave files behind). Synthetic too, and the reason
    the case has a second file: a crafted checkpoint (nnU-Net's layout, its `logging` replaced by a pickle
    payload that sets an environment variable of this process) handed to the same loader afterwards, as a
    model downloaded from elsewhere would be. A safe loader refuses it; the output records whether it was
    refused and whether its code ran.

Symptom on CUDA: not in the threads (spinalcordtoolbox's CI has no GPU). The predictor loads with
    `map_location=torch.device('cpu')` and the failure is in unpickling, before any device is touched, so
    the text is the CPU's by construction (not run on a GPU here).

Symptom on CPU: torch 2.6 (#2681's log, numpy 1.x names `numpy.core`; numpy 2 names `numpy._core`):
        _pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two options, do those steps only if you trust the source of the checkpoint.
        (1) In PyTorch 2.6, we changed the default value of the `weights_only` argument in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, but it can result in arbitrary code execution. Do it only if you got the file from a trusted source.
        (2) Alternatively, to load with `weights_only=True` please check the recommended steps in the following error message.
        WeightsUnpickler error: Unsupported global: GLOBAL numpy.core.multiarray.scalar was not an allowed global by default. Please use `torch.serialization.add_safe_globals([scalar])` or the `torch.serialization.safe_globals([scalar])` context manager to allowlist this global if you trust this class/function.
    torch 2.13.0 here (numpy 2.4.6) words it the same, with `GLOBAL numpy._core.multiarray.scalar` and
    `add_safe_globals([numpy._core.multiarray.scalar])`. torch 2.4 and 2.5 load it and warn (#4143):
        FutureWarning: You are using `torch.load` with `weights_only=False` (the current default value), which uses the default pickle module implicitly. It is possible to construct malicious pickle data which will execute arbitrary code during unpickling (See https://github.com/pytorch/pytorch/blob/main/SECURITY.md#untrusted-models for more details). In a future release, the default value for `weights_only` will be flipped to `True`. This limits the functions that could be executed during unpickling. Arbitrary objects will no longer be allowed to be loaded via this mode unless they are explicitly allowlisted by the user via `torch.serialization.add_safe_globals`. We recommend you start setting `weights_only=True` for any use case where you don't have full control of the loaded file. Please open an issue on GitHub for any issues related to this experimental feature.
    torch 2.3 and earlier load it silently. Before 2.6 the same bare call also unpickles the crafted file:
    its code runs (the environment variable is set), with the warning from 2.4 and without it before. From
    the source, not run: 2.3.1 has no warning; 2.4.0 and 2.5.1 warn when `weights_only` and `pickle_module`
    are both left out; 2.6.0 defaults `weights_only` to True (`_default_to_weights_only`).

Cause: `torch.load` without `weights_only` unpickles with Python's pickle up to 2.5, which rebuilds any
    object by calling whatever function the file names; from 2.6 it runs a restricted unpickler that calls
    only an allowlist (tensors, containers, plain numbers and strings, `torch.device`). nnU-Net's logger
    leaves numpy float64 values in the checkpoint, and rebuilding one calls `numpy._core.multiarray.scalar`,
    which is not on the list, so the trusted checkpoint no longer loads; the crafted one is refused for the same
    reason (it names `builtins.exec`).

Fix: keep the restricted unpickler and allowlist exactly what nnU-Net's checkpoints need: numpy's
    `scalar`, `np.dtype` and the float64 dtype's class (`numpy.dtypes.Float64DType`, which the unpickler
    must also be allowed to build), with `torch.serialization.safe_globals` around the load (torch >= 2.5;
    `add_safe_globals` in 2.4; nothing in 2.3, where a weights-only load cannot read numpy scalars and only
    re-saving with plain types works). This is the second option torch's message gives ("(2) Alternatively, to
    load with `weights_only=True` ..."), not the one nnU-Net took: nnU-Net's own fix is the first option, commit
    dadc00d8 (2025-01-30, first released in nnU-Net 2.5.2) adding `weights_only=False` to this `torch.load`, graded
    a wrong fix below. The allowlist is also what transformers' Trainer adopted for the numpy arrays in its RNG state
    (https://github.com/huggingface/transformers/issues/34631); deepmd-kit saves plain floats instead (#4148),
    which new checkpoints should do, but the checkpoints already written keep their numpy values. The crafted
    file names `builtins.exec`, outside the list, and is refused with the same UnpicklingError.
    Cost: torch's weights-only unpickler is Python, and at every REDUCE it searches its default allowlist's
    values linearly and rebuilds the user's (torch/_weights_only_unpickler.py), ~20 us a numpy scalar: the
    ~6,000 of a 1000-epoch log take 0.11-0.15 s where pickle reads the whole file in ~11 ms (8.6-12.4x in the
    speed phase here; the ratio grows with the log and shrinks with the network, synthetic and small here).
    Wrong fixes, each rejected: `weights_only=False`, upstream's own fix (nnU-Net's commit dadc00d8, and
    https://github.com/MIC-DKFZ/nnUNet/pull/2717 for v1), graded wrong here because it brings back Python's
    pickle for every file the loader is handed, the crafted one included, whose code then runs; and
    `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1` (a comment's advice in https://github.com/ZHO-ZHO-ZHO/ComfyUI-YoloWorld-EfficientSAM/issues/102) load the
    trusted checkpoint bit for bit and run the crafted one's code: 2 of the output's 6 integers differ
    (refused False, code ran True), no float does; `weights_only=True` alone (deepmd-kit's first try in
    #4147: `WeightsUnpickler error: Unsupported class numpy.core.multiarray.scalar`, torch < 2.4's wording)
    still raises on the trusted one; two generic attempts, not from the cited threads, differ as the first
    two do: allowlisting whatever the file names (torch's `get_unsafe_globals_in_checkpoint`), which
    allowlists `builtins.exec` too, and trying weights-only first and falling back to `weights_only=False`,
    which loads the crafted file the unsafe way. Slow control: the allowlisted load repeated for each part a
    resume reads (metadata and log, weights, optimizer state): 27-31x the baseline against the 18x budget.
"""

import codecs
import functools
import importlib
import io
import operator
import os
import pickle
import random
from typing import NamedTuple

import numpy as np
import torch

from harness.cases import Symptom, Versions, WrongResult
from harness.triage import Sign, TriageSigns

FUTURE_WARNING = r"FutureWarning: You are using `torch\.load` with `weights_only=False` \(the current default value\)"
UNPICKLING = r"(?s)Weights only load failed\..*Unsupported global: GLOBAL numpy\._?core\.multiarray\.scalar was not an allowed global"

symptoms = {
    device: Versions(
        WrongResult(fixed_in="2.4"),  # the crafted file's code runs, silently
        WrongResult(warning=FUTURE_WARNING, appears_in="2.4", fixed_in="2.6"),  # the same, with torch's FutureWarning
        Symptom("UnpicklingError", UNPICKLING, appears_in="2.6"),  # the trusted checkpoint no longer loads
    )
    for device in ("cpu", "cuda")
}

# torch.load's weights-only unpickler refusing what a checkpoint names (torch >= 2.6, or weights_only=True), and the
# FutureWarning of the same bare call in torch 2.4-2.5; not a truncated or corrupt file, nor a TorchScript archive.
triage_signs = TriageSigns(
    family="torch.load's weights-only unpickler refusing a global",
    cause="a checkpoint holding Python objects (numpy scalars, argparse.Namespace) loaded with weights_only=True, the default since torch 2.6",
    confirm="the global named in the message is in the checkpoint, and the load passes no weights_only",
    also="an older library calling torch.load on a full pickle (a model object, not a state dict)",
    signs=(
        Sign(
            "failure",
            r"(?i)\bweights_only\b[^\n]{0,120}(?:(?<![\d.])2\.6\b|\bdefaults? (?:to |value |changed)|\bchanged (?:from|to)\b|\bflipped\b)|(?:(?<![\d.])2\.6\b|\bdefault(?: value)?\b)[^\n]{0,120}\bweights_only\b",
            0.55,
            "a report in words: torch.load's `weights_only` default changed (True from torch 2.6)",
            family=True,
        ),
        Sign(
            "failure",
            r"Unsupported global: GLOBAL \S+ was not an allowed global by default",
            0.7,
            "the weights-only unpickler met a global the file names and no allowlist holds (torch >= 2.4's wording)",
        ),
        Sign("failure", r"Weights only load failed", 0.5, "torch.load's weights-only unpickler refused the file (torch >= 2.6 by default)"),
        Sign(
            "failure",
            r"WeightsUnpickler error: Unsupported class \S+",
            0.6,
            "torch < 2.4's wording of the same refusal (`weights_only=True` passed)",
        ),
        Sign(
            "failure",
            r"Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`",
            0.6,
            "the unpickler may not set the state of a class it has not been allowed (numpy's dtype classes)",
        ),
        Sign(
            "failure",
            r"You are using `torch\.load` with `weights_only=False` \(the current default value\)",
            0.5,
            "torch 2.4-2.5 warn that this bare load unpickles with pickle, and will refuse the file from 2.6",
        ),
        Sign(
            "context",
            r"\btorch\.load\(|serialization\.py.* in load\b| in load_checkpoint\b|_load_rng_state",
            0.25,
            "raised in torch.load, or a checkpoint loader calls it",
        ),
        Sign("context", r"add_safe_globals|safe_globals\(\[", 0.2, "torch names the allowlist to extend"),
        Sign(
            "support",
            r"numpy\.(?:_?core\.multiarray\.(?:scalar|_reconstruct)|dtype|dtypes\.\w+)|argparse\.Namespace",
            0.15,
            "numpy values or an argparse Namespace in a training checkpoint: the common globals",
        ),
        Sign(
            "veto",
            r"Unsupported operand \d+|unsupported persistent id encountered",
            0,
            "the unpickler met bytes it cannot parse: a truncated or non-torch file, not a global to allowlist",
        ),
        Sign(
            "veto",
            r"Cannot use ``weights_only=True`` with TorchScript archives|failed finding central directory|invalid load key",
            0,
            "a TorchScript archive or a corrupt file, not a pickle global",
        ),
    ),
)

compiled_unit = (
    "none: the unit is torch.load, file parsing and unpickling with no tensor program; a user compiles the network the "
    "checkpoint restores, after loading it. Wrapped whole by the harness (compile=inductor), dynamo traced into the "
    "weights-only unpickler for ~20 s a call and compiled 0 graphs (fullgraph: `Unsupported method call`; torch 2.13.0), "
    "every phase as in eager: so the case compiles nothing (compiles_itself) and runs eager under every compile mode"
)
compiles_itself = True  # nothing in a load to compile: under compile=<backend> the case runs as in eager

PAYLOAD_FLAG = "TORCH_ERROR_CASES_PAYLOAD_RAN"  # what the published crafted checkpoint's code sets, in this process only


class Inputs(NamedTuple):
    checkpoint: bytes  # fold_0/checkpoint_final.pth: nnU-Net's save_checkpoint dict, torch.save'd
    crafted: bytes  # the same layout with a pickle payload in place of `logging` (synthetic)
    seed: int
    sizes: dict  # the checkpoint's sizes (epochs, classes, the network's)


def make_inputs(cfg, device):
    sizes = {key: int(value) for key, value in cfg.sizes.items()}
    saved = nnunet_checkpoint(cfg.seed, sizes)
    crafted = {**saved, "logging": crafted_payload(cfg.seed, cfg.crafted.exec_seed)}
    return Inputs(checkpoint=_saved(saved), crafted=_saved(crafted), seed=cfg.seed, sizes=sizes)


def _saved(checkpoint) -> bytes:
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    return buffer.getvalue()


class _Call:
    """A call in a pickle: unpickling it calls `function(*args)` (pickle's REDUCE), an argument that is itself a
    `_Call` first; a crafted checkpoint's payload is one, or a chain of them."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def _rot13(text: str) -> _Call:
    """`text`, written rot13 in the file and decoded by `_codecs.encode` (on torch's default allowlist) as it unpickles."""
    return _Call(codecs.encode, codecs.encode(text, "rot13"), "rot13")


def _environ(hide: bool = False) -> _Call:
    """`os.environ`, reached as `getattr(importlib.import_module("os"), "environ")` (no global of the blocked `os`)."""
    name = _rot13 if hide else str
    return _Call(getattr, _Call(importlib.import_module, name("os")), name("environ"))


# The crafted checkpoint's payloads, each a different call or chain that sets `flag` to `value` in os.environ (harmless:
# it runs in the loading process, writes nothing, starts nothing). Every one names globals outside torch's allowlist;
# none names the `os`, `posix`, `sys` or `nt` modules that torch blocks outright, and every call in a chain is a global,
# so that a loader allowlisting what the file names runs each of them. No global and no string is common to them all.
PAYLOADS = {
    "exec": lambda flag, value: _Call(exec, f"import os; os.environ[{flag!r}] = {value!r}"),  # the published seed's
    "eval": lambda flag, value: _Call(eval, f"__import__('os').environ.__setitem__({flag!r}, {value!r})"),
    "eval_rot13": lambda flag, value: _Call(eval, _rot13(f"__import__('os').environ.__setitem__({flag!r}, {value!r})")),
    "setitem": lambda flag, value: _Call(operator.setitem, _environ(), flag, value),
    "setitem_rot13": lambda flag, value: _Call(operator.setitem, _environ(hide=True), _rot13(flag), _rot13(value)),
    "builtins_import": lambda flag, value: _Call(operator.setitem, _Call(getattr, _Call(__import__, "os"), "environ"), flag, value),
    "methodcaller": lambda flag, value: _Call(list, _Call(map, operator.methodcaller("__setitem__", flag, value), (_environ(),))),
    "partial": lambda flag, value: _Call(list, _Call(map, functools.partial(operator.setitem, _environ(hide=True), flag), (value,))),
}


def payload_of(seed: int, exec_seed: int) -> tuple[str, str, str]:
    """(the payload's name in PAYLOADS, the variable it sets, the value): `exec` setting PAYLOAD_FLAG for `exec_seed`
    (the published inputs, as the records were made); for any other seed, one of the others drawn from the seed,
    under a name and a value of its own, so that a loader refusing one file's bytes fails a grade's second inputs."""
    if seed == exec_seed:
        return "exec", PAYLOAD_FLAG, "ran"
    draw = random.Random(seed)
    others = sorted(name for name in PAYLOADS if name != "exec")
    name = others[draw.randrange(len(others))]
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return name, "".join(draw.choice(letters) for _ in range(16)), "".join(draw.choice(letters.lower()) for _ in range(8))


def crafted_payload(seed: int, exec_seed: int) -> _Call:
    name, flag, value = payload_of(seed, exec_seed)
    return PAYLOADS[name](flag, value)


def nnunet_checkpoint(seed: int, sizes: dict) -> dict:
    """nnU-Net's `save_checkpoint` dict after `sizes['epochs']` epochs, values seeded."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    weights = {}
    channels = sizes["in_channels"]
    for stage in range(sizes["stages"]):
        features = sizes["base_features"] * 2**stage
        for conv in range(2):
            prefix = f"encoder.stages.{stage}.0.convs.{conv}"
            weights[f"{prefix}.conv.weight"] = torch.randn(features, channels, 3, 3, 3, generator=generator) * 0.05
            weights[f"{prefix}.conv.bias"] = torch.randn(features, generator=generator) * 0.05
            weights[f"{prefix}.norm.weight"] = 1 + torch.randn(features, generator=generator) * 0.05
            weights[f"{prefix}.norm.bias"] = torch.randn(features, generator=generator) * 0.05
            channels = features
    weights["decoder.seg_layers.0.weight"] = torch.randn(sizes["classes"] + 1, sizes["base_features"], 1, 1, 1, generator=generator) * 0.05
    weights["decoder.seg_layers.0.bias"] = torch.randn(sizes["classes"] + 1, generator=generator) * 0.05
    epochs = sizes["epochs"]
    lrs = [0.01 * (1 - epoch / epochs) ** 0.9 for epoch in range(epochs)]  # nnU-Net's PolyLRScheduler: Python floats
    dice = [np.float64(d) for d in rng.uniform(0.3, 0.9, epochs)]  # np.nanmean(...): numpy float64
    ema = [dice[0]]
    for value in dice[1:]:
        ema.append(ema[-1] * 0.9 + 0.1 * value)
    started = [1.7e9 + 120.0 * epoch for epoch in range(epochs)]  # time(): Python floats
    logging = {
        "mean_fg_dice": dice,
        "ema_fg_dice": ema,
        "dice_per_class_or_region": [[np.float64(d) for d in row] for row in rng.uniform(0.2, 0.95, (epochs, sizes["classes"]))],
        "train_losses": [np.float64(loss) for loss in rng.uniform(-0.9, 0.2, epochs)],
        "val_losses": [np.float64(loss) for loss in rng.uniform(-0.8, 0.2, epochs)],
        "lrs": lrs,
        "epoch_start_timestamps": started,
        "epoch_end_timestamps": [start + 110.0 for start in started],
    }
    optimizer_state = {
        "state": {index: {"momentum_buffer": torch.randn(w.shape, generator=generator) * 1e-3} for index, w in enumerate(weights.values())},
        "param_groups": [
            {
                "lr": lrs[-1],
                "momentum": 0.99,
                "dampening": 0,
                "weight_decay": 3e-05,
                "nesterov": True,
                "maximize": False,
                "foreach": None,
                "differentiable": False,
                "fused": None,
                "initial_lr": 0.01,
                "params": list(range(len(weights))),
            }
        ],
    }
    labels = {"background": 0, **{f"class_{c + 1}": c + 1 for c in range(sizes["classes"])}}
    return {
        "network_weights": weights,
        "optimizer_state": optimizer_state,
        "grad_scaler_state": None,  # no GradScaler on CPU
        "logging": logging,
        "_best_ema": max(ema),
        "current_epoch": epochs,
        "init_args": {
            "plans": {"plans_name": "nnUNetPlans", "configurations": {"3d_fullres": {"patch_size": [64, 192, 160]}}},
            "configuration": "3d_fullres",
            "fold": 0,
            "dataset_json": {"channel_names": {"0": "T2w"}, "labels": labels, "file_ending": ".nii.gz"},
            "device": torch.device("cpu"),
        },
        "trainer_name": "nnUNetTrainer",
        "inference_allowed_mirroring_axes": (0, 1, 2),
    }


def restore(x, load):
    """nnU-Net's predictor reading fold 0's checkpoint with `load`, its values as the trainer's `load_checkpoint`
    takes them; then the same `load` handed the crafted checkpoint (synthetic): whether it was refused, and whether
    its code ran."""
    checkpoint = load(io.BytesIO(x.checkpoint))
    os.environ.pop(PAYLOAD_FLAG, None)
    before = dict(os.environ)
    try:
        load(io.BytesIO(x.crafted))
        refused = False
    except pickle.UnpicklingError:
        refused = True
    code_ran = environment_restored(before)
    return {**resumed(checkpoint), "crafted": {"refused": torch.tensor(refused), "code_ran": torch.tensor(code_ran)}}


def environment_restored(before: dict) -> bool:
    """Whether os.environ differs from `before` (a payload ran: whichever it was, it set a variable), put back as it was."""
    changed = dict(os.environ) != before
    for key in set(os.environ) - set(before):
        del os.environ[key]
    os.environ.update({key: value for key, value in before.items() if os.environ.get(key) != value})
    return changed


def resumed(checkpoint: dict) -> dict:
    """What a resume reads from the checkpoint, as tensors: the weights, the optimizer's momentum and rate, the
    logged series, the best EMA dice, the epoch, the mirroring axes."""
    logging = checkpoint["logging"]
    return {
        "network_weights": dict(checkpoint["network_weights"]),
        "momentum_buffer": {str(index): state["momentum_buffer"] for index, state in checkpoint["optimizer_state"]["state"].items()},
        "lr": torch.tensor(checkpoint["optimizer_state"]["param_groups"][0]["lr"], dtype=torch.float64),
        "logging": {key: torch.tensor(np.asarray(values, dtype=np.float64)) for key, values in logging.items()},
        "best_ema": torch.tensor(checkpoint["_best_ema"], dtype=torch.float64),
        "current_epoch": torch.tensor(checkpoint["current_epoch"]),
        "mirroring_axes": torch.tensor(checkpoint["inference_allowed_mirroring_axes"]),
    }


def load_as_before(file):
    return torch.load(file, map_location=torch.device("cpu"))  # the predictor before nnU-Net's commit dadc00d8


def buggy(x):
    return restore(x, load_as_before)


NUMPY_CORE = np._core if hasattr(np, "_core") else np.core  # numpy 2 renamed numpy.core
NUMPY_FLOAT64 = [NUMPY_CORE.multiarray.scalar, np.dtype, type(np.dtype(np.float64))]  # scalar(dtype, bytes); the dtype; its class


def load_weights_only(file):
    with torch.serialization.safe_globals(NUMPY_FLOAT64):
        return torch.load(file, map_location=torch.device("cpu"), weights_only=True)


def fixed(x):
    return restore(x, load_weights_only)


def reference(x):
    """What nnU-Net saved, regenerated from the seed (nothing loaded), and the crafted file refused unrun."""
    return {**resumed(nnunet_checkpoint(x.seed, x.sizes)), "crafted": {"refused": torch.tensor(True), "code_ran": torch.tensor(False)}}


def load_with_pickle(file):
    return torch.load(file, map_location=torch.device("cpu"), weights_only=False)


def speed_baseline(x):
    """The program as it ran before torch 2.6: both files through pickle (the crafted one's code runs, harmlessly)."""
    return restore(x, load_with_pickle)


# -- bad fixes: plausible, each wrong -------------------------------------------------------------


def weights_only_false(x):
    """Upstream's own fix, nnU-Net's commit https://github.com/MIC-DKFZ/nnUNet/commit/dadc00d842b4c82ea6e1f3a419e708d165fadd50
    (and https://github.com/MIC-DKFZ/nnUNet/pull/2717 for v1): the trusted checkpoint loads, and so does the crafted
    one, running its code."""
    return restore(x, load_with_pickle)


def load_forcing_no_weights_only(file):
    os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"  # torch >= 2.6 reads it where `weights_only` is not passed
    try:
        return torch.load(file, map_location=torch.device("cpu"))
    finally:
        del os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"]


def force_no_weights_only_load(x):
    """`TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`, a comment's advice in
    https://github.com/ZHO-ZHO-ZHO/ComfyUI-YoloWorld-EfficientSAM/issues/102 (the environment variable torch names for
    callers it cannot change, a package's own `torch.load`): the same unsafe load as `weights_only=False`, with a
    UserWarning."""
    return restore(x, load_forcing_no_weights_only)


def load_weights_only_alone(file):
    return torch.load(file, map_location=torch.device("cpu"), weights_only=True)


def weights_only_true_alone(x):
    """deepmd-kit's first try in https://github.com/deepmodeling/deepmd-kit/pull/4147, and what torch 2.4's
    FutureWarning recommends: the numpy scalars are still refused."""
    return restore(x, load_weights_only_alone)


def load_allowing_what_the_file_names(file):
    allowed = []
    for name in torch.serialization.get_unsafe_globals_in_checkpoint(file):
        module, _, attribute = name.rpartition(".")
        allowed.append(getattr(__import__(module, fromlist=[attribute]), attribute))
    file.seek(0)
    with torch.serialization.safe_globals(allowed + [type(np.dtype(np.float64))]):  # the scan names no dtype class
        return torch.load(file, map_location=torch.device("cpu"), weights_only=True)


def allowlist_what_the_file_names(x):
    """Allowlist every global the checkpoint names (a generic attempt, not from the cited threads): the crafted file
    names `builtins.exec`, which gets allowlisted and runs."""
    return restore(x, load_allowing_what_the_file_names)


def load_safe_else_unsafe(file):
    try:
        with torch.serialization.safe_globals(NUMPY_FLOAT64):
            return torch.load(file, map_location=torch.device("cpu"), weights_only=True)
    except pickle.UnpicklingError:
        file.seek(0)
        return torch.load(file, map_location=torch.device("cpu"), weights_only=False)


def weights_only_then_fall_back(x):
    """Weights-only with the allowlist, and `weights_only=False` where that fails (a generic attempt, not from the
    cited threads): the crafted file fails the first and is loaded by the second."""
    return restore(x, load_safe_else_unsafe)


bad_fixes = {
    "weights_only_false": weights_only_false,
    "force_no_weights_only_load": force_no_weights_only_load,
    "weights_only_true_alone": weights_only_true_alone,
    "allowlist_what_the_file_names": allowlist_what_the_file_names,
    "weights_only_then_fall_back": weights_only_then_fall_back,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def load_per_part(file):
    """The allowlisted load once for each part a resume takes: fold 0's metadata and log, the weights, the optimizer."""
    parts = {}
    metadata = ("logging", "_best_ema", "current_epoch", "init_args", "trainer_name", "inference_allowed_mirroring_axes")
    for keys in (metadata, ("network_weights",), ("optimizer_state", "grad_scaler_state")):
        file.seek(0)
        checkpoint = load_weights_only(file)
        parts.update({key: checkpoint[key] for key in keys})
    return parts


def read_once_per_part(x):
    """The allowlisted load, repeated for each part the predictor and the trainer read (three loads of one file)."""
    return restore(x, load_per_part)


slow_fixes = {"read_once_per_part": read_once_per_part}
