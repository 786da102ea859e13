"""Which part of a grade's confinement (harness/process/confine.py) stops CUDA, each tried in a fresh process.

python tools/cuda_confine_probe.py
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.process import confine  # noqa: E402


def _try(variant: str, device: str, queue) -> None:
    import torch

    scratch = tempfile.mkdtemp()
    try:
        if variant == "data rlimit":
            resource.setrlimit(resource.RLIMIT_DATA, (16 << 30, 16 << 30))
        elif variant == "landlock":
            confine._landlock((scratch,))
        elif variant.startswith("confine_child"):
            confine.confine_child(scratch, confine.Limits(gpu=variant.endswith("gpu opened first")), scratch + "/refused")
        a = torch.ones(1 << 28, device=device)  # 1 GiB after the confinement
        queue.put(f"{variant:32s} ok: {float(a.sum()):.0f}, devices {torch.cuda.device_count() if device == 'cuda' else 0}")
    except Exception as error:  # noqa: BLE001
        queue.put(f"{variant:32s} FAILS: {type(error).__name__}: {str(error)[:160]}")


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    context = multiprocessing.get_context("spawn")
    for variant in ("none", "data rlimit", "landlock", "confine_child", "confine_child, gpu opened first"):
        queue = context.Queue()
        process = context.Process(target=_try, args=(variant, device, queue))
        process.start()
        process.join(120)
        print(queue.get() if not queue.empty() else f"{variant:32s} no answer (exit {process.exitcode})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
