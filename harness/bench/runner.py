"""Grade a folder of fixes, one `python -m harness case=<case> fix=<file>:fix` process per case, resumably.

Each grade runs as its own process in a session of its own, bounded in wall time, so a submission that kills,
stops or hangs its grader costs that case a named verdict and nothing else. What a finished grade found is
written to OUT/cases/<case>.json (atomically) before the next starts; a grade in progress has a marker in
OUT/running/. A run started again over the same OUT reads the finished cases back (grading none of them
twice, unless its file changed since), kills what an interrupted grade left running (its marker names the
session), and grades the rest. A file under grade each time a run died (INTERRUPTIONS times) is not graded again:
it may be what kills the run, which shares its user. OUT/log.jsonl says when each grade started and ended.

Parallel grades each get a slice of the CPUs of their own (`sched_setaffinity`), never shared, so that one
grade's work cannot land on the cores another grade is timing on; on CUDA grades run one at a time (one
device: a second grade's kernels would share the GPU that is timing).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.bench.run_folder import CaseResult, Run, kill_session
from harness.cases import ROOT

INTERRUPTIONS = 2  # runs killed while grading one file, after which it is not graded again (it may be what kills them)
CPUS_PER_GRADE = 2  # a grade's timing child runs single-threaded beside the parent that reads its clock and CPU time
GRADE_WALL_S = 3600.0  # the grader's own per-phase timeouts (timeout_s) end a hang well before this
GRADER = ("-m", "harness")  # what grades one file: `python -m harness case=<case> fix=<file>:fix ...`
# A grade's checks (memory only where the case sets a budget). Whether the failure reproduces on this torch is the
# matrix's question, not each submission's: run again per grade it cost recompile_limit a compiled timing.
BENCH_PHASES = ("fix", "correct", "speed", "memory")
EXIT_ACCEPTED, EXIT_REJECTED, EXIT_USAGE, EXIT_NO_DEVICE = 0, 1, 2, 3

# Each grade's process sets these before it becomes `python -m harness`: it dies with the bench (PR_SET_PDEATHSIG),
# and keeps to its CPU slice.
_LAUNCH = """
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
if sys.argv[2]:
    os.sched_setaffinity(0, {int(cpu) for cpu in sys.argv[2].split(",")})
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


@dataclass(frozen=True)
class Settings:
    device: str = "cpu"
    compile: str = "off"
    timeout_s: float = 300.0  # per phase, the grader's own `timeout_s`
    wall_s: float = GRADE_WALL_S  # per grade, the bench's bound on a grader that does not end

    def overrides(self) -> list[str]:
        return [f"device={self.device}", f"compile={self.compile}", f"timeout_s={self.timeout_s:g}", f"phases=[{','.join(BENCH_PHASES)}]"]


def discover(fixes: Path, cases: list[str], out: Path) -> tuple[dict[str, list[Path]], list[Path]]:
    """The `fix_<case>.py` files under `fixes` (any depth, `out` left out) by case, and those that name no case."""
    by_case: dict[str, list[Path]] = {}
    unmatched: list[Path] = []
    for path in sorted(fixes.rglob("fix_*.py")):
        if out in path.parents or not path.is_file():
            continue
        name = path.stem.removeprefix("fix_")
        if name in cases:
            by_case.setdefault(name, []).append(path)
        else:
            unmatched.append(path)
    return by_case, unmatched


