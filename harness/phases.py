"""The five phases. Each runs its case code in an isolated child and classifies the result.

    reproduce  run `buggy`; expect the device's symptom on this torch (harness/cases.py: `symptom_on`; outside the
               symptom's range of torch versions, `appears_in` to `fixed_in`, a clean run)
               reproduced | not_reproduced | fixed_upstream | wrong_failure | crashed | timeout | error; a failure
               that raises nothing: wrong_result (`WrongResult`: differs from `reference`) | warned (`Warns`)
    fix        run `fixed` on the same inputs; it must not raise
               passed | raised | crashed | timeout | error
    correct    compare `fixed` with `reference`
               passed | mismatch | raised | crashed | timeout | error
    speed      time `speed_candidate` (default `fixed`) against `speed_baseline`, on inputs made
               from the case config with `speed.inputs`, then `speed.device_inputs.<device>`, merged
               over it (`speed_config`), in several child processes; the
               ratio's confidence interval against the budget (harness.timing)
               within_budget | over_budget | inconclusive (ok, shown apart) | measured (no budget for this device)
               | raised | crashed | timeout | error; grading: undecided in place of inconclusive (a rejection)
    speed:NAME the same, against each other baseline the yaml names under `speed.also`
    slow_fixes one record per slow fix, phase "slow_fix:<name>": a correct but slower fix, timed as `speed`
               times the fix; the speed verdict must catch it
               flagged (correct and over budget) | missed | no_budget | crashed | timeout | error
    bad_fixes  one record per bad fix, phase "bad_fix:<name>"; each must be rejected
               rejected (it raised, crashed, or differs from the reference) | accepted | timeout | error
    memory     the fix's memory per step (`steps` calls on one inputs object) against `memory_baseline`
               (default `speed_baseline`; grading: the case's `fixed`), each in its own child, judged against the yaml's `memory.budget`
               (harness/memory.py); reproduce judges a `Growth` symptom the same way, on `buggy`
               within_budget | over_budget | inconclusive (ok, shown apart) | measured (no budget) | not_applicable
               | raised | crashed | timeout | error
    memory_fixes one record per memory control, phase "memory_fix:<name>"; the memory verdict must flag it
               flagged | missed | no_budget | raised | crashed | timeout | error

"error" means the case itself broke (e.g. `make_inputs` raised): not a verdict on the bug.
Children get the case by name (`cfg.name`) and import it from the fork server's preload.
When a submitted fix is graded (harness/grading/grade.py), `fix_under_test` hands fix, correct and speed that
fix instead of `fixed`, and speed times it against the case's own `fixed`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import random
import re
import secrets
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cases import Growth, Warns, WrongResult, load_case, symptom_on
from harness import compiled as compile_axis
from harness.grading.clock import TimedProcess, anomaly, baseline_anomaly, clock_figures, drive, serve, stop
from harness.compare import compare, describe
from harness.grading.confine import Limits
from harness.isolate import ChildResult, Failure, run_isolated
from harness.records import PhaseRecord
from harness.grading.submitted import SUBMITTED_KEY, changes, load_submitted, process_settings, submission_of
from harness.timing import estimate_ratio, judge, steady_cpu_allocator, synchronize
from harness import memory as memory_source

PHASES = ("reproduce", "fix", "correct", "speed", "slow_fixes", "bad_fixes", "memory", "memory_fixes")
FIXED = "fixed"
SPEED_CANDIDATE = "speed_candidate"
SLOW_FIX = "slow_fix:"
MEMORY_FIX = "memory_fix:"
MEMORY_BASELINE = "memory_baseline"
GRADED_PAIRS = 6  # at least, per timing process of a submitted fix (plus 0-2 more, drawn privately): more calls than a case's own timing


@dataclass(frozen=True)
class SpeedSettings:
    warmup: int = 1  # pairs run untimed first, in each process
    pairs: int = 3  # interleaved candidate/baseline samples per process, at least...
    process_s: float = 0.5  # ...and more until they have taken this long
    min_processes: int = 2
    max_processes: int = 12
    max_s: float = 20.0  # past this, a verdict still undecided is inconclusive
    grade_max_s: float = 60.0  # grading: past this, a verdict still undecided is `undecided`, a rejection (never accepted)
    level: float = 0.95  # of the ratio's confidence interval


@dataclass(frozen=True)
class Settings:
    device: str
    timeout_s: float
    speed: SpeedSettings = SpeedSettings()
    cpu_threads: int = 1
    limits: Limits = Limits()  # for children that run a submitted fix (harness/grading/confine.py)
    memory: memory_source.MemorySettings = memory_source.MemorySettings()


def run_phase(phase: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> Iterator[PhaseRecord]:
    """The phase's records, each yielded as soon as its child has finished."""
    if phase == "bad_fixes":
        for name in case.bad_fixes:
            yield bad_fix(name, case, cfg, settings)
    elif phase == "slow_fixes":
        for name in getattr(case, "slow_fixes", {}):
            yield slow_fix(name, case, cfg, settings)
    elif phase == "speed":
        yield from speed(case, cfg, settings)
    elif phase == "memory":
        yield memory(case, cfg, settings)
    elif phase == "memory_fixes":
        for name in getattr(case, "memory_fixes", {}):
            yield memory_fix(name, case, cfg, settings)
    else:
        yield {"reproduce": reproduce, "fix": fix, "correct": correct}[phase](case, cfg, settings)


def fix_under_test(case: ModuleType, cfg: DictConfig) -> Callable:
    """In a child: the case's own `fixed`, or the submitted fix when grading (loaded here by path, never pickled)."""
    submission = submission_of(cfg)
    return case.fixed if submission is None else load_submitted(submission, case)


def confinement(cfg: DictConfig, settings: Settings) -> Limits | None:
    """The limits for a child that loads the fix under test: a submitted fix is confined, the case's own is not."""
    return settings.limits if submission_of(cfg) is not None else None


# -- reproduce -----------------------------------------------------------------------------


