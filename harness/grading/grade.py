"""Grade a fix written by someone else: `python -m harness case=<name> fix=<file.py>:<function>`.

The submitted function replaces the case's `fixed` in the fix, correct and speed phases (see
`harness.phases.fix_under_test`); reproduce runs as always, and the case's controls (slow, bad and
memory fixes: they show the harness can fail on the case, which its own run does, and say nothing of
a submission) are left out. Grading adds what a fix written by someone else needs and the case's own
does not:

    correct                the submitted fix runs in one child (the file imported there, never in the
    correct:second_inputs  parent); its output and its inputs afterwards come back as `torch.save` bytes.
                           A second, clean child, where the submitted code never ran, builds the inputs
                           again, computes the reference from them, loads the bytes (`weights_only`) and
                           judges, first failure first:
                               wrong_output    not tensors, or another count, shape, dtype or device
                               mismatch        values beyond the case's tolerance
                               aliases_input   an output shares storage with an input
                               changed_inputs  a tensor, parameter, buffer, plain attribute or key of the inputs changed
                           `correct:second_inputs` does it again on inputs from a seed drawn for this grade
                           alone (`secrets`; recorded afterwards), in fresh processes: a remembered or
                           hard-coded result fails there.
    speed                  the submitted fix timed against the case's `fixed` (the model solution) on the
                           parent's clock (harness/measure/clock.py), judged against `speed.grade_budget` where a case
                           sets one, else `speed.budget`; then, first failure first:
                               timed_output_wrong         a timed output picked after its call differs from the
                                                          reference for its inputs (judged in a clean child)
                               clock_tampered             the graded process's own clock disagrees with the parent's
                               work_beside_the_clock      CPU past one core (past the model solution's) in a block, or while idle
                               faster_on_repeated_inputs  a cache answers the timed inputs after their first call
                               implausibly_fast           below IMPLAUSIBLY_FAST times the model solution
    memory                 where the case sets a memory budget (`memory.grade_budget`, else `memory.budget`; else not run):
                           the submitted fix's memory over the steps (harness/measure/footprint.py), in a confined child,
                           against the case's `fixed` in a child that never imports it, over a number of
                           steps the submission cannot know;
                           its resident memory read from outside its process. An interval that still
                           straddles the budget is `undecided`, a rejection. Without a budget it is not run.
    integrity              last, in this process: the project's sources byte-identical (a changed one is
                           restored: tampered), no write outside the sandbox attempted (wrote_outside_sandbox),
                           no process of the submission left running (left_processes, killed).

Every child that imports the submitted file confines itself first (harness/process/confine.py: Landlock, a
write guard, rlimits); the harness's own process never imports it.
A crash or a hang is the verdict `crashed` or `timeout`. The verdict comes from the records, never
from what the submitted code printed. What the graded process reports about its inputs could be
forged by code that subverts the harness inside that process; its output cannot pass that way, as
it is judged elsewhere against a reference computed elsewhere.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import inspect
import io
import re
import secrets
import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import torch
from omegaconf import DictConfig, OmegaConf

from harness.cases import REQUIRED_SECTIONS, ROOT, Slow, global_names, load_case, reachable, symptom_on
from harness.measure.compare import compare, flatten_tensors, named_tensors, snapshot, tolerance_of
from harness.phases import CASE_CONTROLS, Settings, fix_under_test, memory_budget, speed_config
from harness.phases import run_phase as run_case_phase
from harness.phases.common import abnormal, call, compiled_for, difference, record_of, tolerance_text
from harness.process.confine import Limits
from harness.process.isolate import ChildResult, run_isolated
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py
from harness.records import CaseRecord, PhaseRecord

IMPLAUSIBLY_FAST = 0.25  # submitted / model solution: below this the fix is flagged, not praised
GRADED_PHASES = ("fix", "correct", "correct:second_inputs", "speed", "integrity")
PROJECT_SOURCES = ("harness/**/*.py", "cases/**/*.py", "conf/**/*.yaml", "pyproject.toml")  # byte-identical after grading, or restored
HINT_STEPS = 3
EXERCISE_FUNCTION = "fix"


class BadSubmission(ValueError):
    """The fix= argument names no usable function: bad usage, one line, nothing has run."""


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    line: str


# -- the submitted file, checked before anything runs ----------------------------------------------


def submission(spec: str, timeout_s: float) -> Submission:
    """`<file.py>:<function>` checked: the file exists and compiles, and, imported in a child, has that function."""
    path_text, colon, function = str(spec).rpartition(":")
    if not colon or not path_text or not function.isidentifier():
        raise BadSubmission(f"fix={spec}: expected <file.py>:<function>, e.g. fix=my_fix.py:fix")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise BadSubmission(f"fix={spec}: no such file {path}")
    source = path.read_bytes()
    try:
        compile(source, str(path), "exec")
    except SyntaxError as error:
        raise BadSubmission(f"{path}:{error.lineno}: {type(error).__name__}: {error.msg}") from None
    submitted = Submission(str(path), function, file_sha256(path))
    problem = _import_problem(submitted, timeout_s)
    if problem:
        raise BadSubmission(problem)
    return submitted


def _import_problem(submitted: Submission, timeout_s: float) -> str | None:
    """A usage error in the file (its import raised an exception: a missing module, a name error; no such
    function), or None. An import that crashes, kills or stops its parent, hangs, exits or writes outside its
    sandbox is no usage error but the submission's own doing: the grade runs and rejects it (`run_phase`)."""
    result = import_check(submitted, timeout_s)
    if result.refused_writes or result.left_behind:
        return None
    if result.status == "raised":
        failure = result.failure
        if "Exception" not in failure.types:  # SystemExit, KeyboardInterrupt: it left, it did not fail to load
            return None
        lines = re.findall(rf'File "{re.escape(submitted.path)}", line (\d+)', failure.traceback)
        return f"{submitted.path}:{lines[-1] if lines else 1}: importing it raised {failure.headline}"
    if result.status != "returned":
        return None
    return result.value


