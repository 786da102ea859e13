"""SpeechBrain hands torch.autocast its run_opts device ("cuda:0") where a device type belongs.

Upstream: https://github.com/speechbrain/speechbrain/issues/2881 (speechbrain 1.0.3: `Brain.__init__`
    builds `TorchAutocast(device_type=self.device, dtype=...)`); the attempted fixes in
    https://github.com/speechbrain/speechbrain/pull/2882 (first `self.device[-1]`, then "cuda..." ->
    "cuda", "cpu" -> "cpu", else raise, as merged in commit e2c4ba47);
    1.1.0 shipped that mapping without the raise: https://github.com/speechbrain/speechbrain/issues/3054,
    fixed by https://github.com/speechbrain/speechbrain/pull/3055 (1.1.1: 1.1.0's two branches kept and `else: self.device_type = self.device.split(":")[0]`, read from the 1.1.1 wheel's core.py).

Fidelity: faithful in the lines that decide the bug: each variant is one release's (or attempt's)
    device-type line, then `TorchAutocast` as `Brain.__init__` builds it (`torch.autocast` for fp16 and
    bf16 only), then one `fit_batch` (forward and loss inside the context, backward outside). A Brain
    is built for every string in `devices`, as each user would; the first trains on the harness device.
    Synthetic: the model (one seeded Linear layer) and the batch. Left out: GradScaler (fp16 on CUDA
    only), module placement, DDP, Brain's refusal of fp16 on "cpu" (in 1.1.0 that check is the first
    read of `device_type`; here the autocast line is). The real Brain of speechbrain 1.0.3, 1.1.0, 1.1.1
    and 1.1.2 runs in the upstream tier of tests/test_autocast_device.py (docs/autocast_device_versions.md).

Symptom on CUDA: when the Brain is built, with torch 2.3.1 (the issue's text; older torch not run):
        RuntimeError: User specified an unsupported autocast device_type 'cuda:0'
    From torch 2.4.0 autocast parses the string as a device and uses its type, so the same code runs
    and reproduce reports fixed_upstream. Seen with the real Brain and torch 2.3.1/2.4.1 on a machine
    without a GPU (torch.cuda.set_device stubbed); that "cuda:0" then autocasts CUDA matmuls on torch
    >= 2.4 is read from the autocast state (`torch.is_autocast_enabled("cuda")`). On an H200 (torch
    2.11.0+cu130) the buggy step runs clean (fixed_upstream), and the real Brain of speechbrain 1.1.2 with
    run_opts device "cuda:0" fits an fp16 batch (speechbrain 1.0.3 does not import with torchaudio 2.11:
    `module 'torchaudio' has no attribute 'list_audio_backends'`).

Symptom on CPU: the same for "cpu:0" when the Brain is built, with torch 2.3.1:
        RuntimeError: User specified an unsupported autocast device_type 'cpu:0'
    Not raised by 2.4.0, 2.4.1, 2.5.1, 2.6.0, 2.11.0 or 2.13.0: there the step runs in bf16 as asked.

Cause: `torch.autocast` takes a device type ("cuda"), a run_opts device is a device ("cuda:1").
    The fixes that followed matched strings by hand: `self.device[-1]` turned "cuda:0" into '0', and
    "cuda or cpu, else raise" refused cpu:0, mps and xpu:0; without the raise (1.1.0) those Brains have
    no `device_type`, an AttributeError at its first read.

Fix: take the type from the device, `torch.device(device).type`, for every string torch accepts.
    The step must then run in low precision inside the context and in float32 after it: both dtypes
    are part of the output, compared exactly, with each Brain's device type.
"""

import contextlib
from types import SimpleNamespace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = tuple(PRECISIONS.values())  # a dtype in the output is its index here
DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")  # a device type in the output is its index here, -1 if none

symptoms = {  # torch 2.4.0 made autocast accept a device string with an index (docs/autocast_device_versions.md)
    "cpu": Symptom("RuntimeError", r"unsupported autocast device_type 'cpu:\d+'", fixed_in="2.4.0"),
    "cuda": Symptom("RuntimeError", r"unsupported autocast device_type 'cuda:\d+'", fixed_in="2.4.0"),
}

compiled_unit = "the Brain's training step (`fit_batch`): forward under autocast, the loss and the backward"

