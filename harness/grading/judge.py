"""The correct check of a grade: the submission's output, made in one child, judged in another against the reference.

Where the submission misses the reference, the clean child runs the case's own fix on the same inputs: on some
seeds the model solution misses its reference too (a float32 ReLU that flips on rounding where the float64
reference does not, a float16 norm of cancelling terms; `python -m harness.seed_sweep` measures how often). Those
inputs cannot tell a right fix from a wrong one by the reference, and every right fix shares the arithmetic that
missed: there the submission is judged against the model solution's output, with the same tolerance, and the record
says so (`judged_against`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cases import load_case
from harness.measure.compare import compare, flatten_tensors, named_tensors, snapshot, tolerance_of
from harness.phases import RunSpec, fix_under_test, speed_config
from harness.phases.common import abnormal, call, compiled_for, difference, record_of, tolerance_text
from harness.process.isolate import run_isolated
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py
from harness.records import PhaseRecord
from harness.statuses import Correct, Speed


def correct(case: ModuleType, spec: RunSpec, phase: str = "correct") -> PhaseRecord:
    cfg = spec.case_cfg
    ran = run_isolated(_run_submitted_in_child, cfg, spec.device, timeout_s=spec.timeout_s, confined=spec.limits)
    if ran.status != "returned":
        return abnormal(phase, ran)
    sent, failure = ran.value
    if failure is not None:
        return record_of(phase, Correct.RAISED, False, failure.headline, ran, {"raised_at": failure.where, "seed": cfg.seed})
    if isinstance(sent, str):
        return record_of(phase, Correct.WRONG_OUTPUT, False, sent, ran, {"seed": cfg.seed})
    judged = run_isolated(_judge_in_child, cfg, spec.device, sent, timeout_s=spec.timeout_s)
    if judged.status != "returned":
        return abnormal(phase, judged)
    status, message, figures = judged.value
    status = Correct(status)
    if status == Correct.PASSED:
        matched = "the reference " if "judged_against" not in figures else MATCHED_THE_MODEL_SOLUTION.format(**figures)
        message = "matches " + matched + tolerance_text(cfg) + "; no output aliases an input; inputs unchanged"
    elif status == Correct.MISMATCH:
        message = "differs from the reference: " + difference(figures)
    return record_of(phase, status, status.ok, message, ran, {**figures, "seed": cfg.seed})


MATCHED_THE_MODEL_SOLUTION = (
    "the case's own fix, which misses the reference on these inputs as well ({model_solution_excess:.3g}x its tolerance; "
    "the submission {reference_excess:.3g}x) "
)


def _run_submitted_in_child(cfg: DictConfig, device: str) -> tuple[bytes | str | None, Any]:
    """The only child that runs submitted code: its output and its inputs afterwards, as torch.save bytes."""
    save = torch.save  # bound before the submitted file is imported
    case = load_case(cfg.name)
    function = compiled_for(fix_under_test(case, cfg), case, cfg)  # under the run's compile mode, as every phase
    inputs = case.make_inputs(cfg, device)
    output, failure = call(function, inputs, device)
    if failure is not None:
        return None, failure
    try:
        tensors = [None if tensor is None else tensor.detach() for _, tensor in named_tensors(output)]  # a None: a gradient never computed
    except TypeError:
        return f"returned {type(output).__name__}, not tensors (a tensor, or a tuple, list or dict of them)", None
    subclass = next((type(tensor) for tensor in flatten_tensors(output) if type(tensor) is not torch.Tensor), None)
    if subclass is not None:
        return f"returned a {subclass.__module__}.{subclass.__qualname__}, a tensor subclass, not a plain torch.Tensor", None
    buffer = io.BytesIO()
    save({"output": tensors, "inputs": snapshot(inputs)}, buffer)  # one save: storage an output shares with an input stays shared
    return buffer.getvalue(), None


def _judge_in_child(cfg: DictConfig, device: str, sent: bytes) -> tuple[str, str, dict[str, Any]]:
    """In a clean child: pristine inputs, the reference from them, and the submitted output judged against both."""
    case = load_case(cfg.name)
    inputs = case.make_inputs(cfg, device)
    pristine = {path: value.clone() if isinstance(value, torch.Tensor) else value for path, value in snapshot(inputs).items()}
    want, failure = call(case.reference, inputs, device)
    if failure is not None:
        raise RuntimeError(f"the reference itself failed: {failure.headline}")
    try:
        got = torch.load(io.BytesIO(sent), weights_only=True)
    except Exception as error:  # noqa: BLE001 - anything but plain tensors and values
        return str(Correct.WRONG_OUTPUT), f"its output could not be read back as plain tensors ({type(error).__name__})", {}
    model_solution = lambda: _model_solution(case, cfg, device)  # noqa: E731 - run only where the submission misses
    status, message, figures = judge(
        got["output"], want, got["inputs"], pristine, **tolerance_of(cfg.tolerance), model_solution=model_solution
    )
    return str(status), message, figures  # plain data back to the parent (harness/process/isolate.py), which names it again


def _model_solution(case: ModuleType, cfg: DictConfig, device: str, inputs: Any = None) -> Any:
    """The case's `fixed` on fresh inputs (or on `inputs`), under the run's compile mode: what a right fix gives."""
    output, failure = call(compiled_for(case.fixed, case, cfg), case.make_inputs(cfg, device) if inputs is None else inputs, device)
    if failure is not None:
        raise RuntimeError(f"the case's own fix failed: {failure.headline}")
    return output


def judge(
    output: list,
    reference: Any,
    inputs_after: dict,
    pristine: dict,
    *,
    atol: float,
    rtol: float,
    scale: float = 0.0,
    model_solution: Callable[[], Any] | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """(status, message, figures): the first check the output (its tensors in order, a None where a gradient was never
    computed) fails against the reference's output, or "passed". Where it misses the reference, `model_solution`
    (called then) gives the case's own fix's output on the same inputs: if that misses the reference too, the
    output is judged against it instead (the module's docstring)."""
    want = [tensor for _, tensor in named_tensors(reference)]
    if len(output) != len(want):
        return Correct.WRONG_OUTPUT, f"{len(output)} tensors, the reference has {len(want)}", {}
    for index, (got, expected) in enumerate(zip(output, want)):
        if got is None or expected is None:
            continue  # compare names a None where the other has a tensor
        for what in ("shape", "dtype", "device"):
            if getattr(got, what) != getattr(expected, what):
                mine, theirs = _show(getattr(got, what)), _show(getattr(expected, what))
                return (
                    Correct.WRONG_OUTPUT,
                    f"output tensor {index} has {what} {mine}, the reference {theirs}",
                    {what: mine, f"reference_{what}": theirs},
                )
    figures = compare(output, reference, atol=atol, rtol=rtol, scale=scale)
    if not figures["match"] and model_solution is not None:
        figures = _against_the_model_solution(figures, output, reference, model_solution(), atol=atol, rtol=rtol, scale=scale)
    if not figures["match"]:
        return Correct.MISMATCH, "", figures
    tensors_in = {path: value for path, value in inputs_after.items() if isinstance(value, torch.Tensor)}
    for index, got in enumerate(output):
        shared = None if got is None else next((path for path, tensor in tensors_in.items() if _overlap(got, tensor)), None)
        if shared is not None:
            return (
                Correct.ALIASES_INPUT,
                f"output tensor {index} shares storage with the input {shared}: a caller's input would change with it",
                {**figures, "aliased": shared},
            )
    changed = [path for path in pristine if path not in inputs_after or not _identical(pristine[path], inputs_after[path])]
    changed += [path for path in inputs_after if path not in pristine]
    if changed:
        return (
            Correct.CHANGED_INPUTS,
            f"the fix changed its inputs: {', '.join(changed[:3])}" + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""),
            {**figures, "changed": changed[:20]},
        )
    return Correct.PASSED, "", figures