_IMPORTED: dict[Submission, ChildResult] = {}


def import_check(submitted: Submission, timeout_s: float) -> ChildResult:
    """The file imported once in a confined child of its own, per version of the file: how that ended."""
    if submitted not in _IMPORTED:
        _IMPORTED[submitted] = run_isolated(_import_in_child, submitted.path, submitted.function, timeout_s=timeout_s, confined=Limits())
    return _IMPORTED[submitted]


def import_failure(cfg: DictConfig, timeout_s: float) -> ChildResult | None:
    """How importing the graded file went wrong (it crashed, hung, exited, killed or stopped its parent), or None."""
    submitted = submission_of(cfg)
    if submitted is None:
        return None
    result = import_check(submitted, timeout_s)
    if result.status == "returned" and not result.refused_writes and not result.left_behind:
        return None
    if result.status == "raised" and "Exception" in result.failure.types:  # a usage error, refused before any phase; or changed since
        return None
    return result if result.status != "returned" else None


def _not_imported(phase: str, result: ChildResult) -> Iterator[PhaseRecord]:
    """The phases that would import the file, when its import check did not end: one verdict, every grade,
    whichever process the import happened to take down."""
    status = {"raised": "raised", "signalled": "crashed", "exited": "crashed", "timeout": "timeout", "limit": "crashed"}[result.status]
    said = result.output.rpartition("[harness] ")[2].strip() if "[harness] " in result.output else ""
    what = f"importing it {result.summary}" + (f" ({said})" if said and not result.lost_server else "")
    for name in {"fix": ["fix"], "correct": ["correct", "correct:second_inputs"], "speed": ["speed"]}[phase]:
        message = what if name == "fix" else f"not run: {what} (the fix check)"
        yield record_of(
            name, status, False, message, result, {"import_check": result.status, **({"signal": result.signal} if result.signal else {})}
        )


def _import_in_child(path: str, function: str) -> str | None:
    module = import_file(path)
    if not hasattr(module, function):
        defined = sorted(name for name, value in vars(module).items() if inspect.isfunction(value) and value.__module__ == module.__name__)
        return f"{path}: no function {function!r} (functions defined there: {', '.join(defined) or 'none'})"
    if not callable(getattr(module, function)):
        return f"{path}: {function!r} is a {type(getattr(module, function)).__name__}, not a function"
    return None


