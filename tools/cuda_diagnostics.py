"""Questions the first CUDA records raised, answered on the GPU (python tools/cuda_diagnostics.py <question>).

- target_oob_line: which kernel asserts when target_out_of_bounds's buggy loss runs, and what it prints
  (CUDA_LAUNCH_BLOCKING=1, in a child so the poisoned context dies with it);
- tf32: backward_twice's fix against its float64 reference with cuDNN's TF32 on (torch's default) and off;
- autocast_profile: autocast_device's timed step in fp16, bf16 and float32, kernel by kernel;
- codebook_compiled: codebook_oob's fix compiled against eager on the same inputs, with SNAC's noise on and off.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("DIAG_DEVICE", "cuda")  # cpu: a dry run of the questions that can run there
sys.path.insert(0, str(ROOT))


def case_and_inputs(name, **overrides):
    import torch
    from omegaconf import OmegaConf

    from harness.cases import load_case

    cfg = OmegaConf.load(ROOT / "conf" / "case" / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    torch.manual_seed(0)
    case = load_case(name)
    return case, cfg, case.make_inputs(cfg, DEVICE)


def target_oob_line():
    if os.environ.get("CUDA_LAUNCH_BLOCKING") != "1":
        child = subprocess.run(
            [sys.executable, __file__, "target_oob_line"],
            env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = (child.stdout + child.stderr).splitlines()
        print(f"exit {child.returncode}; {len(lines)} lines; distinct assertion lines:")
        seen = {line.split("block:")[0] + (line.split("Assertion")[-1] if "Assertion" in line else "") for line in lines if "ssert" in line}
        print("\n".join(sorted(seen)[:10]))
        print("\n".join(lines[-25:]))
        return
    case, cfg, x = case_and_inputs("target_out_of_bounds")
    case.buggy(x)
    import torch

    torch.cuda.synchronize()


def tf32():
    import torch

    from harness.measure.compare import compare

    case, cfg, x = case_and_inputs("backward_twice")
    want = case.reference(case.make_inputs(cfg, DEVICE))
    for allow in (True, False):
        torch.backends.cudnn.allow_tf32 = allow
        got = case.fixed(case.make_inputs(cfg, DEVICE))
        figures = compare(got, want, atol=1e-5, rtol=1e-4)
        print(f"cudnn.allow_tf32={allow}: match={figures['match']} max|diff|={figures.get('max_abs_diff')}")


def autocast_profile():
    import torch
    from torch.profiler import ProfilerActivity, profile

    case, cfg, x = case_and_inputs("autocast_device", **{"sizes.batch": 1024, "sizes.features": 2048, "sizes.classes": 2048})
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("float32", torch.float32)):
        step = (lambda: case.speed_baseline(x)) if dtype == torch.float32 else (lambda: case.speed_candidate(x._replace(dtype=dtype)))
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            step()
        end.record()
        torch.cuda.synchronize()
        print(f"{name}: {start.elapsed_time(end) / 50:.3f} ms per step (CUDA events, 50 steps)")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


def codebook_compiled():
    import torch
    import torch._inductor.config as inductor_config

    from harness.measure.compare import compare

    inductor_config.fallback_random = True
    case, cfg, x = case_and_inputs("codebook_oob")
    eager = case.fixed(x)
    compiled = torch.compile(case.fixed, backend="inductor")
    started = time.monotonic()
    got = compiled(x)
    print(f"compiled in {time.monotonic() - started:.1f} s")
    figures = compare(got, eager, atol=1e-6, rtol=0.0)
    print(f"noise on: compiled vs eager match={figures['match']} max|diff|={figures.get('max_abs_diff')}")
    again = compiled(x)
    print(f"noise on: compiled twice match={compare(again, got, atol=1e-6, rtol=0.0)['match']}")
    for module in x.snac.modules():
        if type(module).__name__ == "NoiseBlock":
            module.forward = lambda h: h
    torch._dynamo.reset()
    eager = case.fixed(x)
    got = torch.compile(case.fixed, backend="inductor")(x)
    figures = compare(got, eager, atol=1e-6, rtol=0.0)
    print(f"noise off: compiled vs eager match={figures['match']} max|diff|={figures.get('max_abs_diff')}")


if __name__ == "__main__":
    for question in sys.argv[1:]:
        print(f"##### {question}", flush=True)
        try:
            globals()[question]()
        except Exception as error:  # noqa: BLE001 - one question's failure does not stop the others
            print(f"{question} raised {type(error).__name__}: {error}")
        sys.stdout.flush()