def _against_the_model_solution(
    figures: dict[str, Any], output: list, reference: Any, solution: Any, *, atol: float, rtol: float, scale: float
) -> dict[str, Any]:
    """The output's figures against the model solution's where that misses the reference too; else `figures`, with
    the model solution's own figure where it matched (so a rejection shows the seed was decidable)."""
    missed = compare(solution, reference, atol=atol, rtol=rtol, scale=scale)
    if missed["match"]:
        return {**figures, "model_solution_used": missed.get("tolerance_used", 0.0)}
    against = compare(output, solution, atol=atol, rtol=rtol, scale=scale)
    excess = {
        "reference_excess": figures.get("tolerance_excess", math.inf),
        "model_solution_excess": missed.get("tolerance_excess", math.inf),
    }
    return {**against, "judged_against": "model_solution", **excess} if against["match"] else {**figures, **excess}


def _show(value: Any) -> str:
    return str(tuple(value)) if isinstance(value, torch.Size) else str(value).removeprefix("torch.")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    a_storage, b_storage = a.untyped_storage(), b.untyped_storage()
    if a.device != b.device or not a_storage.nbytes() or not b_storage.nbytes():
        return False
    a_start, b_start = a_storage.data_ptr(), b_storage.data_ptr()
    return a_start < b_start + b_storage.nbytes() and b_start < a_start + a_storage.nbytes()


def _identical(before: Any, after: Any) -> bool:
    """Exactly equal: for tensors the same shape, dtype and bytes (so a NaN equals itself)."""
    if isinstance(before, torch.Tensor) != isinstance(after, torch.Tensor):
        return False
    if not isinstance(before, torch.Tensor):
        return before == after
    if before.shape != after.shape or before.dtype != after.dtype or before.device != after.device:
        return False
    return torch.equal(_bytes_of(before), _bytes_of(after))


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).contiguous().view(torch.uint8)