def graded_config(case_cfg: DictConfig, submitted: Submission) -> DictConfig:
    """The case config the phases get when grading: the submission, the grading speed budget, and only the
    `speed.also` comparisons that apply to a submitted fix (one that sets `graded: false` times something else
    than a whole fix, e.g. one training step where the fix is a launch)."""
    graded = OmegaConf.create({**OmegaConf.to_container(case_cfg, resolve=True), SUBMITTED_KEY: dataclasses.asdict(submitted)})
    grade_budget = OmegaConf.select(case_cfg, "speed.grade_budget")
    if grade_budget is not None:
        graded.speed.budget = grade_budget
    memory_grade_budget = OmegaConf.select(case_cfg, "memory.grade_budget")
    if memory_grade_budget is not None:
        graded.memory.budget = memory_grade_budget
    also = OmegaConf.select(graded, "speed.also")
    if also:
        graded.speed.also = {name: comparison for name, comparison in also.items() if comparison.get("graded", True)}
    return graded


# -- the phases when grading -------------------------------------------------------------------------


def phases_of_a_grade(phases: list[str], cfg: DictConfig, device: str) -> list[str]:
    """The configured phases that judge a submission, or show its failure: the case's controls left out, and
    the memory phase where the case sets no memory budget on this device (it would give figures only)."""
    return [name for name in phases if name not in CASE_CONTROLS and (name != "memory" or memory_budget(cfg, device) is not None)]


def run_phase(phase: str, case: ModuleType, cfg: DictConfig, settings: Settings) -> Iterator[PhaseRecord]:
    """As `harness.phases.run_phase`, with the graded checks in place of `correct` and around fix and speed."""
    failed = import_failure(cfg, settings.timeout_s) if phase in ("fix", "correct", "speed") else None
    if failed is not None:
        yield from _not_imported(phase, failed)
        return
    if phase == "correct":
        yield correct(case, cfg, settings)
        yield correct(case, OmegaConf.merge(cfg, {"seed": private_seed(cfg.seed)}), settings, "correct:second_inputs")
        return
    for record in run_case_phase(phase, case, cfg, settings):
        if phase == "fix":
            yield _name_the_symptom(record, case, settings.device)
        elif record.phase == "speed" or record.phase.startswith("speed:"):
            yield _name_the_slow_symptom(_flag_implausibly_fast(check_timed_outputs(record, cfg, settings)), case, settings.device)
        elif record.phase == "memory" and record.status == "inconclusive":
            yield dataclasses.replace(record, status="undecided", ok=False, message=record.message + "; a grade must be decisive")
        else:
            yield record


def private_seed(published: int) -> int:
    """A seed drawn for this grade alone, never the case's published one: inputs no submission can know ahead."""
    while (seed := secrets.randbelow(1 << 31)) == published:
        pass
    return seed


def correct(case: ModuleType, cfg: DictConfig, settings: Settings, phase: str = "correct") -> PhaseRecord:
    ran = run_isolated(_run_submitted_in_child, cfg, settings.device, timeout_s=settings.timeout_s, confined=settings.limits)
    if ran.status != "returned":
        return abnormal(phase, ran)
    sent, failure = ran.value
    if failure is not None:
        return record_of(phase, "raised", False, failure.headline, ran, {"raised_at": failure.where, "seed": cfg.seed})
    if isinstance(sent, str):
        return record_of(phase, "wrong_output", False, sent, ran, {"seed": cfg.seed})
    judged = run_isolated(_judge_in_child, cfg, settings.device, sent, timeout_s=settings.timeout_s)
    if judged.status != "returned":
        return abnormal(phase, judged)
    status, message, figures = judged.value
    if status == "passed":
        message = "matches the reference " + tolerance_text(cfg) + "; no output aliases an input; inputs unchanged"
    elif status == "mismatch":
        message = "differs from the reference: " + difference(figures)
    return record_of(phase, status, status == "passed", message, ran, {**figures, "seed": cfg.seed})


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
        return "wrong_output", f"its output could not be read back as plain tensors ({type(error).__name__})", {}
    return judge(got["output"], want, got["inputs"], pristine, **tolerance_of(cfg.tolerance))