def reproduce(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    if isinstance(symptom, Growth):
        return reproduce_growth(case, cfg, settings)
    result = run_isolated(_reproduce_in_child, cfg, settings.device, isinstance(symptom, (WrongResult, Warns)), timeout_s=settings.timeout_s)
    if isinstance(symptom, (WrongResult, Warns)):
        return reproduce_silent(symptom, cfg, result)
    if compile_axis.mode_of(cfg) != "off":
        return reproduce_compiled(case, cfg, settings, result)
    if result.status != "returned":
        return _abnormal("reproduce", result)
    failure, context_after, _, warned = result.value
    expected = symptom.expected_on(torch.__version__)
    said = {"warnings": warned} if warned else {}
    if failure is None:
        if not expected:
            return _record("reproduce", "fixed_upstream", True, f"buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()})", result, said)
        return _record("reproduce", "not_reproduced", False, f"buggy ran without error on torch {torch.__version__}", result, said)
    figures: dict[str, Any] = {"error": failure.headline, "raised_at": failure.where, **failure.figures, **said}
    figures.setdefault("traceback", failure.traceback)  # the frames tell cases with one error text apart (harness.triage)
    if symptom.output:
        figures["output_line"] = _first_matching_line(symptom.output, result.output)
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    problems = symptom.mismatches(failure, result.output)
    if problems:
        return _record("reproduce", "wrong_failure", False, f"{failure.headline} ({'; '.join(problems)})", result, figures)
    if not expected:
        return _record("reproduce", "reproduced", False, f"{failure.headline} (but it was recorded as failing {symptom.range_text()})", result, figures)
    return _record("reproduce", "reproduced", True, failure.headline, result, figures)


def reproduce_silent(symptom: WrongResult | Warns, cfg: DictConfig, result: ChildResult) -> PhaseRecord:
    """A failure that raises nothing, eager or compiled alike: `buggy`'s output against the reference (`WrongResult`:
    wrong_result when it differs beyond the tolerance), or the warning it issued (`Warns`: warned).
    Every warning the call issued is kept verbatim; an error is `wrong_failure`."""
    if result.status != "returned":
        return _abnormal("reproduce", result)
    failure, _, compared, warned = result.value
    expected = symptom.expected_on(torch.__version__)
    figures: dict[str, Any] = {"warnings": warned, **(compared or {})}
    if failure is not None:
        figures.update(error=failure.headline, raised_at=failure.where, traceback=failure.traceback)
        return _record("reproduce", "wrong_failure", False, f"{failure.headline} (expected it to return {'a wrong result' if isinstance(symptom, WrongResult) else 'with a warning'})", result, figures)
    warning = next((line for line in warned if re.search(symptom.warning, line)), None) if symptom.warning else None
    figures["warning"] = warning
    if isinstance(symptom, Warns):
        if warning is not None:
            return _record("reproduce", "warned", expected, warning, result, figures)
        return _record("reproduce", "fixed_upstream" if not expected else "not_reproduced", not expected, f"buggy ran without the warning /{symptom.warning}/ on torch {torch.__version__}", result, figures)
    wrong = not compared["match"]
    if wrong and (symptom.warning is None or warning is not None):
        said = f"returned a wrong result: {_difference(compared)}" + (f"; warned {warning}" if warning else "")
        return _record("reproduce", "wrong_result", expected, said, result, figures)
    if wrong:
        return _record("reproduce", "wrong_failure", False, f"returned a wrong result, without the warning /{symptom.warning}/: {_difference(compared)}", result, figures)
    if not expected:
        return _record("reproduce", "fixed_upstream", True, f"buggy returned the reference's output, as expected on torch {torch.__version__} (it fails {symptom.range_text()})", result, figures)
    return _record("reproduce", "not_reproduced", False, f"buggy returned the reference's output {_tolerance(cfg)} on torch {torch.__version__}", result, figures)


FAILURE_REPRODUCED = frozenset({"reproduced", "wrong_result", "warned", "raised", "aborted", "silent"})  # eager's statuses, then the compiled outcomes


def reproduce_compiled(case: ModuleType, cfg: DictConfig, settings: Settings, result: ChildResult) -> PhaseRecord:
    """The buggy code compiled: how it failed, which may not be how it fails eager.

    raised          it raised: `same_as_eager` says whether it is the device's eager symptom
    aborted         a native error killed the process (inductor's kernels throw C++ exceptions): the signal
                    and the native lines of its output, verbatim
    silent          it returned where eager fails: how far the output is from the reference
    compile_failed  the compiler itself raised something other than the symptom
    fixed_upstream  it ran clean on a torch the case records as having made the code valid
    not_reproduced  it returned the reference's output on a torch where the bug is expected
    """
    mode = compile_axis.mode_of(cfg)
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    expected = symptom.expected_on(torch.__version__)
    if result.status == "signalled":
        native = compile_axis.native_message(result.output)
        figures = {"signal": result.signal, "native_message": native, "same_as_eager": False}
        said = compile_axis.native_headline(native)
        return _record("reproduce", "aborted", expected, f"{result.signal} under {mode}: {said}", result, figures)
    if result.status != "returned":
        return _abnormal("reproduce", result)
    failure, context_after, silent, _ = result.value
    if failure is None:
        if not expected:
            return _record("reproduce", "fixed_upstream", True, f"compiled buggy ran without error, as expected on torch {torch.__version__} (it fails {symptom.range_text()})", result)
        if silent["match"]:
            return _record("reproduce", "not_reproduced", False, f"compiled buggy returned the reference's output on torch {torch.__version__}", result, silent)
        message = f"returned an output under {mode} where eager raises {symptom.exception}: {_difference(silent)}"
        return _record("reproduce", "silent", True, message, result, {**silent, "same_as_eager": False})
    problems = symptom.mismatches(failure, result.output)
    figures: dict[str, Any] = {"error": failure.headline, "raised_at": failure.where, "same_as_eager": not problems, "traceback": failure.traceback, **failure.figures}
    if context_after is not None:
        figures["unrelated_op_after_error"] = context_after
    if problems and compile_axis.is_compiler_error(failure.types, failure.modules):
        return _record("reproduce", "compile_failed", False, f"the compiler raised {failure.headline}", result, figures)
    eager = "" if not problems else f" (eager: {symptom.exception}; {'; '.join(problems)})"
    return _record("reproduce", "raised", expected, failure.headline + eager, result, figures)


def _reproduce_in_child(cfg: DictConfig, device: str, silent: bool) -> tuple[Failure | None, str | None, dict | None, list[str]]:
    """`buggy` as a user's process runs it: how it failed, the unrelated op after a CUDA error, how its output
    compares with the reference (where it returned compiled, or the failure is `silent`), and the warnings it issued."""
    case = load_case(cfg.name)
    cfg = compile_axis.as_users_run_it(cfg)  # the failure as a user's process shows it
    inputs = case.make_inputs(cfg, device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output, failure = _call(_compiled(case.buggy, case, cfg), inputs, device)
    warned = list(dict.fromkeys(f"{w.category.__name__}: {w.message}"[:1000] for w in caught))[:20]
    if failure is None:
        if compile_axis.mode_of(cfg) == "off" and not silent:
            return None, None, None, warned
        want, _ = _call(case.reference, case.make_inputs(cfg, device), device)  # fresh: buggy may have advanced its inputs' state
        return None, None, compare(output, want, atol=cfg.tolerance.atol, rtol=cfg.tolerance.rtol), warned
    if device != "cuda":
        return failure, None, None, warned
    # A device-side assert is sticky: an unrelated op in the same process fails too.
    _, after = _call(lambda _: torch.ones(4, device=device).add(1).sum().item(), None, device)
    return failure, ("failed too: " + after.headline) if after else "ran fine", None, warned


# -- fix and correct -----------------------------------------------------------------------


def fix(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    result = run_isolated(_fix_in_child, cfg, settings.device, timeout_s=settings.timeout_s, confined=confinement(cfg, settings))
    if result.status != "returned":
        return _abnormal("fix", result)
    output, failure, sync_checked, compile_figures = result.value
    figures = {"host_sync_checked": sync_checked} if sync_checked else {}
    figures.update(compile_figures)
    if failure is not None:
        return _record("fix", "raised", False, failure.headline, result, {**figures, "raised_at": failure.where})
    return _record("fix", "passed", True, f"returned {output}", result, figures)


def _fix_in_child(cfg: DictConfig, device: str) -> tuple[str | None, Failure | None, bool, dict[str, Any]]:
    case = load_case(cfg.name)
    function = fix_under_test(case, cfg)
    inputs = case.make_inputs(cfg, device)
    check_sync = device == "cuda" and bool(cfg.get("fix_must_not_sync", False))
    function, compile_figures, failure = _compiled_fix(function, case, cfg, inputs, device)
    if failure is not None:
        return None, failure, False, compile_figures
    with _sync_forbidden() if check_sync else contextlib.nullcontext():
        output, failure = _call(function, inputs, device, synchronise=False)
    if failure is None:
        _, failure = _call(lambda _: None, None, device)  # synchronise, so asynchronous errors surface here
    return (describe(output) if failure is None else None), failure, check_sync, compile_figures


def _compiled_fix(function: Callable, case: ModuleType, cfg: DictConfig, inputs: Any, device: str) -> tuple[Callable, dict[str, Any], Failure | None]:
    """The fix as the compile mode runs it, compiled and called once (outside any sync check: compiling may sync).

    A fix should compile as one graph (`fullgraph=True`); where it cannot, the graph breaks and their reasons
    are recorded, and it runs compiled with them."""
    if compile_axis.mode_of(cfg) == "off" or getattr(case, "compiles_itself", False):
        return _compiled(function, case, cfg), {}, None
    whole = compile_axis.compiled(function, cfg, fullgraph=True)
    output, failure = _call(lambda x: compile_axis.timed_first_call(whole, x, lambda: synchronize(device)), inputs, device)
    if failure is None:
        return whole, {"fullgraph": True, "compile_s": output[1], "graphs": compile_axis.graphs_compiled()}, None
    if not compile_axis.is_compiler_error(failure.types, failure.modules):
        return whole, {"fullgraph": True}, failure
    figures: dict[str, Any] = {"fullgraph": False, "fullgraph_error": failure.headline[:300]}
    report, explain_failure = _call(lambda x: compile_axis.graph_report(function, x), inputs, device)
    figures.update(report or {"graph_report_failed": explain_failure.headline[:300]})
    broken = compile_axis.compiled(function, cfg)
    output, failure = _call(lambda x: compile_axis.timed_first_call(broken, x, lambda: synchronize(device)), inputs, device)
    if failure is None:
        figures["compile_s"] = output[1]
    return broken, figures, failure


def _compiled(function: Callable, case: ModuleType, cfg: DictConfig) -> Callable:
    """`function` under the config's compile mode (harness/compiled.py); itself where the case compiles its unit itself.
    A child that runs a submitted fix is confined, and confinement points its kernel cache, and its ranks', at the
    grade's own folder (harness/grading/confine.py); every other child, in a grade too, uses the harness's cache."""
    if getattr(case, "compiles_itself", False):
        return function
    return compile_axis.compiled(function, cfg)


@contextlib.contextmanager
def _sync_forbidden():
    """Make any op that synchronises the host with the GPU raise (the fix claims it adds none)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def correct(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    result = run_isolated(_compare_in_child, FIXED, cfg, settings.device, timeout_s=settings.timeout_s)
    if result.status != "returned":
        return _abnormal("correct", result)
    figures, failure = result.value
    if failure is not None:
        return _record("correct", "raised", False, failure.headline, result)
    if figures["match"]:
        return _record("correct", "passed", True, "matches the reference " + _tolerance(cfg), result, figures)
    return _record("correct", "mismatch", False, "differs from the reference: " + _difference(figures), result, figures)


def _compare_in_child(candidate: str, cfg: DictConfig, device: str) -> tuple[dict | None, Failure | None]:
    """Compare `candidate` (FIXED, a bad fix's name, or a slow fix) with the reference.

    A slow fix stands in for the timed part of the fix, so where a case times only part of it
    (`speed_candidate`), the slow fix is compared with `speed_reference`, that part's reference.
    """
    case = load_case(cfg.name)
    inputs = case.make_inputs(cfg, device)
    got, failure = _call(_compiled(_function(case, candidate, cfg), case, cfg), inputs, device)
    if failure is not None:
        return None, failure
    partial = candidate.startswith(SLOW_FIX) and hasattr(case, SPEED_CANDIDATE)
    fresh = case.make_inputs(cfg, device)  # a training step advances the state it is given (the memory contract): the reference starts where the candidate did
    want, failure = _call(case.speed_reference if partial else case.reference, fresh, device)
    if failure is not None:
        raise RuntimeError(f"the reference itself failed: {failure.headline}")
    return compare(got, want, atol=cfg.tolerance.atol, rtol=cfg.tolerance.rtol), None


# -- speed ---------------------------------------------------------------------------------


def speed(case: ModuleType, cfg: DictConfig, settings: Settings) -> Iterator[PhaseRecord]:
    """The fix against `speed_baseline`; then, as phase "speed:<name>", each comparison in the yaml's
    `speed.also`: the fix against the case function `baseline` names, on inputs with `inputs` merged over."""
    yield _timed("speed", SPEED_CANDIDATE, _budget(cfg.get("speed"), settings.device), cfg, settings)
    for name, also in (OmegaConf.select(cfg, "speed.also") or {}).items():
        yield _timed(f"speed:{name}", SPEED_CANDIDATE, _budget(also, settings.device), cfg, settings, baseline=also.baseline, inputs=also.get("inputs"))


def speed_config(cfg: DictConfig, device: str, inputs: Any = None) -> DictConfig:
    """The case config that speed inputs are made from: `speed.inputs` merged over it, then
    `speed.device_inputs.<device>`, then a comparison's own `inputs` (from `speed.also`)."""
    return OmegaConf.merge(cfg, OmegaConf.select(cfg, "speed.inputs") or {}, OmegaConf.select(cfg, f"speed.device_inputs.{device}") or {}, inputs or {})


def _budget(speed_cfg: DictConfig | None, device: str) -> float | None:
    """`budget.<device>` of a speed section (the case yaml's `speed`, or one of its `speed.also`)."""
    return None if speed_cfg is None else OmegaConf.select(speed_cfg, f"budget.{device}")


def _timed(
    phase: str, candidate: str, budget: float | None, cfg: DictConfig, settings: Settings, *, baseline: str = "speed_baseline", inputs: Any = None
) -> PhaseRecord:
    """Time `candidate` against `baseline` (case functions by name), one timing process after another.

    Each timing process serves `pairs` interleaved pairs on inputs of its own, timed by this process
    (harness/grading/clock.py); after each (from `min_processes` on) the ratio's interval is compared with the
    budget: decisive, it stops; straddling it, another process runs, until `max_s` or `max_processes`,
    then the verdict is inconclusive. With no budget on this device, `min_processes` are measured and reported.

    Timing a submitted fix (grading), a timing process is three children of the fork server, their blocks
    taken in turn: the submission's (confined, harness/grading/confine.py), the model solution's (`fixed`), and a
    pristine copy of the model solution's; the last two never import the submitted file, so nothing it does
    to its own process reaches what it is compared with, and the baseline's time against its pristine copy's
    shows a leak. Each warms up on inputs from one private seed and is timed on inputs from another, made
    after the warm-up; the submission runs more pairs than a case's own timing, a number it cannot know;
    outputs of its timed calls picked at random go to the judge (figures["checked_outputs"], judged by
    harness/grading/grade.py); what the parent saw beside the samples (a clock that disagrees, CPU used beside or
    after the calls, a cache answering repeated inputs, a baseline slowed or disturbed) is a verdict of its
    own; and an interval that still straddles the budget after `grade_max_s` is `undecided`, a rejection.
    """
    timing = settings.speed
    graded = submission_of(cfg) is not None and candidate == SPEED_CANDIDATE
    check_dir = Path(tempfile.mkdtemp(prefix="harness-checked-")) if graded else None
    started = time.monotonic()
    processes: list[TimedProcess] = []
    checked: list[dict[str, Any]] = []
    held: dict[str, Any] = {}  # what confined children tried or left behind, over every process
    compiled_figures: dict[str, list] = {}  # per process: compile time of each side (cold or warm cache), graphs compiled while timed
    changed: dict[str, list[str]] = {}  # what the submission's import, then its calls, changed in its process
    max_s, max_processes = (timing.grade_max_s, 10_000) if graded else (timing.max_s, timing.max_processes)
    compiling_s = 0.0  # compiles before each process's clock: reported, and not taken from max_s (a cold one can outlast it)
    while True:
        seeds = {"warmup": secrets.randbelow(1 << 31), "settle": secrets.randbelow(1 << 31), "timed": secrets.randbelow(1 << 31)} if graded else None
        process_dir = None
        if check_dir is not None:
            process_dir = check_dir / str(len(processes))
            process_dir.mkdir()
        talk = functools.partial(
            drive,
            device=settings.device,
            warmup=max(timing.warmup, 1) + secrets.randbelow(2) if graded else timing.warmup,  # graded: never a timed first call
            pairs=max(timing.pairs, GRADED_PAIRS) + secrets.randbelow(3) if graded else timing.pairs,
            min_s=timing.process_s,
            fresh_inputs=graded,
            check_dir=process_dir,
        )
        if graded:
            results = _graded_timing_process(talk, baseline, inputs, cfg, settings, seeds)
        else:
            results = {"candidate": run_isolated(_speed_in_child, candidate, baseline, inputs, cfg, settings, None, timeout_s=settings.timeout_s, talk=lambda c, pid, d: talk({"candidate": (c, pid), "baseline": (c, pid)}, d))}
        result = results["candidate"]
        if result.status != "returned":
            return _abnormal(phase, result)
        value, failure = result.value
        if failure is not None:
            return _record(phase, "raised", False, failure.headline, result)
        for side in ("baseline", "pristine"):  # the model solution's own children: a failure there is the case's
            if side in results and (results[side].status != "returned" or results[side].value[1] is not None):
                broke = results[side]
                said = broke.summary if broke.status != "returned" else f"raised {broke.value[1].headline}"
                return _record(phase, "error", False, f"the model solution's timing child ({side}) {said}", broke)
        timed = result.talk
        if timed is None:
            return _record(phase, "crashed", False, "the timing child stopped answering the parent's requests", result)
        cpu_threads = value["cpu_threads"]
        for told in [value] + [results[side].value[0] for side in ("baseline",) if side in results]:
            for key in ("compile_s", "recompiled_on_new_inputs", "recompiled_while_timed"):
                if key in told:
                    compiled_figures.setdefault(key, []).append(told[key])
        children = {id(child): child for child in results.values()}.values()  # one child may serve several sides
        compiling_s += sum(sum(child.value[0].get("compile_s", {}).values()) for child in children)
        for key in ("changed_on_import", "changed_by_its_calls"):
            for line in value.get(key, []):
                changed.setdefault(key, [])
                if line not in changed[key]:
                    changed[key].append(line)
        processes.append(timed)
        if timed.disturbed:  # reniced, pinned: its samples are worth nothing, and the grade ends here
            figures = {"baseline_disturbed": timed.disturbed, **containment(result), **changed}
            return PhaseRecord(phase, "baseline_disturbed", False, baseline_anomaly(processes, settings.device)[1], figures, round(time.monotonic() - started, 4), result.output)
        for key, said in containment(result).items():
            held[key] = held.get(key, []) + said if isinstance(said, list) else said
        checked += [{"process": len(processes) - 1, "block": index, "seed": seeds["timed"], "path": block.checked, "step": block.checked_step} for index, block in enumerate(timed.blocks) if block.checked]
        if len(processes) < timing.min_processes:
            continue
        estimate = estimate_ratio([p.samples for p in processes], timing.level)
        verdict = judge(estimate, budget) if budget is not None else "measured"
        if verdict is None and (len(processes) >= max_processes or time.monotonic() - started - compiling_s >= max_s):
            verdict = "undecided" if graded else "inconclusive"
        if verdict is not None:
            break
    samples = processes[-1].samples
    figures = {**estimate.figures(), "budget": budget, "calls_per_sample": samples.calls_per_sample, "cpu_threads": cpu_threads}
    figures["retaken_pairs"] = sum(p.samples.retaken for p in processes)
    figures.update(compiled_figures)
    figures["seconds"] = round(time.monotonic() - started, 2)
    figures.update(clock_figures(processes))
    interval = f"{estimate.ratio:.3f}x [{estimate.ratio_low:.3f}, {estimate.ratio_high:.3f}] ({estimate.level:.0%}, {estimate.samples} pairs in {estimate.processes} processes)"
    times = f"{estimate.candidate_s * 1e3:.3f} ms vs {estimate.baseline_s * 1e3:.3f} ms"
    message = {
        "measured": f"{interval}, {times}; no budget on {settings.device}",
        "within_budget": f"{interval}, {times}; within budget {budget}x",
        "over_budget": f"{interval}, {times}; over budget {budget}x",
        "inconclusive": f"{interval}, {times}; the interval still straddles the budget {budget}x after {figures['seconds']} s",
        "undecided": (
            f"{interval}, {times}; the interval still straddles the budget {budget}x after {figures['seconds']} s: the grader could not tell, "
            "and a grade must be decisive; grade it again on a quieter machine, or give it longer (speed.grade_max_s)"
        ),
    }[verdict]
    ok = verdict not in ("over_budget", "undecided")  # inconclusive (a case's own timing) is no failure, but reports show it apart
    if graded:
        figures.update(checked_outputs=checked, checked_dir=str(check_dir), timed_blocks=sum(1 for p in processes for b in p.blocks if b.side == "candidate"))
        figures.update(held)
        figures.update(changed)
        seen = anomaly(processes, settings.device)
        if seen is not None:
            verdict, ok, message = seen[0], False, f"{seen[1]} ({interval})"
        if changed.get("changed_on_import") or changed.get("changed_by_its_calls"):
            lines = changed.get("changed_on_import", []) + changed.get("changed_by_its_calls", [])
            message += f"; in its own process it changed {'; '.join(lines[:8])}" + (f" and {len(lines) - 8} more" if len(lines) > 8 else "") + " (the model solution, timed apart, was not affected)"
    return PhaseRecord(phase, verdict, ok, message, figures, round(time.monotonic() - started, 4), result.output)


def _graded_timing_process(talk: Callable, baseline: str, inputs: Any, cfg: DictConfig, settings: Settings, seeds: dict[str, int]) -> dict[str, ChildResult]:
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
        results["candidate"] = run_isolated(
            _speed_in_child, SPEED_CANDIDATE, FIXED, inputs, cfg, settings, seeds, ("candidate",), timeout_s=settings.timeout_s, confined=settings.limits,
            talk=lambda connection, pid, deadline: talk({"candidate": (connection, pid), "baseline": connections["baseline"], "pristine": connections["pristine"]}, deadline),
        )

    def pristine_child() -> Any:
        results["pristine"] = run_isolated(_speed_in_child, FIXED, FIXED, inputs, ungraded, settings, seeds, ("pristine",), timeout_s=settings.timeout_s, talk=then("pristine", candidate_child))

    results["baseline"] = run_isolated(_speed_in_child, FIXED, FIXED, inputs, ungraded, settings, seeds, ("baseline",), timeout_s=settings.timeout_s, talk=then("baseline", pristine_child))
    results.setdefault("pristine", results["baseline"])
    results.setdefault("candidate", results["pristine"])
    return results


def _speed_in_child(
    candidate: str,
    baseline: str,
    inputs: Any,
    cfg: DictConfig,
    settings: Settings,
    seeds: dict[str, int] | None,
    sides: tuple[str, ...] = ("candidate", "baseline"),
    *,
    connection,
) -> tuple[dict[str, Any] | None, Failure | None]:
    """Serve the parent's timing requests (harness/grading/clock.py) for `sides`: a case's own functions on inputs from the case
    seed, both sides in one child; when grading (seeds given), one side per child, warmed up on inputs from one seed,
    timed on inputs from another: the submitted fix ("candidate"), or the model solution ("baseline", "pristine")."""
    case = load_case(cfg.name)
    speed_cfg = speed_config(cfg, settings.device, inputs)
    if settings.device == "cpu":
        steady_cpu_allocator()
    # Children forked from one server would lay their heaps out alike: shift each by a random amount, so that
    # the layout's luck (seen here: one side 2x slow in every process of a run) varies between processes.
    layout_shift = bytearray(random.randrange(1 << 22))  # noqa: F841 - kept alive while timing

    def make(seed: int | None) -> Any:
        return case.make_inputs(speed_cfg if seed is None else OmegaConf.merge(speed_cfg, {"seed": seed}), settings.device)

    warm_inputs = make(seeds and seeds["warmup"])  # every thread; a case that cannot make its inputs is an error
    if settings.device == "cpu":
        torch.set_num_threads(settings.cpu_threads)  # several threads make small-op ratios swing by 20%
    told: dict[str, Any] = {}
    functions = {}
    for side in sides:
        function = _function(case, candidate, cfg) if side == "candidate" else getattr(case, baseline)  # the candidate: the submission, imported here
        told.update(changed_on_import=getattr(function, "changed_on_import", []))
        functions[side] = _compiled(function, case, cfg)
    try:
        if compile_axis.mode_of(cfg) != "off":  # compiled before the clock starts: compile time is reported, never timed
            told["compile_s"] = {side: compile_axis.timed_first_call(function, warm_inputs, lambda: synchronize(settings.device))[1] for side, function in functions.items()}
            if seeds:  # a first call on new inputs may recompile (automatic dynamic shapes): here, on a third private seed, not in the first timed block
                compiled_before, settle_inputs = compile_axis.graphs_compiled(), make(seeds["settle"])
                for function in functions.values():
                    compile_axis.timed_first_call(function, settle_inputs, lambda: synchronize(settings.device))
                told["recompiled_on_new_inputs"] = compile_axis.graphs_compiled() - compiled_before
                del settle_inputs
            told["graphs"] = compile_axis.graphs_compiled()
        before = process_settings() if seeds and "candidate" in sides else None
        serve(connection, functions, warm_inputs, settings.device, (lambda: make(seeds["timed"])) if seeds else None)
    except Exception as error:  # noqa: BLE001
        return None, Failure.from_exception(error)
    if "graphs" in told:
        told["recompiled_while_timed"] = compile_axis.graphs_compiled() - told["graphs"]
    if before is not None:
        told["changed_by_its_calls"] = changes(before, process_settings())
    if not told.get("changed_on_import"):
        told.pop("changed_on_import", None)
    return {"cpu_threads": torch.get_num_threads(), **told}, None  # plain data back


# -- slow fixes: controls that show the speed phase can fail ------------------------------


def slow_fix(name: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    """A correct but slower fix must be flagged by the speed verdict: `flagged`, else `missed`."""
    phase = f"{SLOW_FIX}{name}"
    budget = _budget(cfg.get("speed"), settings.device)
    if budget is None:
        return PhaseRecord(phase, "no_budget", True, f"no speed budget on {settings.device}: nothing to flag", {}, 0.0, "")
    checked = run_isolated(_compare_in_child, phase, cfg, settings.device, timeout_s=settings.timeout_s)
    if checked.status != "returned":
        return _abnormal(phase, checked)
    figures, failure = checked.value
    if failure is not None:
        return _record(phase, "missed", False, f"the control is broken: it raises {failure.headline}", checked)
    if not figures["match"]:
        return _record(phase, "missed", False, "the control is broken: it differs from the reference: " + _difference(figures), checked, figures)
    timed = _timed(phase, phase, budget, cfg, settings)
    if timed.status == "over_budget":
        status, ok, message = "flagged", True, "correct, and flagged: " + timed.message
    elif timed.status in ("within_budget", "inconclusive"):
        status, ok, message = "missed", False, f"correct but not flagged ({timed.status}): " + timed.message
    else:  # the timing itself crashed, hung or raised: the control proves nothing
        return timed
    return PhaseRecord(phase, status, ok, message, timed.figures, timed.seconds + checked.seconds, timed.output_tail)


# -- bad fixes -----------------------------------------------------------------------------


def bad_fix(name: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    phase = f"bad_fix:{name}"
    result = run_isolated(_compare_in_child, name, cfg, settings.device, timeout_s=settings.timeout_s)
    if result.status == "signalled":
        return _record(phase, "rejected", True, f"crashed: {result.summary}", result, {"how": "crashed"})
    if result.status != "returned":
        return _abnormal(phase, result)
    figures, failure = result.value
    if failure is not None:
        return _record(phase, "rejected", True, f"raises {failure.headline}", result, {"how": "raised", "error": failure.headline})
    if not figures["match"]:
        return _record(phase, "rejected", True, "differs from the reference: " + _difference(figures), result, {"how": "differs", **figures})
    return _record(phase, "accepted", False, "matches the reference: this bad fix is not caught " + _tolerance(cfg), result, figures)


# -- memory: retained and peak memory per step (harness/memory.py) -------------------------


def memory(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    """The fix's memory over `steps` steps against `memory_baseline`'s, judged against `memory.budget.<device>`."""
    reason = OmegaConf.select(cfg, "memory.not_applicable")
    if reason:
        return PhaseRecord("memory", "not_applicable", True, str(reason), {"device": settings.device}, 0.0, "")
    return _memory_judged("memory", FIXED, case, cfg, settings)


def memory_fix(name: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    """A memory control (a wrong fix that keeps every step's memory) must be flagged by the memory verdict."""
    phase = f"{MEMORY_FIX}{name}"
    if memory_budget(cfg, settings.device) is None:
        return PhaseRecord(phase, "no_budget", True, f"no memory budget on {settings.device}: nothing to flag", {}, 0.0, "")
    judged = _memory_judged(phase, phase, case, cfg, settings)
    if judged.status == "over_budget":
        return dataclasses.replace(judged, status="flagged", ok=True, message="flagged: " + judged.message)
    if judged.status in ("within_budget", "inconclusive"):
        return dataclasses.replace(judged, status="missed", ok=False, message=f"not flagged ({judged.status}): " + judged.message)
    return judged


def reproduce_growth(case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    """A failure that is memory growing step after step (`Growth`): `buggy`'s retained memory per step, measured;
    reproduced when the slope's lower bound is at least `at_least` x the baseline's peak per step."""
    symptom = symptom_on(case.symptoms[settings.device], torch.__version__)
    measured = _measure_pair("reproduce", "buggy", cfg, settings)
    if isinstance(measured, PhaseRecord):
        return measured
    buggy, baseline, figures, seconds, output = measured
    verdict = memory_source.judge_memory(buggy, baseline, None)
    figures.update(verdict.figures(), at_least=symptom.at_least, oom=symptom.oom)
    said = memory_source.describe(buggy, baseline)
    if verdict.growth_fraction_low >= symptom.at_least:
        return PhaseRecord("reproduce", "reproduced", True, f"memory grows: {said}", figures, seconds, output)
    return PhaseRecord("reproduce", "not_reproduced", False, f"growth {verdict.growth_fraction_low:.3f} (lower bound) of the baseline's peak per step < {symptom.at_least}: {said}", figures, seconds, output)


def memory_budget(cfg: DictConfig, device: str) -> dict[str, float] | None:
    budget = OmegaConf.select(cfg, f"memory.budget.{device}")
    return None if budget is None else {key: float(value) for key, value in budget.items() if value is not None}


_BASELINES: dict[str, Any] = {}  # the baseline's measurement, per config, within one run of the harness


def _memory_judged(phase: str, candidate: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> PhaseRecord:
    measured = _measure_pair(phase, candidate, cfg, settings)
    if isinstance(measured, PhaseRecord):
        return measured
    fix_memory, baseline, figures, seconds, output = measured
    budget = memory_budget(cfg, settings.device)
    verdict = memory_source.judge_memory(fix_memory, baseline, budget)
    figures.update(verdict.figures(), budget=budget)
    said = memory_source.describe(fix_memory, baseline)
    message = {
        "measured": f"{said}; no memory budget on {settings.device}",
        "within_budget": f"{said}; within budget {budget}",
        "over_budget": f"{said}; over budget: {'; '.join(verdict.reasons)}",
        "inconclusive": f"{said}; {'; '.join(verdict.reasons)}",
    }[verdict.status]
    return PhaseRecord(phase, verdict.status, verdict.status != "over_budget", message, figures, seconds, output)


def _measure_pair(phase: str, candidate: str, cfg: DictConfig, settings: Settings) -> tuple | PhaseRecord:
    """`candidate` and the baseline, each over the steps in a child of its own; a PhaseRecord where one broke."""
    steps = _memory_steps(cfg, settings)
    result = _measure(candidate, cfg, settings, steps)
    if result.status != "returned" or result.value is not None or result.talk is None:
        return _memory_abnormal(phase, result)
    graded = submission_of(cfg) is not None
    if graded:  # the model solution, in a child that never imports the submission (as speed's grading)
        base = _measure(FIXED, OmegaConf.create({k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != SUBMITTED_KEY}), settings, steps)
    else:
        key = f"{settings.device}:{steps}:{settings.memory}:{OmegaConf.to_yaml(cfg)}"
        if key not in _BASELINES:
            _BASELINES[key] = _measure(MEMORY_BASELINE, cfg, settings, steps)
        base = _BASELINES[key]
    if base.status != "returned" or base.value is not None or base.talk is None:
        broke = _memory_abnormal(phase, base)
        return dataclasses.replace(broke, status="error", ok=False, message=f"the memory baseline's child: {broke.message}")
    level = settings.memory.level
    fix_memory = memory_source.step_memory(result.talk, settings.device, level)
    baseline = memory_source.step_memory(base.talk, settings.device, level)
    figures: dict[str, Any] = {"steps": steps, "warmup": settings.memory.warmup, "device": settings.device, "baseline_function": FIXED if graded else MEMORY_BASELINE, "source": memory_source.source_name(settings.device), "method": memory_source.METHOD}
    figures.update(fix_memory.figures())
    figures["baseline"] = baseline.figures()
    if settings.device == "cpu" and not result.talk["hwm_reset"]:
        figures["peak_caveat"] = "the high-water mark could not be reset: peaks are since the child started"
    figures.update(containment(result))
    return fix_memory, baseline, figures, round(result.seconds + base.seconds, 4), result.output


def _memory_steps(cfg: DictConfig, settings: Settings) -> int:
    steps = int(OmegaConf.select(cfg, "memory.steps") or settings.memory.steps)
    if submission_of(cfg) is not None:  # a submitted fix cannot know which call is the last one measured
        steps += secrets.randbelow(4)
    return steps


def _measure(candidate: str, cfg: DictConfig, settings: Settings, steps: int) -> ChildResult:
    confined = confinement(cfg, settings) if candidate == FIXED else None
    talk = functools.partial(_drive_memory, device=settings.device)
    return run_isolated(_memory_in_child, candidate, cfg, settings.device, steps, settings.memory.warmup, timeout_s=settings.timeout_s, confined=confined, talk=talk)


def _drive_memory(connection, pid: int, deadline: float, *, device: str) -> dict[str, Any]:
    return memory_source.drive_steps(connection, pid, deadline, device)


def _memory_in_child(candidate: str, cfg: DictConfig, device: str, steps: int, warmup: int, *, connection) -> Failure | None:
    """Serve the parent's memory steps (harness/memory.py) for `candidate`: FIXED (the fix under test), "buggy",
    MEMORY_BASELINE (default `speed_baseline`) or a memory control; None when every step ran."""
    if device == "cpu":
        memory_source.pin_cpu_allocator()
        torch.set_num_threads(1)
    case = load_case(cfg.name)
    if candidate == MEMORY_BASELINE:
        function = getattr(case, MEMORY_BASELINE, case.speed_baseline)
    elif candidate.startswith(MEMORY_FIX):
        function = case.memory_fixes[candidate.removeprefix(MEMORY_FIX)]
    elif candidate == "buggy":
        function = case.buggy
    else:
        function = _function(case, candidate, cfg)
    inputs = case.make_inputs(memory_config(cfg, device), device)
    try:
        memory_source.serve_steps(connection, _compiled(function, case, cfg), inputs, device, steps, warmup)
    except Exception as error:  # noqa: BLE001
        return Failure.from_exception(error)
    return None


def memory_config(cfg: DictConfig, device: str) -> DictConfig:
    """The config memory inputs are made from: the speed inputs (`speed_config`: the same functions are compared),
    then `memory.inputs`."""
    return OmegaConf.merge(speed_config(cfg, device), OmegaConf.select(cfg, "memory.inputs") or {})


def _memory_abnormal(phase: str, result: ChildResult) -> PhaseRecord:
    if result.status == "returned" and result.value is not None:
        return _record(phase, "raised", False, result.value.headline, result, {"raised_at": result.value.where})
    if result.status == "returned":
        return _record(phase, "crashed", False, "the memory child stopped answering the parent", result)
    return _abnormal(phase, result)


# -- shared --------------------------------------------------------------------------------


def _function(case: ModuleType, name: str, cfg: DictConfig) -> Callable[[Any], Any]:
    """The case function a phase runs: FIXED, SPEED_CANDIDATE (default `fixed`), "slow_fix:<name>", or a bad
    fix's name. When grading, FIXED and SPEED_CANDIDATE are the submitted fix (`fix_under_test`)."""
    if name == FIXED or (name == SPEED_CANDIDATE and submission_of(cfg) is not None):
        return fix_under_test(case, cfg)
    if name == SPEED_CANDIDATE:
        return getattr(case, SPEED_CANDIDATE, case.fixed)
    if name.startswith(SLOW_FIX):
        return case.slow_fixes[name.removeprefix(SLOW_FIX)]
    return case.bad_fixes[name]


def _call(function: Callable, inputs: Any, device: str, *, synchronise: bool = True) -> tuple[Any, Failure | None]:
    """Run case code, synchronising so that an asynchronous CUDA error surfaces here."""
    try:
        output = function(inputs)
        if synchronise:
            synchronize(device)
        return output, None
    except BaseException as error:  # noqa: BLE001 - every failure of case (or submitted) code is a result, SystemExit too
        return None, Failure.from_exception(error)


def _abnormal(phase: str, result: ChildResult) -> PhaseRecord:
    if result.status == "raised":
        return _record(phase, "error", False, f"the case failed before the phase could run: {result.failure.headline}", result, {"traceback": result.failure.traceback})
    status = {"signalled": "crashed", "exited": "crashed", "timeout": "timeout", "limit": "crashed"}[result.status]
    said = result.output.rpartition("[harness] ")[2].strip() if "[harness] " in result.output else ""
    return _record(phase, status, False, result.summary + (f" ({said})" if said else ""), result, {"signal": result.signal} if result.signal else {})


def _record(phase: str, status: str, ok: bool, message: str, result: ChildResult, figures: dict | None = None) -> PhaseRecord:
    return PhaseRecord(phase, status, ok, message, {**(figures or {}), **containment(result)}, round(result.seconds, 4), result.output)


def containment(result: ChildResult) -> dict[str, Any]:
    """What a confined child tried or left behind, and how it was held: for the grade's integrity check."""
    said = {"refused_writes": result.refused_writes, "left_behind": result.left_behind, "confinement": result.confinement}
    return {key: value for key, value in said.items() if value}


def _difference(figures: dict[str, Any]) -> str:
    if "reason" in figures:
        return figures["reason"]
    parts = []
    if figures["integers"]:
        parts.append(f"{figures['mismatched_integers']} of {figures['integers']} integers differ")
    if figures["floats"]:
        parts.append(f"{figures['mismatched_floats']} of {figures['floats']} floats beyond tolerance, max |diff| {figures['max_abs_diff']:.3g}")
    if "snr_db" in figures:
        parts.append(f"relative error {figures['relative_error']:.3g} (SNR {figures['snr_db']:.1f} dB)")
    if any(d["output"] != "output" for d in figures.get("differing", [])):  # a single tensor needs no name
        named = ", ".join(d["output"].removeprefix("output") or "output" for d in figures["differing"][:4])
        parts.append(f"in {named}" + (f" and {figures['outputs_differing'] - 4} more" if figures["outputs_differing"] > 4 else ""))
    return "; ".join(parts)


def _tolerance(cfg: DictConfig) -> str:
    return f"(atol {cfg.tolerance.atol}, rtol {cfg.tolerance.rtol}; integers exact)"


def _first_matching_line(pattern: str, output: str) -> str | None:
    for line in output.splitlines():
        if re.search(pattern, line):
            return line.strip()[:500]
    return None