def check_timed_outputs(record: PhaseRecord, cfg: DictConfig, spec: RunSpec) -> PhaseRecord:
    """The timed calls' outputs the parent kept (harness/measure/clock.py), against the reference for the same
    inputs, computed in a clean child; a wrong one rejects the fix, whatever its speed."""
    kept = record.figures.pop("checked_outputs", None)
    check_dir = record.figures.pop("checked_dir", None)
    try:
        if kept is None:
            return record
        figures = {**record.figures, "timed_outputs_checked": len(kept), "timed_outputs_of": record.figures.get("timed_blocks", 0)}
        if not kept:
            return dataclasses.replace(record, figures=figures)
        also = record.phase.partition(":")[2]
        inputs = OmegaConf.select(cfg, f"speed.also.{also}.inputs") if also else None
        judged = run_isolated(_judge_timed_in_child, cfg, spec.device, inputs, kept, spec.cpu_threads, timeout_s=spec.timeout_s)
        if judged.status != "returned":
            return abnormal(record.phase, judged)
        wrong, message = judged.value
        figures["timed_outputs_wrong"] = wrong
        if wrong:
            line = f"{wrong} of {len(kept)} checked timed outputs differ from the reference for their inputs (first: {message}); what is timed must be what is checked"
            return dataclasses.replace(record, status=Speed.TIMED_OUTPUT_WRONG, ok=False, message=line, figures=figures)
        return dataclasses.replace(record, figures=figures)
    finally:
        if check_dir:
            shutil.rmtree(check_dir, ignore_errors=True)


def _judge_timed_in_child(cfg: DictConfig, device: str, inputs: Any, kept: list[dict[str, Any]], cpu_threads: int) -> tuple[int, str]:
    """(how many kept outputs are wrong, what was wrong with the first), one reference per timing process's seed. On
    CPU at the timing children's thread count: a float32 matmul rounds differently at 1 and 2 threads, and a ReLU
    that flips on it moves a gradient by more than a tolerance may allow."""
    case = load_case(cfg.name)
    if device == "cpu":
        torch.set_num_threads(cpu_threads)
    stateful = getattr(case, "carries_state", False)  # each call advances the state in its inputs (a training step)
    wrong, first = 0, ""
    for seed in dict.fromkeys(entry["seed"] for entry in kept):
        seeded = OmegaConf.merge(speed_config(cfg, device, inputs), {"seed": seed})
        if not stateful:  # one reference serves every output timed on this seed's inputs
            want, failure = call(case.reference, case.make_inputs(seeded, device), device)
            if failure is not None:
                raise RuntimeError(f"the reference itself failed: {failure.headline}")
        replayed: dict[int, list] = {}  # stateful: per timing process, its inputs and how many calls of `fixed` they have had
        for entry in sorted((e for e in kept if e["seed"] == seed), key=lambda e: e.get("step") or 0):
            if stateful:  # the model solution replays the calls before the checked one, then the reference takes that state
                if entry["process"] not in replayed:
                    replayed[entry["process"]] = [case.make_inputs(seeded, device), 0]
                state = replayed[entry["process"]]
                for _ in range(entry["step"] - state[1]):
                    case.fixed(state[0])
                state[1] = entry["step"]
                want, failure = call(case.reference, state[0], device)
                if failure is not None:
                    raise RuntimeError(f"the reference itself failed: {failure.headline}")
            # a kept output holds its tensors flattened (no None): the reference and the model solution alike
            steps = entry["step"] if stateful else None
            solution = lambda: flatten_tensors(_model_solution(case, seeded, device, _replayed(case, seeded, device, steps)))  # noqa: E731
            status, message = _judge_kept(entry["path"], flatten_tensors(want), cfg, solution)
            if status != Correct.PASSED:
                wrong += 1
                first = first or f"process {entry['process']}, timed block {entry['block']}: {status}: {message}"
    return wrong, first


def _replayed(case: ModuleType, cfg: DictConfig, device: str, steps: int | None) -> Any:
    """A stateful case's inputs as the checked call found them: fresh ones after `steps` calls of `fixed`, made only
    where the submission missed the reference (a copy kept at every checked call cost dataloader_worker_killed's grade
    110 s: its state holds 64 MiB of annotations); None (fresh inputs) for a case whose calls keep no state."""
    if steps is None:
        return None
    state = case.make_inputs(cfg, device)
    for _ in range(steps):
        case.fixed(state)
    return state


def _judge_kept(path: str, want: Any, cfg: DictConfig, model_solution: Callable[[], Any] | None) -> tuple[str, str]:
    if path.endswith(".txt"):
        return Correct.WRONG_OUTPUT, Path(path).read_text()
    try:
        got = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - anything but plain tensors: a subclass, an object
        return Correct.WRONG_OUTPUT, f"not plain tensors ({type(error).__name__})"
    status, message, figures = judge(got, want, {}, {}, **tolerance_of(cfg.tolerance), model_solution=model_solution)
    return status, message or (difference(figures) if status == Correct.MISMATCH else "")