def judge(
    output: list, reference: Any, inputs_after: dict, pristine: dict, *, atol: float, rtol: float, scale: float = 0.0
) -> tuple[str, str, dict[str, Any]]:
    """(status, message, figures): the first check the output (its tensors in order, a None where a gradient was never
    computed) fails against the reference's output, or "passed"."""
    want = [tensor for _, tensor in named_tensors(reference)]
    if len(output) != len(want):
        return "wrong_output", f"{len(output)} tensors, the reference has {len(want)}", {}
    for index, (got, expected) in enumerate(zip(output, want)):
        if got is None or expected is None:
            continue  # compare names a None where the other has a tensor
        for what in ("shape", "dtype", "device"):
            if getattr(got, what) != getattr(expected, what):
                mine, theirs = _show(getattr(got, what)), _show(getattr(expected, what))
                return (
                    "wrong_output",
                    f"output tensor {index} has {what} {mine}, the reference {theirs}",
                    {what: mine, f"reference_{what}": theirs},
                )
    figures = compare(output, reference, atol=atol, rtol=rtol, scale=scale)
    if not figures["match"]:
        return "mismatch", "", figures
    tensors_in = {path: value for path, value in inputs_after.items() if isinstance(value, torch.Tensor)}
    for index, got in enumerate(output):
        shared = None if got is None else next((path for path, tensor in tensors_in.items() if _overlap(got, tensor)), None)
        if shared is not None:
            return (
                "aliases_input",
                f"output tensor {index} shares storage with the input {shared}: a caller's input would change with it",
                {**figures, "aliased": shared},
            )
    changed = [path for path in pristine if path not in inputs_after or not _identical(pristine[path], inputs_after[path])]
    changed += [path for path in inputs_after if path not in pristine]
    if changed:
        return (
            "changed_inputs",
            f"the fix changed its inputs: {', '.join(changed[:3])}" + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""),
            {**figures, "changed": changed[:20]},
        )
    return "passed", "", figures


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


def check_timed_outputs(record: PhaseRecord, cfg: DictConfig, settings: Settings) -> PhaseRecord:
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
        judged = run_isolated(_judge_timed_in_child, cfg, settings.device, inputs, kept, settings.cpu_threads, timeout_s=settings.timeout_s)
        if judged.status != "returned":
            return abnormal(record.phase, judged)
        wrong, message = judged.value
        figures["timed_outputs_wrong"] = wrong
        if wrong:
            line = f"{wrong} of {len(kept)} checked timed outputs differ from the reference for their inputs (first: {message}); what is timed must be what is checked"
            return dataclasses.replace(record, status="timed_output_wrong", ok=False, message=line, figures=figures)
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
        want, failure = call(case.reference, case.make_inputs(seeded, device), device)
        if failure is not None:
            raise RuntimeError(f"the reference itself failed: {failure.headline}")
        replayed: dict[int, list] = {}  # stateful: per timing process, its inputs and how many calls of `fixed` they have had
        for entry in sorted((e for e in kept if e["seed"] == seed), key=lambda e: e.get("step") or 0):
            if stateful:  # the model solution replays the calls before the checked one, then the reference takes that state
                state = replayed.setdefault(entry["process"], [case.make_inputs(seeded, device), 0])
                for _ in range(entry["step"] - state[1]):
                    case.fixed(state[0])
                state[1] = entry["step"]
                want, failure = call(case.reference, state[0], device)
                if failure is not None:
                    raise RuntimeError(f"the reference itself failed: {failure.headline}")
            status, message = _judge_kept(entry["path"], flatten_tensors(want), cfg)
            if status != "passed":
                wrong += 1
                first = first or f"process {entry['process']}, timed block {entry['block']}: {status}: {message}"
    return wrong, first


