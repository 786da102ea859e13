"""The timing processes a speed phase drives (harness/phases/speed.py): a case's own (both sides in one child, or each
apart where `speed.apart` says they share process-wide state) and a grade's (the submission's child, confined, beside
the model solution's and its pristine copy), and what each timing child serves (harness/measure/clock.py)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
from types import ModuleType
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from harness import compiled as compile_axis
from harness.cases import load_case
from harness.measure.clock import serve, stop
from harness.measure.timing import steady_cpu_allocator, synchronize
from harness.phases.common import FIXED, SPEED_CANDIDATE, RunSpec, case_function, compiled_for, speed_config
from harness.process.confine import audit_parity
from harness.process.isolate import run_isolated
from harness.process.outcome import ChildResult, Failure
from harness.process.submitted import SUBMITTED_KEY, changes, process_settings


def graded_timing_process(
    talk: Callable, baseline: str, inputs: Any, cfg: DictConfig, spec: RunSpec, seeds: dict[str, int]
) -> dict[str, ChildResult]:
    """One timing process of a grade: the model solution's child and its pristine copy (from a config without the
    submission: they never import it), then the submission's, confined; the parent drives all three, their
    blocks in turn. What each child returned, by side."""
    ungraded = OmegaConf.create({key: value for key, value in OmegaConf.to_container(cfg, resolve=True).items() if key != SUBMITTED_KEY})
    results: dict[str, ChildResult] = {}
    connections: dict[str, tuple[Any, int]] = {}

    def then(side: str, go_on: Callable[[], Any]) -> Callable:
        def hold(connection, pid: int, deadline: float) -> Any:
            connections[side] = (connection, pid)
            try:
                return go_on()
            finally:
                stop(connection)  # if the candidate's child never came to answer, this one must not wait for it
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)  # a child left stopped (SIGSTOP from another process) could not hear it

        return hold

    def candidate_child() -> Any:
        results["candidate"] = _child_of_a_grade(
            "candidate",
            SPEED_CANDIDATE,
            inputs,
            cfg,
            spec,
            seeds,
            lambda connection, pid, deadline: talk(
                {"candidate": (connection, pid), "baseline": connections["baseline"], "pristine": connections["pristine"]}, deadline
            ),
            confined=spec.limits,
        )

    def pristine_child() -> Any:
        results["pristine"] = _child_of_a_grade("pristine", FIXED, inputs, ungraded, spec, seeds, then("pristine", candidate_child))

    results["baseline"] = _child_of_a_grade("baseline", FIXED, inputs, ungraded, spec, seeds, then("baseline", pristine_child))
    results.setdefault("pristine", results["baseline"])
    results.setdefault("candidate", results["pristine"])
    return results


def _child_of_a_grade(
    side: str, candidate: str, inputs: Any, cfg: DictConfig, spec: RunSpec, seeds: dict[str, int], talk: Callable, confined=None
) -> ChildResult:
    """One side's timing child in a grade, against the model solution (`fixed`) as its baseline."""
    return run_isolated(
        speed_in_child,
        candidate,
        FIXED,
        inputs,
        cfg,
        spec,
        seeds,
        (side,),
        timeout_s=spec.timeout_s,
        confined=confined,
        talk=talk,
    )


def shared_timing_process(
    talk: Callable, candidate: str, baseline: str, inputs: Any, cfg: DictConfig, spec: RunSpec
) -> dict[str, ChildResult]:
    """One timing process of a case's own functions: both sides in one child, the parent driving it."""
    return {
        "candidate": run_isolated(
            speed_in_child,
            candidate,
            baseline,
            inputs,
            cfg,
            spec,
            None,
            timeout_s=spec.timeout_s,
            talk=lambda connection, pid, deadline: talk({"candidate": (connection, pid), "baseline": (connection, pid)}, deadline),
        )
    }


def apart_timing_process(
    talk: Callable, candidate: str, baseline: str, inputs: Any, cfg: DictConfig, spec: RunSpec
) -> dict[str, ChildResult]:
    """One timing process of a case whose functions share state across a process (`speed.apart` in its yaml: dynamo
    keeps one cache of compiled code per code object, and code that hit its recompile limit there makes every later
    compile of it run eager): each side in a child of its own, the parent driving both, their blocks in turn."""
    results: dict[str, ChildResult] = {}
    held: dict[str, Any] = {}

    def candidate_child(connection, pid: int, deadline: float) -> Any:
        held["baseline"] = (connection, pid)
        try:
            results["candidate"] = run_isolated(
                speed_in_child,
                candidate,
                baseline,
                inputs,
                cfg,
                spec,
                None,
                ("candidate",),
                timeout_s=spec.timeout_s,
                talk=lambda mine, my_pid, my_deadline: talk({"candidate": (mine, my_pid), "baseline": held["baseline"]}, my_deadline),
            )
        finally:
            stop(connection)

    results["baseline"] = run_isolated(
        speed_in_child, candidate, baseline, inputs, cfg, spec, None, ("baseline",), timeout_s=spec.timeout_s, talk=candidate_child
    )
    results.setdefault("candidate", results["baseline"])
    return results


