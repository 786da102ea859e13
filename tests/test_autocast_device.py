"""autocast_device in two tiers.

Minimal tier (any env, CI): `torch.autocast` with full device strings, the device-type line of each
speechbrain release and attempted fix, and the case through the harness.

Upstream tier (where `import speechbrain` works): the real `speechbrain.core.Brain`, built with
run_opts device and precision, fitting one batch on CPU strings. speechbrain needs torchaudio, which
PyPI has only as CUDA builds matching one torch each, so this tier runs from the venvs of
docs/autocast_device_versions.md, e.g.

    cd /work/main && PYTHONPATH=/work/envs/speechbrain/1.0.3 /work/envs/sb-torch2.3/bin/python -m pytest tests/test_autocast_device.py -q

`python tests/test_autocast_device.py` prints this env's rows of the version table in that file.
"""

import contextlib
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cases import autocast_device as case  # noqa: E402
from harness.measure.compare import compare  # noqa: E402
from tests.conftest import requires_cuda  # noqa: E402

try:
    import speechbrain
except Exception as error:  # noqa: BLE001 - torchaudio may be missing, or present and fail to load (OSError)
    speechbrain, SPEECHBRAIN_ERROR = None, f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"

DEVICE_STRINGS = ("cuda", "cuda:0", "cuda:1", "cpu", "cpu:0", "mps", "xpu:0")
TORCH = torch.__version__  # a TorchVersion: compares with "2.4" as a version


def torch_rejects(device_type):
    """Whether `torch.autocast(device_type=...)` raises "unsupported autocast device_type", as measured.

    torch <= 2.3 compares the string with a fixed list of types (privateuse1 aside); from 2.4.0 it
    parses it as a device (index allowed); mps autocast exists from 2.5. Versions 2.7 to 2.10 were not
    installed: interpolated.
    """
    if TORCH < "2.4":
        return device_type not in ("cuda", "cpu", "xpu", "ipu", "hpu", "xla")
    if TORCH < "2.5":
        return torch.device(device_type).type == "mps"
    return False


def cuda_else_cpu(brain):
    """The one-liner from nanoGPT (karpathy/nanoGPT#27), often copied: mps and xpu silently autocast the CPU."""
    brain.device_type = "cuda" if "cuda" in brain.device else "cpu"


MAPPINGS = {
    "full_string": case.full_string,
    "from_torch_device": case.from_torch_device,
    "last_char": case.last_char,
    "cuda_or_raise": case.cuda_or_raise,
    "cuda_or_nothing": case.cuda_or_nothing,
    "cuda_else_cpu": cuda_else_cpu,
}
# The strings for which each line yields no device type, or the wrong one (full_string: a device, not a type).
BREAKS = {
    "full_string": {"cuda:0", "cuda:1", "cpu:0", "xpu:0"},
    "from_torch_device": set(),
    "last_char": {"cuda:0", "cuda:1", "cpu:0", "mps", "xpu:0"},
    "cuda_or_raise": {"cpu:0", "mps", "xpu:0"},
    "cuda_or_nothing": {"cpu:0", "mps", "xpu:0"},
    "cuda_else_cpu": {"mps", "xpu:0"},
}