def _judge_kept(path: str, want: list, cfg: DictConfig) -> tuple[str, str]:
    if path.endswith(".txt"):
        return "wrong_output", Path(path).read_text()
    try:
        got = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - anything but plain tensors: a subclass, an object
        return "wrong_output", f"not plain tensors ({type(error).__name__})"
    status, message, figures = judge(got, want, {}, {}, **tolerance_of(cfg.tolerance))
    return status, message or (difference(figures) if status == "mismatch" else "")


# -- the project, untouched --------------------------------------------------------------------------


def project_sources() -> dict[str, bytes]:
    """The harness's, the cases' and the configs' files, by path relative to the project root."""
    return {
        str(path.relative_to(ROOT)): path.read_bytes()
        for pattern in PROJECT_SOURCES
        for path in sorted(ROOT.glob(pattern))
        if path.is_file()
    }


def integrity(before: dict[str, bytes], record: CaseRecord) -> PhaseRecord:
    """After grading: the project's sources byte-identical (a changed file is restored, and rejects the fix), no
    write outside a child's scratch directory attempted, no process of the submission left running."""
    after = project_sources()
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    for path in changed:
        target = ROOT / path
        if path in before:
            target.write_bytes(before[path])
        else:
            target.unlink(missing_ok=True)
    refused = list(dict.fromkeys(line for phase in record.phases for line in phase.figures.get("refused_writes", [])))
    left = list(dict.fromkeys(line for phase in record.phases for line in phase.figures.get("left_behind", [])))
    confinement = next((phase.figures["confinement"] for phase in record.phases if phase.figures.get("confinement")), None)
    figures = {
        "sources": len(before),
        "source_sha256": {path: hashlib.sha256(data).hexdigest() for path, data in sorted(before.items())},
        "sources_sha256": hashlib.sha256(
            b"".join(path.encode() + hashlib.sha256(data).digest() for path, data in sorted(before.items()))
        ).hexdigest(),
        "changed": changed,
        "refused_writes": refused,
        "left_behind": left,
        "confinement": confinement,
    }
    if changed:
        return PhaseRecord(
            "integrity",
            "tampered",
            False,
            f"the grade changed {', '.join(changed[:3])}: restored from the copy read before grading",
            figures,
        )
    signals = [line.removeprefix("kill ") for line in refused if line.startswith("kill ")]
    if signals:
        return PhaseRecord(
            "integrity",
            "signalled_outside_sandbox",
            False,
            f"the submission tried to signal a process outside its own (refused): {'; '.join(signals[:3])}",
            figures,
        )
    if refused:
        return PhaseRecord(
            "integrity",
            "wrote_outside_sandbox",
            False,
            f"the submission tried to write outside its scratch directory (refused): {'; '.join(refused[:3])}",
            figures,
        )
    if left:
        return PhaseRecord(
            "integrity",
            "left_processes",
            False,
            f"the submission left {len(left)} process(es) running after its call (killed): {left[0]}",
            figures,
        )
    return PhaseRecord(
        "integrity",
        "passed",
        True,
        f"{len(before)} project sources unchanged (sha256 {figures['sources_sha256'][:12]}); no write outside the sandbox; no process left",
        figures,
    )


def _name_the_symptom(record: PhaseRecord, case: ModuleType, device: str) -> PhaseRecord:
    """A fix that still raises the case's own error says so: the bug is still there."""
    symptom = symptom_on(case.symptoms[device], torch.__version__)
    raised = record.message.partition(":")[0]
    if not hasattr(symptom, "exception"):  # `Growth`, `WrongResult`, `Warns`, `Slow`: nothing raised
        return record
    if record.status == "raised" and (raised == symptom.exception or re.search(symptom.message, record.message)):
        return dataclasses.replace(record, message=f"{record.message} (the case's own symptom: the bug is still there)")
    return record


def _name_the_slow_symptom(record: PhaseRecord, case: ModuleType, device: str) -> PhaseRecord:
    """A fix of a case whose failure is time (`Slow`), timed over budget: the case's own symptom, still there."""
    symptom = symptom_on(case.symptoms[device], torch.__version__)
    if isinstance(symptom, Slow) and record.status == "over_budget":
        return dataclasses.replace(record, message=f"{record.message} (the case's own symptom, slow: the bug is still there)")
    return record


