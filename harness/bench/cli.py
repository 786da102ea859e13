"""The bench's command line. Exit status: 0 done (whatever the verdicts), 1 `compare` found a change, 2 bad usage."""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import signal
import sys
from pathlib import Path
from typing import Any

from harness.bench import scoreboard as boards
from harness.bench.run_folder import CaseResult, write_atomically
from harness.bench.runner import GRADE_WALL_S, Settings, default_jobs, discover, grade_all
from harness.bench.tasks import FORMAT, set_hash, submission_name, write_tasks
from harness.cases import case_names, load_case
from harness.compiled import MODES
from harness.records import host_environment, now

EXIT_OK, EXIT_CHANGED, EXIT_USAGE = 0, 1, 2
DEVICES = ("cpu", "cuda")


class UsageError(ValueError):
    pass


def main(argv: list[str]) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "grade":
            return _grade(args, rest)
        if rest:
            raise UsageError(f"unexpected arguments: {' '.join(rest)}")
        if args.command == "tasks":
            index = write_tasks(Path(args.out), _cases(args.cases))
            print(f"wrote {len(index['cases'])} tasks to {args.out} (task set sha256 {index['sha256']})")
        elif args.command == "compare":
            return _compare(Path(args.a), Path(args.b))
        elif args.command == "solutions":
            _write_submissions(Path(args.out), {name: _solution(name) for name in _cases(args.cases)})
        elif args.command == "split":
            _write_submissions(Path(args.out), _split(Path(args.file)))
    except (UsageError, RuntimeError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.bench", description="Every case as a task; one command that scores a set of fixes."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    tasks = commands.add_parser("tasks", help="write the task set: a folder per case with its starter and task card")
    tasks.add_argument("out")
    tasks.add_argument("--cases", help="comma-separated; default every case")
    grade = commands.add_parser("grade", help="grade every fix_<case>.py under FIXES; device=, compile= as for python -m harness")
    grade.add_argument("fixes")
    grade.add_argument(
        "--out", help="where grades, results and the scoreboard go (default FIXES/bench-<device>-<compile>); a run cut short picks up there"
    )
    grade.add_argument("--cases", help="comma-separated; default every case")
    grade.add_argument("--jobs", type=int, help="grades at once, each on CPUs of its own (default: one per 2 CPUs; 1 on CUDA)")
    grade.add_argument("--timeout-s", type=float, default=300.0, help="the grader's limit per phase (timeout_s), default 300")
    grade.add_argument(
        "--wall-s",
        type=float,
        default=GRADE_WALL_S,
        help=f"the bench's limit per grade, past which the grader is killed (grader_timeout), default {GRADE_WALL_S:g}",
    )
    compare = commands.add_parser("compare", help="what changed between two scoreboards (exit 1 when anything did)")
    compare.add_argument("a")
    compare.add_argument("b")
    solutions = commands.add_parser("solutions", help="write the cases' own fixes as submissions (a reference run: all accepted)")
    solutions.add_argument("out")
    solutions.add_argument("--cases")
    split = commands.add_parser("split", help="write one submission per function of FILE named after a case")
    split.add_argument("file")
    split.add_argument("out")
    return parser


def _cases(text: str | None) -> list[str]:
    known = case_names()
    if not text:
        return known
    asked = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in asked if name not in known]
    if unknown or not asked:
        raise UsageError(f"--cases: no case named {', '.join(unknown) or '(none given)'}; cases: {', '.join(known)}")
    return list(dict.fromkeys(asked))


def _settings(rest: list[str], timeout_s: float, wall_s: float) -> Settings:
    values = {"device": "cpu", "compile": "off"}
    for token in rest:
        key, equals, value = token.partition("=")
        if not equals or key not in values:
            raise UsageError(f"{token}: grade takes device=, compile= and the options of --help")
        values[key] = value
    if values["device"] not in DEVICES:
        raise UsageError(f"device={values['device']}: choose one of {', '.join(DEVICES)}")
    if values["compile"] not in MODES:
        raise UsageError(f"compile={values['compile']}: choose one of {', '.join(MODES)}")
    if not (timeout_s > 0 and wall_s > 0):
        raise UsageError(f"--timeout-s={timeout_s:g}, --wall-s={wall_s:g}: must be positive")
    return Settings(device=values["device"], compile=values["compile"], timeout_s=timeout_s, wall_s=wall_s)


