"""How much of its tolerance each case's own fix uses, over many seeds: a grade judges a submission on inputs from
seeds drawn for it alone (`correct:second_inputs`, the timed outputs), so a tolerance that holds on the yaml's seed
and not on some other rejects a right fix by chance (issue 45: upstream's own fix rejected in CI).

    python -m harness.seed_sweep                          # every case, eager, CPU, 200 seeds or 120 s a case
    python -m harness.seed_sweep --cases clip_before_unscale --seeds 1000 --max-s 900

For each case and each seed, in a child of its own (bounded in time; a case that crashes costs its own line), the
model solution `fixed` against `reference` on the case's inputs and on its speed inputs (the timed outputs' inputs),
as the correct phase compares them; the figure is `tolerance_used`, the worst element's |diff| over its allowance
(1.0: exactly at the line). A case holds when its worst over the seeds is at most 1 / MARGIN: a right fix written
another way rounds differently, and must pass too. One line a case; exit 1 if any case failed on a seed or is thin.
With `--out`, the lines are also written as JSON, with the torch version.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cases import CASE_CONFIG_DIR, case_names
from harness.phases.common import FIXED, speed_config
from harness.phases.correct import compare_in_child
from harness.process.isolate import run_isolated

MARGIN = 2.0  # the model solution's worst seed uses at most half its tolerance
FIRST_SEED = 1000  # past the yaml's seeds (0-9 in the cases' docstrings): seeds no case was tuned on


@dataclass(frozen=True)
class Sweep:
    case: str
    seeds: int  # seeds run (each on both input sets where the case has speed inputs)
    worst: float | None  # the largest tolerance_used; None where no seed ran
    worst_seed: int | None
    worst_inputs: str  # "case" or "speed"
    worst_output: str  # the output path of a seed that failed, where one did
    failed_seeds: list[int]
    error: str = ""

    @property
    def standing(self) -> str:
        if self.error or self.worst is None:
            return "error"
        if self.failed_seeds:
            return "failed"
        return "held" if self.worst <= 1 / MARGIN else "thin"

    def line(self) -> str:
        if self.standing == "error":
            return f"{self.case}: error: {self.error or 'no seed ran'}"
        where = f"seed {self.worst_seed}, {self.worst_inputs} inputs" + (f", {self.worst_output}" if self.worst_output else "")
        failed = f"; beyond the tolerance on {len(self.failed_seeds)} seeds: {self.failed_seeds[:8]}" if self.failed_seeds else ""
        return f"{self.case}: {self.standing}: worst {self.worst:.3g} of its tolerance over {self.seeds} seeds ({where}){failed}"


def case_config(name: str) -> DictConfig:
    cfg = OmegaConf.load(CASE_CONFIG_DIR / f"{name}.yaml")
    return OmegaConf.merge(cfg, {"compile": "off"})


def input_sets(cfg: DictConfig, device: str) -> dict[str, DictConfig]:
    """The case's inputs, and its speed inputs where they differ (the timed outputs are judged on those)."""
    speed = speed_config(cfg, device)
    return {"case": cfg} if speed == cfg else {"case": cfg, "speed": speed}


def sweep_in_child(name: str, device: str, seeds: int, max_s: float) -> list[tuple[int, str, dict]]:
    """Each seed's figures for each input set, until `seeds` ran or `max_s` passed: (seed, inputs, figures)."""
    start, rows, sets = time.monotonic(), [], input_sets(case_config(name), device)
    for seed in range(FIRST_SEED, FIRST_SEED + seeds):
        for inputs, cfg in sets.items():
            figures, failure = compare_in_child(FIXED, OmegaConf.merge(cfg, {"seed": seed}), device)
            if failure is not None:
                figures = {"match": False, "raised": failure.headline[:300]}
            rows.append((seed, inputs, {k: v for k, v in figures.items() if k != "differing"} | _first_differing(figures)))
        if time.monotonic() - start > max_s:
            break
    return rows


def _first_differing(figures: dict) -> dict:
    differing = figures.get("differing") or []
    return {"output": differing[0]["output"]} if differing else {}


def sweep(name: str, device: str = "cpu", seeds: int = 200, max_s: float = 120.0) -> Sweep:
    result = run_isolated(sweep_in_child, name, device, seeds, max_s, timeout_s=max_s * 3 + 120)
    if result.status != "returned":
        return Sweep(name, 0, None, None, "", "", [], result.summary)
    return summarise(name, result.value)


def summarise(name: str, rows: list[tuple[int, str, dict]]) -> Sweep:
    raised = [(seed, figures["raised"]) for seed, _, figures in rows if "raised" in figures]
    if raised:
        return Sweep(name, len({seed for seed, _, _ in rows}), None, None, "", "", [], f"seed {raised[0][0]} raised: {raised[0][1]}")
    used = [(figures.get("tolerance_used", 0.0), seed, inputs, figures) for seed, inputs, figures in rows]
    if not used:
        return Sweep(name, 0, None, None, "", "", [], "")
    worst, seed, inputs, figures = max(used, key=lambda row: row[0])
    failed = sorted({seed for seed, _, figures in rows if not figures["match"]})
    return Sweep(name, len({seed for seed, _, _ in rows}), worst, seed, inputs, figures.get("output", ""), failed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.seed_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: every case)")
    parser.add_argument("--seeds", type=int, default=200, help="seeds a case, from %d (default 200)" % FIRST_SEED)
    parser.add_argument("--max-s", type=float, default=120.0, help="stop a case's seeds after this long (default 120)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out", type=Path, help="also write the lines as JSON here")
    args = parser.parse_args(argv)
    names = [name for name in args.cases.split(",") if name] or case_names()
    unknown = sorted(set(names) - set(case_names()))
    if unknown:
        parser.error(f"no such case: {', '.join(unknown)}")
    if args.seeds < 1 or args.max_s <= 0:
        parser.error("--seeds must be at least 1 and --max-s positive")
    results = []
    for name in names:
        results.append(sweep(name, args.device, args.seeds, args.max_s))
        print(results[-1].line(), flush=True)
        if args.out:
            _write(args.out, args.device, results)
    return 0 if all(result.standing == "held" for result in results) else 1


def _write(path: Path, device: str, results: list[Sweep]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "torch": torch.__version__,
        "device": device,
        "margin": MARGIN,
        "first_seed": FIRST_SEED,
        "cases": [asdict(result) | {"standing": result.standing} for result in results],
    }
    path.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