def _flag_implausibly_fast(record: PhaseRecord) -> PhaseRecord:
    ratio = record.figures.get("ratio_high", record.figures.get("ratio"))
    if not record.ok or ratio is None or ratio >= IMPLAUSIBLY_FAST:
        return record
    message = (
        f"{ratio:.3f}x the model solution's time, under {IMPLAUSIBLY_FAST}x: implausibly fast "
        "(a fix that skips the work, returning a remembered or hard-coded result, looks like this)"
    )
    return dataclasses.replace(
        record, status="implausibly_fast", ok=False, message=message, figures={**record.figures, "implausibly_fast_below": IMPLAUSIBLY_FAST}
    )


# -- the verdict -------------------------------------------------------------------------------------


def verdict(record: CaseRecord) -> Verdict:
    """Accepted when every graded check that ran passed, with what was checked; else the first failing one
    (the integrity check first: it names what a submission did to the grader), with its evidence."""
    graded = [phase for phase in record.phases if phase.phase in GRADED_PHASES or phase.phase.startswith("speed:") or _memory_judged(phase)]
    failed = sorted((phase for phase in graded if not phase.ok), key=lambda phase: phase.phase != "integrity")
    if failed:
        also = "".join(f"; also {phase.phase}: {phase.status}" for phase in failed[1:4])
        refused = (
            " (writes outside its scratch directory, and signals to processes not its own, are refused while grading)"
            if re.search(r"Permission ?denied|PermissionError", failed[0].message) and "grading: " not in failed[0].message
            else ""
        )
        return Verdict(False, f"rejected by {failed[0].phase}: {failed[0].status}: {' '.join(failed[0].message.split())}{refused}{also}")
    if not graded:
        return Verdict(False, "rejected: no graded check ran (phases= must include fix, correct or speed)")
    skipped = [name for name in GRADED_PHASES if name not in {phase.phase for phase in graded}]
    return Verdict(
        True,
        "accepted: "
        + ", ".join(phase.phase for phase in graded)
        + " passed"
        + (f" ({', '.join(skipped)} not run)" if skipped else "")
        + _what_was_checked(graded),
    )


def _memory_judged(phase: PhaseRecord) -> bool:
    """The memory phase is a graded check where the case sets a memory budget (else its figures are for show)."""
    return phase.phase == "memory" and (bool(phase.figures.get("budget")) or not phase.ok)


def _what_was_checked(graded: list[PhaseRecord]) -> str:
    by_name = {phase.phase: phase.figures for phase in graded}
    said = []
    if "speed" in by_name and "timed_outputs_checked" in by_name["speed"]:
        speed = by_name["speed"]
        said.append(f"{speed['timed_outputs_checked']} of {speed['timed_outputs_of']} timed outputs checked, the parent's clock decided")
    if "integrity" in by_name:
        integrity_figures = by_name["integrity"]
        said.append(f"writes: {(integrity_figures.get('confinement') or 'not confined').partition(';')[0].removeprefix('writes: ')}")
        said.append(f"{integrity_figures['sources']} sources unchanged (sha256 {integrity_figures['sources_sha256'][:12]})")
    return f" ({'; '.join(said)})" if said else ""