# A device string ("cuda:0", "mps") or a non-type handed to torch.autocast where a device type belongs.
triage_signs = TriageSigns(
    family="torch.autocast refusing its device_type",
    cause="a device string with an index ('cuda:0') passed as autocast's device_type, which takes a type ('cuda')",
    confirm="the device_type in the torch.autocast call is a device with an index, or a variable holding one",
    also="an unknown device type string ('gpu', 'auto'), or a torch too old for the device (mps, xpu)",
    signs=(
        Sign("failure", r"unsupported autocast device_type", 0.9, "torch.autocast refused its device_type"),
        Sign(
            "failure",
            r"autocast device_type must be",
            0.9,
            "torch.autocast refused its device_type (the wording of torch 1.10 to 2.0: 'must be 'cuda' or 'cpu'')",
        ),
        Sign(
            "failure", r"device type at start of device string", 0.35, "a device string that is not a device (e.g. '0' from `device[-1]`)"
        ),
        Sign(
            "failure",
            r"Invalid device string: '\d+'",
            0.35,
            "a device string that is only an index ('0' from `device[-1]`), in torch >= 2.4's words",
        ),
        Sign(
            "failure",
            r"has no attribute 'device_type'",
            0.35,
            "an object built without a device type (speechbrain 1.1.0 on cpu:0 / mps / xpu)",
        ),
        Sign(
            "context",
            r"autocast_mode\.py.*\bin __init__\b|autocast\(device_type=|with torch\.autocast\(|amp\.autocast_mode\.autocast\(",
            0.4,
            "raised where torch.autocast is built",
        ),
        Sign("context", r"TorchAutocast|speechbrain/", 0.2, "SpeechBrain's autocast wrapper"),
    ),
)


class Inputs(NamedTuple):
    devices: tuple  # run_opts["device"] of each Brain; the first trains on the harness device
    dtype: torch.dtype  # run_opts["precision"]
    features: torch.Tensor  # (B, F)
    labels: torch.Tensor  # (B,)
    weight: torch.Tensor  # (C, F)
    bias: torch.Tensor  # (C,)


class Step(NamedTuple):
    device_types: torch.Tensor  # (len(devices),) each Brain's autocast device type
    inside_dtype: torch.Tensor  # () the logits' dtype: the requested precision
    outside_dtype: torch.Tensor  # () a matmul after the step: float32
    loss: torch.Tensor  # ()
    weight_grad: torch.Tensor  # (C, F)


def make_inputs(cfg, device):
    devices = tuple(cfg.devices[device])
    if torch.device(devices[0]).type != device:
        raise ValueError(f"devices.{device}[0] is {devices[0]!r}: the training Brain must be on {device}")
    generator = torch.Generator().manual_seed(cfg.seed)
    sizes = cfg.sizes
    return Inputs(
        devices=devices,
        dtype=PRECISIONS[cfg.precision[device]],
        features=torch.randn(sizes.batch, sizes.features, generator=generator).to(device),
        labels=torch.randint(0, sizes.classes, (sizes.batch,), generator=generator).to(device),
        weight=(torch.randn(sizes.classes, sizes.features, generator=generator) / sizes.features**0.5).to(device),
        bias=torch.zeros(sizes.classes).to(device),
    )


class Brain(SimpleNamespace):
    """What `Brain.__init__` keeps here: `device` (run_opts), `device_type`, `training_ctx`."""


