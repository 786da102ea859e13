"""What the reproduce child sees of `buggy` run as a user's process runs it (`BuggyRun`), sent back as plain data."""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig

from harness import compiled as compile_axis
from harness.cases import load_case
from harness.measure.compare import compare, tolerance_of
from harness.phases.common import call, compiled_for
from harness.process.outcome import Failure
from harness.symptoms import symptom_on


@dataclass
class BuggyRun:
    """What the reproduce child saw of one buggy call: how it failed, the unrelated op after a CUDA error, its output
    against the reference (compiled, or where the failure raises nothing), every warning it issued and every line
    torch logged at WARNING or above ("Category: message" / "logger: message", verbatim), and the graphs dynamo
    compiled during it (a recompile is one more)."""

    failure: Failure | None
    context_after: str | None = None
    compared: dict | None = None
    warned: list[str] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)
    graphs_compiled: int = 0

    def said(self) -> dict[str, Any]:
        said = {"warnings": self.warned, "logged": self.logged, "graphs_compiled": self.graphs_compiled}
        return {key: value for key, value in said.items() if value}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(f"{record.name}: {record.getMessage()}"[:2000])


def _torch_loggers() -> list[logging.Logger]:
    """torch's loggers that hand their records to no parent: "torch", and those torch._logging sets up with handlers
    of their own ("torch._dynamo", "torch._inductor", ...); a handler on each hears every torch log line once."""
    named = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("torch.")]
    return [logging.getLogger("torch")] + [logger for logger in named if isinstance(logger, logging.Logger) and not logger.propagate]


def reproduce_in_child(cfg: DictConfig, device: str, silent: bool) -> dict[str, Any]:
    """`buggy` as a user's process runs it: a `BuggyRun`'s fields (plain data back to the parent)."""
    case = load_case(cfg.name)
    cfg = compile_axis.as_users_run_it(cfg)  # the failure as a user's process shows it
    inputs = case.make_inputs(cfg, device)
    logged = _Lines()
    listened = _torch_loggers()
    graphs_before = compile_axis.graphs_compiled()
    for logger in listened:
        logger.addHandler(logged)
    buggy = compiled_for(case.buggy, case, cfg)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            output, failure = call(buggy, inputs, device)
            for _ in range(getattr(symptom_on(case.symptoms[device], torch.__version__), "calls", 1) - 1):  # `Slow(calls=...)`
                if failure is not None:
                    break
                _, failure = call(buggy, inputs, device)
    finally:
        for logger in listened:
            logger.removeHandler(logged)
    warned = list(dict.fromkeys(f"{w.category.__name__}: {w.message}"[:1000] for w in caught))[:20]
    seen = BuggyRun(
        failure,
        warned=warned,
        logged=list(dict.fromkeys(logged.lines))[:20],
        graphs_compiled=compile_axis.graphs_compiled() - graphs_before,
    )
    if failure is None:
        if compile_axis.mode_of(cfg) == "off" and not silent:
            return vars(seen)
        want, _ = call(case.reference, case.make_inputs(cfg, device), device)  # fresh: buggy may have advanced its inputs' state
        seen.compared = compare(output, want, **tolerance_of(cfg.tolerance))
        return vars(seen)
    if device == "cuda":  # a device-side assert is sticky: an unrelated op in the same process fails too
        _, after = call(lambda _: torch.ones(4, device=device).add(1).sum().item(), None, device)
        seen.context_after = ("failed too: " + after.headline) if after else "ran fine"
    return vars(seen)