# What a timing child timed, kept until it exits (os._exit, harness/process/isolate.py) where the case's yaml says
# `speed.keep_till_exit`: on torch 2.6.0, freeing recompile_limit's session (its block's forward past dynamo's cache
# limit) died of SIGSEGV after the samples were taken. Not for every case: a DataLoader's workers end as it is freed.
_KEPT_TILL_EXIT: list[Any] = []


def speed_in_child(
    candidate: str,
    baseline: str,
    inputs: Any,
    cfg: DictConfig,
    spec: RunSpec,
    seeds: dict[str, int] | None,
    sides: tuple[str, ...] = ("candidate", "baseline"),
    *,
    connection,
) -> tuple[dict[str, Any] | None, Failure | None]:
    """Serve the parent's timing requests (harness/measure/clock.py) for `sides`: a case's own functions on inputs from the case
    seed, both sides in one child; when grading (seeds given), one side per child, warmed up on inputs from one seed,
    timed on inputs from another: the submitted fix ("candidate"), or the model solution ("baseline", "pristine")."""
    case = load_case(cfg.name)
    speed_cfg = speed_config(cfg, spec.device, inputs)
    if seeds is not None and "candidate" not in sides:
        audit_parity()  # the model solution pays for the submission's write guard what the submission pays
    if spec.device == "cpu":
        steady_cpu_allocator()
    # Children forked from one server would lay their heaps out alike: shift each by a random amount, so that
    # the layout's luck (seen here: one side 2x slow in every process of a run) varies between processes.
    layout_shift = bytearray(random.randrange(1 << 22))  # noqa: F841 - kept alive while timing

    def make(seed: int | None) -> Any:
        return case.make_inputs(speed_cfg if seed is None else OmegaConf.merge(speed_cfg, {"seed": seed}), spec.device)

    def keep(made: Any) -> Any:
        if OmegaConf.select(cfg, "speed.keep_till_exit"):
            _KEPT_TILL_EXIT.append(made)
        return made

    warm_inputs = make(seeds and seeds["warmup"])  # every thread; a case that cannot make its inputs is an error
    if spec.device == "cpu":
        torch.set_num_threads(spec.cpu_threads)  # several threads make small-op ratios swing by 20%
    told: dict[str, Any] = {}
    functions = _functions(case, candidate, baseline, cfg, sides, told)
    served: dict[str, dict[str, int]] = {}  # per side: calls, and frames traced during them (compiled)
    try:
        if spec.compile != "off":  # compiled before the clock starts: compile time is reported, never timed
            told.update(_compile_first(functions, warm_inputs, make, seeds, spec.device))
        before = process_settings() if seeds and "candidate" in sides else None
        fresh = (lambda: keep(make(seeds["timed"]))) if seeds else None
        traces = compile_axis.frames_traced if spec.compile != "off" else None
        serve(connection, functions, warm_inputs, spec.device, fresh, traces=traces, served=served)
    except Exception as error:  # noqa: BLE001
        return None, Failure.from_exception(error)
    if "graphs" in told:
        told["recompiled_while_timed"] = compile_axis.graphs_compiled() - told["graphs"]
        told["traced_while_timed"] = served
    if before is not None:
        told["changed_by_its_calls"] = changes(before, process_settings())
    if not told.get("changed_on_import"):
        told.pop("changed_on_import", None)
    keep((functions, warm_inputs))
    return {"cpu_threads": torch.get_num_threads(), **told}, None  # plain data back


def _functions(case: ModuleType, candidate: str, baseline: str, cfg: DictConfig, sides: tuple[str, ...], told: dict[str, Any]) -> dict:
    """Each side's function, compiled where the run compiles; the candidate is the submission, imported here."""
    functions = {}
    for side in sides:
        function = case_function(case, candidate, cfg) if side == "candidate" else getattr(case, baseline)
        told.update(changed_on_import=getattr(function, "changed_on_import", []))
        functions[side] = compiled_for(function, case, cfg)
    return functions


def _compile_first(functions: dict, warm_inputs: Any, make: Callable, seeds: dict[str, int] | None, device: str) -> dict[str, Any]:
    """Each side compiled by a first call on the warm-up inputs, and what that cost."""
    told: dict[str, Any] = {
        "compile_s": {
            side: compile_axis.timed_first_call(function, warm_inputs, lambda: synchronize(device))[1]
            for side, function in functions.items()
        }
    }
    if (
        seeds
    ):  # a first call on new inputs may recompile (automatic dynamic shapes): here, on a third private seed, not in the first timed block
        compiled_before, settle_inputs = compile_axis.graphs_compiled(), make(seeds["settle"])
        for function in functions.values():
            compile_axis.timed_first_call(function, settle_inputs, lambda: synchronize(device))
        told["recompiled_on_new_inputs"] = compile_axis.graphs_compiled() - compiled_before
        del settle_inputs
    told["graphs"] = compile_axis.graphs_compiled()
    return told