def build_brain(device, dtype, set_device_type):
    brain = Brain(device=device)
    set_device_type(brain)
    brain.training_ctx = torch.autocast(device_type=brain.device_type, dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()
    return brain


def fit_batch(x, brain):
    weight = x.weight.clone().requires_grad_()
    with brain.training_ctx:
        logits = F.linear(x.features, weight, x.bias)  # (B, C)
        loss = F.cross_entropy(logits, x.labels)
    loss.backward()
    outside = x.features @ weight.detach().T  # (B, C)
    return logits.dtype, outside.dtype, loss.detach(), weight.grad


def train(x, set_device_type):
    brains = [build_brain(device, x.dtype, set_device_type) for device in x.devices]
    inside, outside, loss, grad = fit_batch(x, brains[0])
    return Step(type_codes([brain.device_type for brain in brains], x), dtype_code(inside, x), dtype_code(outside, x), loss, grad)


def type_codes(device_types, x):
    return torch.tensor([DEVICE_TYPES.index(t) if t in DEVICE_TYPES else -1 for t in device_types], device=x.features.device)


def dtype_code(dtype, x):
    # a fill on the device, not torch.tensor(..., device=cuda): that copies from the host and waits for the GPU,
    # twice a timed step (seen on an H200: the fp16 step 1.41x the float32 one, its GPU time 0.5x; 0.44x since)
    return torch.full((), DTYPES.index(dtype), dtype=torch.int64, device=x.features.device)


# -- the device-type line, release by release ------------------------------------------------


def full_string(brain):
    """speechbrain 1.0.3: `TorchAutocast(device_type=self.device, ...)`."""
    brain.device_type = brain.device


def from_torch_device(brain):
    """The fix: torch parses the device and names its type."""
    brain.device_type = torch.device(brain.device).type


def last_char(brain):
    """The first commit of https://github.com/speechbrain/speechbrain/pull/2882: "cuda:0" -> '0'."""
    if brain.device == "cpu":
        brain.device_type = "cpu"
    elif "cuda" in brain.device:
        brain.device_type = "cuda" if brain.device == "cuda" else brain.device[-1]
    else:
        raise ValueError("Expected `self.device` to be `cpu` or `cuda`!")


def cuda_or_raise(brain):
    """https://github.com/speechbrain/speechbrain/pull/2882 as merged: cpu:0, mps, xpu... raise."""
    if brain.device == "cpu":
        brain.device_type = "cpu"
    elif "cuda" in brain.device:
        brain.device_type = "cuda"
    else:
        raise ValueError("Expected `self.device` to be `cpu` or `cuda`!")


def cuda_or_nothing(brain):
    """speechbrain 1.1.0, as https://github.com/speechbrain/speechbrain/issues/3054 reports it: the raise dropped,
    cpu:0, mps, xpu... get no device_type."""
    if brain.device == "cpu":
        brain.device_type = "cpu"
    elif "cuda" in brain.device:
        brain.device_type = "cuda"


def buggy(x):
    return train(x, full_string)


def fixed(x):
    return train(x, from_torch_device)


def reference(x):
    types = type_codes([device.split(":")[0] for device in x.devices], x)  # speechbrain 1.1.1's parse
    return Step(types, *speed_reference(x))


def speed_reference(x):
    """The training step, autocast spelled out: a linear in the low dtype, the loss in float32 (autocast's lists)."""
    weight = x.weight.clone().requires_grad_()
    logits = F.linear(x.features.to(x.dtype), weight.to(x.dtype), x.bias.to(x.dtype))
    loss = F.cross_entropy(logits.float(), x.labels)
    loss.backward()
    return dtype_code(x.dtype, x), dtype_code(torch.float32, x), loss.detach(), weight.grad


def speed_candidate(x):
    """The fixed Brain's training step, as `Step` fields past the device types."""
    inside, outside, loss, grad = fit_batch(x, build_brain(x.devices[0], x.dtype, from_torch_device))
    return dtype_code(inside, x), dtype_code(outside, x), loss, grad


def speed_baseline(x):
    """The same step in float32: what a user who set precision=fp32 to get past the error trains with."""
    return fit_batch(x, build_brain(x.devices[0], torch.float32, from_torch_device))


bad_fixes = {
    "last_char": lambda x: train(x, last_char),
    "cuda_or_raise": lambda x: train(x, cuda_or_raise),
    "cuda_or_nothing": lambda x: train(x, cuda_or_nothing),
}


# -- slow fixes: the fixed step, slower than mixed precision should be ----------------------


def batch_through_the_host(x):
    """The fixed Brain's step on a batch that took a round trip through the host (numpy) first."""
    features = torch.from_numpy(x.features.cpu().numpy().copy()).to(x.features.device)
    inside, outside, loss, grad = fit_batch(x._replace(features=features), build_brain(x.devices[0], x.dtype, from_torch_device))
    return dtype_code(inside, x), dtype_code(outside, x), loss, grad


slow_fixes = {
    "batch_through_the_host": batch_through_the_host
}  # judged where a budget is set: on CUDA (fixed low-precision step / float32 step)