# -- minimal tier --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICE_STRINGS)
def test_torch_autocast_takes_full_string_only_from_2_4(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available ... Disabling autocast"
        try:
            with torch.autocast(device_type=device, dtype=torch.float16):
                pass
            raised = None
        except RuntimeError as error:
            raised = str(error)
    if torch_rejects(device):
        assert raised == f"User specified an unsupported autocast device_type '{device}'"
    else:
        assert raised is None


@pytest.mark.parametrize("name", MAPPINGS)
@pytest.mark.parametrize("device", DEVICE_STRINGS)
def test_which_strings_each_device_type_line_breaks(name, device):
    brain = case.Brain(device=device)
    try:
        MAPPINGS[name](brain)
        broken = brain.device_type != torch.device(device).type
    except (ValueError, AttributeError):
        broken = True
    assert broken == (device in BREAKS[name])


def test_cuda_or_nothing_fails_later_with_attribute_error():
    with pytest.raises(AttributeError, match="'Brain' object has no attribute 'device_type'"):
        case.build_brain("mps", torch.bfloat16, case.cuda_or_nothing)


@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fixed_step_runs_in_low_precision_and_leaves_it(device, precision):
    x = case.make_inputs(case_config(devices=[device], precision=precision), "cpu")
    got = case.fixed(x)
    assert case.DTYPES[got.inside_dtype] == case.PRECISIONS[precision]
    assert case.DTYPES[got.outside_dtype] == torch.float32
    assert compare(got, case.reference(x), atol=1e-6, rtol=1e-5)["match"]


@pytest.mark.filterwarnings("ignore:.*CUDA is not available")  # the cuda:1 Brain on a machine without CUDA
def test_buggy_fails_where_torch_rejects_the_string():
    x = case.make_inputs(case_config(), "cpu")
    if torch_rejects(x.devices[0]):
        with pytest.raises(RuntimeError, match=case.symptoms["cpu"].message):
            case.buggy(x)
    else:
        buggy, fixed = case.buggy(x), case.fixed(x)  # same step; only the recorded device_types differ ("cpu:0" is no type)
        assert compare(buggy[1:], fixed[1:], atol=0, rtol=0)["match"]


def test_harness_phases_on_cpu(tmp_path):
    from hydra import compose, initialize_config_dir

    from harness.run import run_case

    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "conf")):
        cfg = compose("config", overrides=["case=autocast_device", "device=cpu", "phases=[reproduce,fix,correct,bad_fixes]"])
    record, _ = run_case(cfg, "cpu", tmp_path, {})
    status = {phase.phase: phase.status for phase in record.phases}
    assert status.pop("reproduce") == ("reproduced" if torch_rejects("cpu:0") else "fixed_upstream")
    assert status == {"fix": "passed", "correct": "passed", **{f"bad_fix:{name}": "rejected" for name in case.bad_fixes}}


def case_config(**overrides):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(ROOT / "conf" / "case" / "autocast_device.yaml")
    if "devices" in overrides:
        cfg.devices.cpu = overrides["devices"]
    if "precision" in overrides:
        cfg.precision.cpu = overrides["precision"]
    return cfg


# -- upstream tier: the real speechbrain Brain ---------------------------------------------

needs_speechbrain = pytest.mark.skipif(
    speechbrain is None,
    reason=f"upstream tier: speechbrain does not import here ({SPEECHBRAIN_ERROR if speechbrain is None else ''}); "
    "run pytest from a venv of docs/autocast_device_versions.md",
)


def speechbrain_device_type(version, device):
    """The string each release hands torch.autocast; None where it sets no device_type at all."""
    if version == "1.0.3":
        return device
    if version == "1.1.0":
        return "cpu" if device == "cpu" else "cuda" if "cuda" in device else None
    return device.split(":")[0]  # 1.1.1, 1.1.2 (PR #3055)


@contextlib.contextmanager
def without_cuda_set_device():
    """Brain calls torch.cuda.set_device for cuda strings before it builds autocast; no GPU here."""
    set_device = torch.cuda.set_device
    torch.cuda.set_device = lambda device: None
    try:
        yield
    finally:
        torch.cuda.set_device = set_device


def run_brain(device, precision, fit=None):
    """Build the real Brain with run_opts device and precision; fit one batch on a CPU string, or where `fit`.

    Returns the logits' dtype in the step (None when only built), or raises what Brain raised.
    """
    import speechbrain as sb

    class TinyBrain(sb.Brain):
        def compute_forward(self, batch, stage):
            logits = self.modules.model(batch[0].to(self.device))
            self.logits_dtype = logits.dtype
            return logits

        def compute_objectives(self, logits, batch, stage):
            return F.cross_entropy(logits, batch[1].to(self.device))

    fit = torch.device(device).type == "cpu" if fit is None else fit
    modules = {"model": torch.nn.Linear(32, 8)} if fit else {}  # nothing to move to an absent device
    with warnings.catch_warnings(), contextlib.nullcontext() if fit else without_cuda_set_device():
        warnings.simplefilter("ignore")
        run_opts = {"device": device, "precision": precision}
        brain = TinyBrain(modules, opt_class=lambda params: torch.optim.SGD(params, lr=0.1), run_opts=run_opts)
        if not fit:
            return None
        brain.init_optimizers()
        generator = torch.Generator().manual_seed(0)
        brain.fit_batch((torch.randn(16, 32, generator=generator), torch.randint(0, 8, (16,), generator=generator)))
    return brain.logits_dtype