def solution_diff(submitted: Submission, case: ModuleType) -> str:
    """Unified diff from the case's own `fixed` to the submitted function (shown after an accepted grade)."""
    source = Path(submitted.path).read_text()
    node = next(
        (n for n in ast.parse(source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == submitted.function), None
    )
    mine = ast.get_source_segment(source, node) if node is not None else source
    theirs = inspect.getsource(case.fixed)
    name = case.__name__.rpartition(".")[2]
    return "".join(
        difflib.unified_diff(
            theirs.splitlines(True), (mine + "\n").splitlines(True), f"cases/{name}.py: fixed", f"{submitted.path}: {submitted.function}"
        )
    )


# -- hints and exercises -----------------------------------------------------------------------------


def hint(case_cfg: DictConfig, step: int) -> str:
    hints = list(case_cfg.get("hints") or [])
    return f"hint {step} of {len(hints)} for {case_cfg.name}: {' '.join(str(hints[step - 1]).split())}"


def hint_problem(case_cfg: DictConfig, step: Any) -> str | None:
    hints = case_cfg.get("hints") or []
    if not hints:
        return f"case {case_cfg.name} has no hints (conf/case/{case_cfg.name}.yaml: hints)"
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= len(hints):
        return f"hint={step}: choose a step from 1 to {len(hints)}"
    return None


def write_exercise(name: str, directory: str) -> Path:
    """A starter file in `directory`: the buggy function as `fix`, what it needs, the story without its fix."""
    folder = Path(directory).expanduser().resolve()
    path = folder / f"fix_{name}.py"
    if path.exists():
        raise FileExistsError(f"exercise={directory}: {path} exists (your work?); delete it or choose another directory")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(starter_source(load_case(name), path))
    return path


def starter_source(case: ModuleType, path: Path) -> str:
    name = case.__name__.rpartition(".")[2]
    copied = reachable(case, [case.buggy]) - reachable(case, [case.fixed])
    grade_command = f"python -m harness case={name} fix={path}:{EXERCISE_FUNCTION}"
    story = _without_fix_section(case.__doc__ or "")
    header = (
        f'r"""{story}\n\nYour task: `{EXERCISE_FUNCTION}` below is the buggy code{" (with the helpers it calls that the bug is in)" if len(copied) > 1 else ""}.\n'
        f"Change it so that it returns what the case's reference returns, without the failure above.\n\n"
        f"Grade it:\n    {grade_command}\nHints, one step at a time:\n    python -m harness case={name} hint=1\n"
        '"""\n\n'
    )
    main = f'\n\nif __name__ == "__main__":\n    print("grade this file with: {grade_command}")\n'
    return header + _functions_as_a_module(case, copied, case.buggy) + main


def solution_source(case: ModuleType) -> str:
    """The case's own fix written out as a submission: `fixed` as `fix`, with the helpers only the solution uses
    (the tripwires guard the case module's copies of those), the rest imported from the case as a starter does."""
    name = case.__name__.rpartition(".")[2]
    copied = reachable(case, [case.fixed]) - reachable(case, [case.buggy])
    return f'"""The case\'s own fix for {name}, written out as a submission."""\n\n' + _functions_as_a_module(case, copied, case.fixed)


def _functions_as_a_module(case: ModuleType, copied: set, entry: Any) -> str:
    """Imports, names taken from the case, and the source of `copied` in file order, `entry` renamed `fix`."""
    name = case.__name__.rpartition(".")[2]
    ordered = sorted(copied, key=lambda f: f.__code__.co_firstlineno)
    copied_names = {function.__name__ for function in ordered}
    needed = [n for function in ordered for n in global_names(function.__code__) if n not in copied_names and n in vars(case)]
    imports, from_case = [], []
    for needed_name in dict.fromkeys(needed):
        value = vars(case)[needed_name]
        if isinstance(value, ModuleType):
            imports.append(f"import {value.__name__}" + ("" if value.__name__ == needed_name else f" as {needed_name}"))
        else:
            from_case.append(needed_name)
    functions = []
    for function in ordered:
        source = textwrap.dedent(inspect.getsource(function))
        functions.append(
            re.sub(rf"^def {entry.__name__}\(", f"def {EXERCISE_FUNCTION}(", source, count=1, flags=re.M) if function is entry else source
        )
    body = "\n".join(sorted(imports)) + "\n\n" + (f"from cases.{name} import {', '.join(sorted(from_case))}\n" if from_case else "")
    return body + "\n\n" + "\n\n".join(functions)


def _without_fix_section(doc: str) -> str:
    kept, skipping = [], False
    for line in doc.strip().splitlines():
        starts = re.match(r"^([A-Z][A-Za-z ]*?):(?:\s+|$)", line)
        if starts and starts.group(1) in REQUIRED_SECTIONS:
            skipping = starts.group(1) == "Fix"
        if not skipping:
            kept.append(line)
    return "\n".join(kept).rstrip().replace('"""', "'''")
