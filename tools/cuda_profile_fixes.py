"""Profile the fixes that missed their CUDA speed budgets (issue 50, item 1), before and after, in one run.

    python tools/cuda_profile_fixes.py [--out profile.json] [--rounds N] [case ...]

For each case, on the CUDA speed inputs of its yaml (`speed.inputs`, then `speed.device_inputs.cuda`), each
variant is timed per call as the harness's speed phase times it (a synchronised call, the variants interleaved,
the median of many rounds), and profiled once: kernels launched, host syncs and copies, the GPU's own time.
"Before" is the fix (or the baseline) as it stood until 2026-11-27, spelled out here; "after" is the case's
code now. Needs a GPU; prints one table per case and writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.cases import load_case  # noqa: E402

RUNTIME_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaMemcpyAsync",
    "cudaStreamIsCapturing",
)


DEVICE = "cuda"  # --device cpu: a smoke test of this script where no GPU is


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def speed_inputs(name: str):
    case_cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "case" / f"{name}.yaml")
    cfg = OmegaConf.merge(
        case_cfg, OmegaConf.select(case_cfg, "speed.inputs") or {}, OmegaConf.select(case_cfg, f"speed.device_inputs.{DEVICE}") or {}
    )
    return load_case(name).make_inputs(cfg, DEVICE), cfg


def per_call_ms(variants: dict[str, Callable], x: Any, rounds: int = 200, warmup: int = 20) -> dict[str, dict[str, float]]:
    """Each variant called and synchronised, interleaved round by round: median and quartiles in ms."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(warmup + rounds):
        for name, function in variants.items():
            sync()
            start = time.perf_counter()
            function(x)
            sync()
            if round_ >= warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    out = {}
    for name, samples in times.items():
        q = statistics.quantiles(samples, n=4) if len(samples) > 1 else samples * 3
        out[name] = {"median_ms": statistics.median(samples), "q1_ms": q[0], "q3_ms": q[2]}
    return out


def back_to_back_ms(function: Callable, x: Any, calls: int = 200) -> float:
    """Calls queued without a sync between them: what launch pipelining leaves (a training loop's view)."""
    for _ in range(min(10, calls)):
        function(x)
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        function(x)
    sync()
    return (time.perf_counter() - start) * 1e3 / calls