def default_jobs(device: str) -> int:
    """Grades at once: one per `CPUS_PER_GRADE` CPUs this process may use, one on CUDA (one device to time on)."""
    return 1 if device == "cuda" else max(1, len(os.sched_getaffinity(0)) // CPUS_PER_GRADE)


def cpu_slices(jobs: int) -> list[list[int]]:
    cpus = sorted(os.sched_getaffinity(0))
    size = max(1, len(cpus) // jobs)
    return [cpus[i * size : (i + 1) * size] for i in range(jobs)]


def _sha256_or_why(path: Path) -> tuple[str, str | None]:
    """The file's sha256, or why it cannot be read."""
    try:
        return sha256_of(path), None
    except OSError as error:
        return "", error.strerror or type(error).__name__


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def grade_one(case: str, path: Path, out: Path, settings: Settings, cpus: list[int], run: Run) -> CaseResult:
    """Grade one file in a process of its own; the result as its record says, or as its process ended."""
    sha256 = sha256_of(path)
    base = CaseResult(case, "", files=[str(path)], sha256=sha256)
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as error:
        return dataclasses.replace(
            base, status="syntax_error", verdict=f"{path.name}:{error.lineno}: SyntaxError: {error.msg}", seconds=0.0
        )
    except ValueError as error:  # null bytes (a SyntaxError from Python 3.12)
        return dataclasses.replace(base, status="syntax_error", verdict=f"{path.name}: {error}", seconds=0.0)
    folder = out / "grades" / case
    if folder.exists():  # what a grade cut short had written: this grade starts clean
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = [
        sys.executable,
        "-c",
        _LAUNCH,
        str(os.getpid()),
        ",".join(map(str, cpus)),
        *GRADER,
        f"case={case}",
        f"fix={_quoted(str(path))}:fix",
        *settings.overrides(),
        f"hydra.run.dir={_quoted(str(folder))}",
    ]
    started = time.monotonic()
    with open(folder / "grade.log", "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=folder,
            env=_grader_environment(),
        )
        with run.running(case, sha256, process.pid):
            run.log(case=case, event="start", pid=process.pid, file=str(path), sha256=sha256)
            try:
                code: int | None = process.wait(timeout=settings.wall_s)
            except subprocess.TimeoutExpired:
                code = None
            kill_session(process.pid, 0)
            process.wait()
    seconds = round(time.monotonic() - started, 2)
    result = _read_outcome(dataclasses.replace(base, seconds=seconds, exit_code=code), folder, out, settings)
    run.log(case=case, event="done", status=result.status, seconds=seconds)
    return result


def _grader_environment() -> dict[str, str]:
    """The bench's environment, with this harness first on the path: the grader is the harness that made the task set."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _read_outcome(result: CaseResult, folder: Path, out: Path, settings: Settings) -> CaseResult:
    records = sorted(p for p in folder.glob(f"{result.case}.*.json"))
    record = json.loads(records[0].read_text()) if records else None
    said = _last_error_line(folder / "grade.log")
    if result.exit_code is None:
        return dataclasses.replace(result, status="grader_timeout", verdict=f"the grader did not end within {settings.wall_s:g} s (killed)")
    if result.exit_code == EXIT_USAGE:
        return dataclasses.replace(result, status="bad_submission", verdict=said or "the grader refused the file (exit 2)")
    if result.exit_code == EXIT_NO_DEVICE:
        return dataclasses.replace(result, status="no_device", verdict=said or f"device={settings.device} is not available here")
    verdict = (record or {}).get("verdict")
    if result.exit_code not in (EXIT_ACCEPTED, EXIT_REJECTED) or not verdict:
        how = f"killed by {signal.Signals(-result.exit_code).name}" if result.exit_code < 0 else f"exit {result.exit_code}"
        return dataclasses.replace(
            result, status="grader_crashed", verdict=f"the grader ended without a verdict ({how}){': ' + said if said else ''}"
        )
    accepted = verdict.startswith("accepted")
    first = re.match(r"rejected by ([^:]+): ([^:]+):", verdict)
    phases = {phase["phase"]: phase for phase in record["phases"]}
    return dataclasses.replace(
        result,
        status="accepted" if accepted else "rejected",
        verdict=verdict,
        first_failing=f"{first.group(1)}: {first.group(2)}" if first else None,
        speed=_speed(phases.get("speed")),
        memory=_memory(phases.get("memory")),
        record=str(records[0].relative_to(out)),
    )


def _speed(phase: dict | None) -> dict[str, Any] | None:
    if phase is None or "ratio" not in phase["figures"]:
        return None
    figures = phase["figures"]
    return {"status": phase["status"], **{key: figures.get(key) for key in ("ratio", "ratio_low", "ratio_high", "budget")}}


def _memory(phase: dict | None) -> dict[str, Any] | None:
    if phase is None:
        return None
    figures = phase["figures"]
    keys = ("growth_fraction", "growth_fraction_low", "growth_fraction_high", "peak_ratio", "budget")
    return {"status": phase["status"], **{key: figures[key] for key in keys if key in figures}}


def _last_error_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error: ")] if log.exists() else []
    return lines[-1].removeprefix("error: ") if lines else ""


def _quoted(value: str) -> str:
    """A value Hydra's override grammar reads back as it is (paths with spaces, `=` or quotes)."""
    if re.fullmatch(r"[\w./+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def grade_all(
    submissions: dict[str, list[Path]],
    cases: list[str],
    out: Path,
    settings: Settings,
    jobs: int,
    on_result: Callable[[CaseResult, bool], None] = lambda result, reused: None,
) -> dict[str, CaseResult]:
    """Every case's result: finished ones read back, the rest graded `jobs` at a time. `on_result(result, reused)`
    is called as each lands (from one thread at a time)."""
    run = Run(out)
    run.clear_interrupted()
    results: dict[str, CaseResult] = {}
    todo = _settled(submissions, cases, run, results, on_result)
    slices = cpu_slices(jobs) if jobs > 1 else [[]]
    free = list(range(len(slices)))
    lock, stopping = threading.Lock(), threading.Event()

    def work(case: str, path: Path) -> None:
        with lock:
            slot = free.pop()
        try:
            result = grade_one(case, path, out, settings, slices[slot], run)
        finally:
            with lock:
                free.append(slot)
        if stopping.is_set():  # its grade was killed with the run: graded again next time, never kept as a crash
            return
        run.keep(result)
        with lock:
            results[case] = result
            on_result(result, False)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(slices))
    try:
        for future in [pool.submit(work, case, path) for case, path in todo]:
            future.result()
    except BaseException:  # Ctrl-C, SIGTERM (raised by the CLI's handler), a bug: no grade outlives the run
        stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        run.clear_interrupted("stopped")
        raise
    pool.shutdown()
    return {case: results[case] for case in cases}


def _settled(
    submissions: dict[str, list[Path]],
    cases: list[str],
    run: Run,
    results: dict[str, CaseResult],
    on_result: Callable[[CaseResult, bool], None],
) -> list[tuple[str, Path]]:
    """Puts in `results` each case settled without a grade (no file, several, unreadable, finished before, crashed the
    bench too often); the cases left to grade, with their file."""
    todo: list[tuple[str, Path]] = []
    for case in cases:
        files = submissions.get(case, [])
        if not files:
            results[case] = CaseResult(case, "not_attempted", "no fix_<case>.py for this case")
        elif len(files) > 1:
            results[case] = CaseResult(
                case,
                "duplicate",
                f"{len(files)} files for one case, none graded: {', '.join(map(str, files))}",
                files=list(map(str, files)),
            )
        elif (sha256 := _sha256_or_why(files[0]))[1]:
            results[case] = CaseResult(case, "bad_submission", f"{files[0]}: cannot be read: {sha256[1]}", files=[str(files[0])])
        elif (kept := run.finished(case)) is not None and kept.sha256 == sha256[0] and kept.files == [str(files[0])]:
            results[case] = kept
            on_result(kept, True)
            continue
        elif (cut := run.interruptions(case, sha256[0])) >= INTERRUPTIONS:
            results[case] = CaseResult(
                case,
                "grader_crashed",
                f"the bench itself was killed {cut} times while grading this file (by the file, or from outside): not graded again; a fresh --out grades it anew",
                files=[str(files[0])],
                sha256=sha256[0],
            )
        else:
            todo.append((case, files[0]))
            continue
        run.keep(results[case])
        on_result(results[case], False)
    return todo