def _grade(args: argparse.Namespace, rest: list[str]) -> int:
    settings = _settings(rest, args.timeout_s, args.wall_s)
    fixes = Path(args.fixes).expanduser().resolve()
    if not fixes.is_dir():
        raise UsageError(f"{args.fixes}: not a folder (it holds fix_<case>.py files)")
    cases = _cases(args.cases)
    out = Path(args.out).expanduser().resolve() if args.out else fixes / f"bench-{settings.device}-{settings.compile}"
    jobs = args.jobs if args.jobs is not None else default_jobs(settings.device)
    if jobs < 1 or (settings.device == "cuda" and jobs > 1):
        raise UsageError(f"--jobs={jobs}: at least 1, and 1 on CUDA (one device to time on)")
    submissions, unmatched = discover(fixes, cases, out)
    meta = {
        "fixes": str(fixes),
        "task_set": {"format": FORMAT, "sha256": set_hash(), "cases": cases},
        "settings": {"device": settings.device, "compile": settings.compile, "timeout_s": settings.timeout_s},
    }
    _check_same_run(out, meta)
    meta |= {"jobs": jobs, "environment": _environment(), "started_at": now(), "finished_at": None}
    print(
        f"grading {sum(len(files) for files in submissions.values())} files for {len(cases)} tasks into {out} ({jobs} at a time)",
        flush=True,
    )
    for path in unmatched:
        print(f"  {path}: names no case (unknown_case)", flush=True)
    landed: dict[str, CaseResult] = {}

    def on_result(result: CaseResult, reused: bool) -> None:
        landed[result.case] = result
        done = f"[{len(landed)}/{len(cases)}]"
        took = f" ({result.seconds:.0f} s)" if result.seconds else ""
        print(
            f"{done} {result.case}: {result.status}{' (graded before, kept)' if reused else took}"
            + (f": {result.first_failing}" if result.first_failing else ""),
            flush=True,
        )
        _write_board(out, {case: landed[case] for case in cases if case in landed}, unmatched, meta)

    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        results = grade_all(submissions, cases, out, settings, jobs, on_result)
    except KeyboardInterrupt:
        print(f"stopped: the grades finished so far are kept in {out}; run the same command to go on", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    meta["finished_at"] = now()
    board = _write_board(out, results, unmatched, meta)
    print(boards.markdown(board))
    print(f"scoreboard: {out / 'scoreboard.json'} and {out / 'scoreboard.md'}")
    return EXIT_OK


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _check_same_run(out: Path, meta: dict[str, Any]) -> None:
    """A run picks up only where the same run stopped: the same fixes, task set and settings."""
    path = out / "run.json"
    if path.exists():
        before = json.loads(path.read_text())
        differs = [key for key in meta if before.get(key) != meta[key]]
        if differs:
            raise UsageError(f"{out} holds a run with other {', '.join(differs)}: give another --out, or delete it to start again")
    else:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(meta, indent=2) + "\n")


def _write_board(out: Path, results: dict[str, CaseResult], unmatched: list[Path], meta: dict[str, Any]) -> dict[str, Any]:
    board = boards.scoreboard(results, [str(path) for path in unmatched], meta)
    write_atomically(out / "scoreboard.json", json.dumps(board, indent=2) + "\n")
    write_atomically(out / "scoreboard.md", boards.markdown(board))
    return board


def _environment() -> dict[str, Any]:
    import torch

    host = host_environment()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": host["platform"],
        "cpus": len(os.sched_getaffinity(0)),
        "git_commit": host["git_commit"],
        "packages": host["packages"],
    }


def _compare(a: Path, b: Path) -> int:
    try:
        boards_ = [json.loads(path.read_text()) for path in (a, b)]
        said = boards.changes(*boards_)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UsageError(f"cannot compare {a} and {b}: {type(error).__name__}: {error} (two scoreboard.json files?)") from None
    for line in said:
        print(line)
    if not said:
        print("no change: the same verdicts, and every speed ratio within the other's interval")
    return EXIT_CHANGED if said else EXIT_OK


def _solution(name: str) -> str:
    from harness.grading.grade import solution_source

    return solution_source(load_case(name))


def _split(file: Path) -> dict[str, str]:
    """FILE's source once per function named after a case, with `fix` bound to that function."""
    source = file.read_text()
    functions = [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]
    found = [name for name in functions if name in case_names()]
    if not found:
        raise UsageError(f"{file}: no function named after a case ({', '.join(case_names())})")
    return {name: f"{source.rstrip()}\n\n\nfix = {name}\n" for name in found}


def _write_submissions(out: Path, sources: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        (out / submission_name(name)).write_text(source)
    print(f"wrote {len(sources)} submissions to {out}: {', '.join(sources)}")