def profile_once(function: Callable, x: Any) -> dict[str, Any]:
    """One call under torch.profiler: kernels (and copies) on the GPU with their time, and the runtime calls."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        function(x)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])) as prof:
        function(x)
        sync()
    kernels: dict[str, int] = {}
    gpu_us = 0.0
    runtime: dict[str, int] = {}
    for event in prof.events():
        device_type = str(getattr(event, "device_type", ""))
        if device_type.endswith("CUDA"):
            kernels[event.name[:80]] = kernels.get(event.name[:80], 0) + 1
            gpu_us += getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0) or 0.0
        elif event.name in RUNTIME_CALLS:
            runtime[event.name] = runtime.get(event.name, 0) + 1
    return {"gpu_ops": sum(kernels.values()), "gpu_us": round(gpu_us, 1), "ops": kernels, "runtime_calls": runtime}


def measure(name: str, variants: dict[str, Callable], ratios: dict[str, tuple[str, str]], rounds: int = 200) -> dict[str, Any]:
    x, _ = speed_inputs(name)
    timed = per_call_ms(variants, x, rounds=rounds, warmup=max(1, rounds // 10))
    result: dict[str, Any] = {"case": name, "variants": {}}
    for variant, function in variants.items():
        result["variants"][variant] = {
            **timed[variant],
            "back_to_back_ms": back_to_back_ms(function, x, calls=rounds),
            **profile_once(function, x),
        }
    result["ratios"] = {label: timed[a]["median_ms"] / timed[b]["median_ms"] for label, (a, b) in ratios.items()}
    return result


# -- embedding_oob ---------------------------------------------------------------------------------


def embedding_variants():
    case = load_case("embedding_oob")

    def guard_on_values(x):  # the fix until 2026-11-27: four kernels on the bins every call
        bins = torch.bucketize(x.features, x.bin_edges)
        rows = x.table_by_bins.shape[0]
        torch._assert_async(((bins >= 0) & (bins < rows)).all(), f"embedding index outside [0, {rows})")
        return F.embedding(bins, x.table_by_bins)

    def leanest_value_guard(x):  # the fewest kernels a guard on the values can take (bucketize's bins are >= 0)
        bins = torch.bucketize(x.features, x.bin_edges)
        torch._assert_async(bins.amax() < x.table_by_bins.shape[0])
        return F.embedding(bins, x.table_by_bins)

    def forward_before(x):
        return case.diffusion_conv(guard_on_values(x), x.conv_weight)

    variants = {
        "baseline (no guard)": case.speed_baseline,
        "before: guard on the values": guard_on_values,
        "floor: leanest guard on the values": leanest_value_guard,
        "after: guard on the shapes": case.speed_candidate,
        "forward before": forward_before,
        "forward after (fixed)": case.fixed,
    }
    ratios = {
        "before / baseline": ("before: guard on the values", "baseline (no guard)"),
        "floor / baseline": ("floor: leanest guard on the values", "baseline (no guard)"),
        "after / baseline": ("after: guard on the shapes", "baseline (no guard)"),
        "forward before / forward after": ("forward before", "forward after (fixed)"),
    }
    return variants, ratios


# -- class_weight_index ----------------------------------------------------------------------------


def class_weight_variants():
    case = load_case("class_weight_index")

    def plain_fused(x):  # the baseline until 2026-11-27: the fused call without mmseg's wrapper
        return F.cross_entropy(x.pred, x.label, weight=x.class_weight, ignore_index=x.ignore_index)

    def wrapper_weights_made_once(x):  # what the wrapper would cost with its class-weight tensor made once
        loss = copy.copy(x.loss)
        loss.cls_criterion = lambda pred, label, weight=None, class_weight=None, ignore_index=-100, **_: F.cross_entropy(
            pred, label, weight=x.class_weight, ignore_index=ignore_index
        )
        return loss(x.pred, x.label, ignore_index=x.ignore_index)

    variants = {
        "before: baseline, fused call alone": plain_fused,
        "after: baseline, fused call in mmseg's wrapper": case.speed_baseline,
        "wrapper, weights not remade": wrapper_weights_made_once,
        "fix": case.fixed,
    }
    ratios = {
        "fix / fused call alone (before)": ("fix", "before: baseline, fused call alone"),
        "fix / fused call in the wrapper (after)": ("fix", "after: baseline, fused call in mmseg's wrapper"),
        "wrapper floor / fused call alone": ("after: baseline, fused call in mmseg's wrapper", "before: baseline, fused call alone"),
        "wrapper without the weight copy / fused call alone": ("wrapper, weights not remade", "before: baseline, fused call alone"),
    }
    return variants, ratios


# -- autocast_device -------------------------------------------------------------------------------


def autocast_variants():
    case = load_case("autocast_device")

    def dtype_code_from_host(dtype, x):  # until 2026-11-25 (0cdcd65): torch.tensor(..., device=cuda), a host copy that waits
        return torch.tensor(case.DTYPES.index(dtype), device=x.features.device)

    def candidate_before(x):
        inside, outside, loss, grad = case.fit_batch(x, case.build_brain(x.devices[0], x.dtype, case.from_torch_device))
        return dtype_code_from_host(inside, x), dtype_code_from_host(outside, x), loss, grad

    variants = {
        "baseline (float32 step)": case.speed_baseline,
        "before: dtype codes from the host": candidate_before,
        "after: dtype codes filled on the GPU": case.speed_candidate,
    }
    ratios = {
        "before / baseline": ("before: dtype codes from the host", "baseline (float32 step)"),
        "after / baseline": ("after: dtype codes filled on the GPU", "baseline (float32 step)"),
    }
    return variants, ratios


PROFILES = {"embedding_oob": embedding_variants, "class_weight_index": class_weight_variants, "autocast_device": autocast_variants}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=list(PROFILES), metavar="case")
    parser.add_argument("--out", type=Path, default=Path("cuda_profile.json"))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke test of this script")
    parser.add_argument("--rounds", type=int, default=200, help="timed calls of each variant, interleaved")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this profile needs a GPU", file=sys.stderr)
        return 3
    report = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cases": [],
    }
    for name in args.cases:
        try:
            variants, ratios = PROFILES[name]()
            result = measure(name, variants, ratios, rounds=args.rounds)
        except Exception as error:  # noqa: BLE001 - one case's failure must not lose the others' figures
            result = {"case": name, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        report["cases"].append(result)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"\n== {name} on {report['device']} (torch {report['torch']})")
        if "error" in result:
            print("  error:", result["error"])
            continue
        for variant, figures in result["variants"].items():
            print(
                f"  {variant:52s} {figures['median_ms']:8.4f} ms [{figures['q1_ms']:.4f}, {figures['q3_ms']:.4f}]  back-to-back {figures['back_to_back_ms']:.4f} ms"
                f"  gpu ops {figures['gpu_ops']:3d}  gpu {figures['gpu_us']:8.1f} us  runtime {figures['runtime_calls']}"
            )
        for label, ratio in result["ratios"].items():
            print(f"  {label:52s} {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