@needs_speechbrain
@pytest.mark.parametrize("device", ["cpu", "cpu:0"])
def test_brain_fits_a_bf16_batch_or_fails_as_recorded(device):
    passed = speechbrain_device_type(speechbrain.__version__, device)
    if passed is None:
        with pytest.raises(AttributeError, match="object has no attribute 'device_type'"):
            run_brain(device, "bf16")
    elif torch_rejects(passed):
        with pytest.raises(RuntimeError, match=f"unsupported autocast device_type '{passed}'"):
            run_brain(device, "bf16")
    else:
        assert run_brain(device, "bf16") == torch.bfloat16


@needs_speechbrain
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1", "mps", "xpu:0"])
def test_brain_builds_its_autocast_or_fails_as_recorded(device):
    """Only the device-type handling: with no such device here, other torch errors may follow it."""
    passed = speechbrain_device_type(speechbrain.__version__, device)
    try:
        run_brain(device, "fp16")
        raised = None
    except Exception as error:  # noqa: BLE001
        raised = f"{type(error).__name__}: {error}"
    if passed is None:
        assert raised is not None and "object has no attribute 'device_type'" in raised
    elif torch_rejects(passed):
        assert raised == f"RuntimeError: User specified an unsupported autocast device_type '{passed}'"
    else:
        assert raised is None or not ("device_type" in raised or "unsupported autocast" in raised), raised


@requires_cuda
@needs_speechbrain
@pytest.mark.cuda
def test_brain_fits_an_fp16_batch_on_cuda_0():
    """Upstream's own setting on a real GPU: run_opts device `cuda:0`, fp16, one batch through fit_batch."""
    passed = speechbrain_device_type(speechbrain.__version__, "cuda:0")
    if torch_rejects(passed):
        with pytest.raises(RuntimeError, match=f"unsupported autocast device_type '{passed}'"):
            run_brain("cuda:0", "fp16", fit=True)
    else:
        assert run_brain("cuda:0", "fp16", fit=True) == torch.float16


def autocast_rows():
    """This env's rows of docs/autocast_device_versions.md: `torch.autocast(device_type=<string>)` alone."""
    for device in DEVICE_STRINGS:
        for precision in ("fp16", "bf16"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    device_type = torch.device(device).type
                    with torch.autocast(device_type=device, dtype=case.PRECISIONS[precision]):
                        product = torch.ones(2, 2) @ torch.ones(2, 2)  # a CPU matmul
                        on = autocast_enabled(device_type)
                    matmul = str(product.dtype).removeprefix("torch.")
                    outcome = f"accepted; autocast on for {device_type}: {on}; CPU matmul inside: {matmul}"
                except Exception as error:  # noqa: BLE001
                    outcome = f"`{type(error).__name__}: {str(error).strip().splitlines()[0]}`"
            said = "; ".join(" ".join(str(w.message).split()) for w in caught)
            yield f"| {TORCH} | `{device}` | {precision} | {outcome} |" + (f" warns: {said} |" if said else " |")


def autocast_enabled(device_type):
    try:
        return torch.is_autocast_enabled(device_type)  # torch >= 2.4
    except TypeError:
        return {"cuda": torch.is_autocast_enabled, "cpu": torch.is_autocast_cpu_enabled}[device_type]()


def matrix_rows():
    """This env's rows of docs/autocast_device_versions.md: the real Brain per device string and precision."""
    version = speechbrain.__version__ if speechbrain else f"does not import ({SPEECHBRAIN_ERROR})"
    for device in DEVICE_STRINGS:
        for precision in ("fp16", "bf16"):
            if speechbrain is None:
                outcome = "-"
            else:
                try:
                    dtype = run_brain(device, precision)
                    outcome = "built" if dtype is None else f"fit_batch ran, logits {str(dtype).removeprefix('torch.')}"
                except Exception as error:  # noqa: BLE001
                    outcome = f"`{type(error).__name__}: {str(error).strip().splitlines()[0]}`"
            yield f"| {TORCH} | {version} | `{device}` | {precision} | {outcome} |"
            if speechbrain is None:
                return


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    print("\n".join(autocast_rows()))
    print()
    print("\n".join(matrix_rows()))
