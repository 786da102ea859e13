"""`python -m harness case=<name> [device=auto|cpu|cuda] [phases=[...]]`: a thin Hydra entry point.

Exit status: 0 every phase met its expectation; 1 some phase did not;
2 the command line or config is wrong (Hydra's own config errors included);
3 the requested device is not available.
With fix=<file.py>:<function> (grading, harness/grading/grade.py): 0 accepted, 1 rejected, 2 bad usage (no such
file or function, a syntax error or an exception raised by its import), 3 no device; an import that crashes,
hangs, exits or kills its parent is a rejection (1). hint=<n> and exercise=<dir> print or
write, then exit 0 (2 on bad usage).

A multirun's summary and exit status come from its jobs' files on disk (harness/sweep.py), so
they are right whichever launcher ran the jobs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape

from harness import sweep
from harness.cases import ROOT, case_names, load_case
from harness.grading import grade
from harness.records import slurm_job
from harness.report import print_progress, print_report
from harness.run import (
    ConfigError,
    DeviceUnavailable,
    JobCut,
    cut_by_signals,
    make_spec,
    probe_environment,
    resolve_device,
    run_spec,
    submitted_fix,
    validate,
)
from harness.spec import RunSpec
from harness.sweep import EXIT_CHECK_FAILED, EXIT_OK, read_token, report_sweep, write_status

EXIT_USAGE, EXIT_NO_DEVICE = 2, 3
USAGE = "python -m harness case=<name> [device=auto|cpu|cuda] [compile=off|inductor|aot_eager] [phases=[...]] [fix=<file.py>:<function> | hint=<n> | exercise=<dir>]"

_worst_exit = EXIT_OK
_jobs_started = 0
_environment: dict | None = None


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    # Launchers other than the basic one pickle this function by value: keep its body a call by name.
    _run_job(cfg)


def _platform(spec: RunSpec) -> str:
    """'cpu', or 'cpu, inductor' where the phases run compiled."""
    return spec.device if spec.compile == "off" else f"{spec.device}, {spec.compile}"


def _run_job(cfg: DictConfig) -> None:
    """One Hydra job, in whichever process its launcher runs it."""
    global _worst_exit, _jobs_started
    _jobs_started += 1
    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    if hydra_cfg.mode != RunMode.MULTIRUN:
        _worst_exit = max(_worst_exit, _run(cfg, output_dir).exit_code)
        return
    status = {
        "sweep": read_token(Path(str(hydra_cfg.sweep.dir))),
        "job": int(hydra_cfg.job.num),
        "case": str(cfg.case.name),
        "device": str(cfg.device),
        "overrides": list(hydra_cfg.overrides.task),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": (slurm_job() or {}).get("job"),  # None outside SLURM
        "exit_code": None,  # stays None if the job is killed (a SLURM time limit, a worker crash)
        "record": None,
        "error": None,
    }
    write_status(output_dir, status)
    try:
        outcome = _run(cfg, output_dir)
    except JobCut as cut:  # exit_code stays None: counted as cut, with the record of the phases so far
        write_status(output_dir, {**status, "cut": str(cut), "record": cut.record_path.name if cut.record_path else None})
        print(f"error: {cut}" + (f"; the record, to the phase it cut: {cut.record_path}" if cut.record_path else ""), file=sys.stderr)
        raise SystemExit(128 + getattr(signal, cut.signal)) from None
    except Exception as error:  # a harness bug: Hydra reports it too; the status says the job failed
        write_status(output_dir, {**status, "exit_code": EXIT_CHECK_FAILED, "error": f"{type(error).__name__}: {error}"})
        raise
    write_status(output_dir, {**status, "exit_code": outcome.exit_code, "record": outcome.record_name, "error": outcome.error})


@dataclass
class _Outcome:
    exit_code: int
    record_name: str | None = None  # file name of the record, in the job's output dir
    error: str | None = None  # why no case ran (bad config, missing device)


def _run(cfg: DictConfig, output_dir: Path, console: Console | None = None) -> _Outcome:
    """Run one configured case and print its report."""
    global _environment
    console = console or _console()
    try:
        validate(cfg)
        if cfg.hint is not None:
            if grade.hint_problem(cfg.case, cfg.hint):
                raise ConfigError(grade.hint_problem(cfg.case, cfg.hint))
            print(grade.hint(cfg.case, cfg.hint))
            return _Outcome(EXIT_OK)
        if cfg.exercise is not None:
            return _write_exercise(cfg)
        submitted = submitted_fix(cfg)
        if submitted is not None:
            console.print(
                f"[bold]grading a submitted fix[/bold]: {escape(submitted.spec)} (sha256 {submitted.sha256[:12]}) on case {cfg.case.name}",
                highlight=False,
                soft_wrap=True,
            )
        with cut_by_signals():
            if _environment is None:  # probed once per process: a multirun reuses it
                _environment = probe_environment()
            spec = make_spec(cfg, resolve_device(cfg.device, _environment))  # validated above, once
            record, path = run_spec(
                spec,
                output_dir,
                _environment,
                on_phase=lambda phase, phase_record: print_progress(console, spec.case, _platform(spec), phase, phase_record),
            )
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return _Outcome(EXIT_USAGE, error=str(error))
    except DeviceUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return _Outcome(EXIT_NO_DEVICE, error=str(error))
    with console:  # one write: parallel jobs' reports do not interleave
        print_report(console, record, path, show_fix=submitted is None or grade.verdict(record).accepted)
        if submitted is not None:
            return _Outcome(_print_verdict(console, record, submitted), record_name=path.name)
    return _Outcome(EXIT_OK if record.ok else EXIT_CHECK_FAILED, record_name=path.name)


def _print_verdict(console: Console, record, submitted) -> int:
    verdict = grade.verdict(record)
    if verdict.accepted:
        console.print("the case's own fix, against yours:", highlight=False)
        console.print(escape(grade.solution_diff(submitted, load_case(record.case))), highlight=False)
    colour = "green" if verdict.accepted else "red"
    console.print(f"[{colour}]{escape(verdict.line)}[/{colour}]", highlight=False, soft_wrap=True)  # one line, whatever its length
    return EXIT_OK if verdict.accepted else EXIT_CHECK_FAILED


def _write_exercise(cfg: DictConfig) -> _Outcome:
    try:
        path = grade.write_exercise(cfg.case.name, str(cfg.exercise))
    except OSError as error:
        raise ConfigError(str(error)) from None
    print(f"wrote {path}\ngrade it with: python -m harness case={cfg.case.name} fix={path}:{grade.EXERCISE_FUNCTION}")
    return _Outcome(EXIT_OK)


def _console() -> Console:
    return Console(highlight=False, width=shutil.get_terminal_size((120, 24)).columns)  # 120 wide in logs and pipes


_LAUNCHER_PLUGINS = {"local_parallel": "hydra_joblib_launcher", "joblib": "hydra_joblib_launcher", "slurm": "hydra_submitit_launcher"}


def launcher_installed(plugin: str) -> bool:
    try:
        return importlib.util.find_spec(f"hydra_plugins.{plugin}") is not None
    except ModuleNotFoundError:  # no Hydra plugin at all: not even the hydra_plugins namespace
        return False


def _hint_at_missing_launchers() -> None:
    for arg in sys.argv[1:]:
        name = arg.partition("hydra/launcher=")[2]
        plugin = _LAUNCHER_PLUGINS.get(name) or ("hydra_submitit_launcher" if name.startswith("submitit") else None)
        if plugin and not launcher_installed(plugin):
            print(f"hint: hydra/launcher={name} needs the launchers: pip install -e '.[scale]'", file=sys.stderr)


def _print_usage_without_a_case() -> bool:
    """`--help` with no case=: Hydra's help composes a config, which needs a case; give the usage instead."""
    args = sys.argv[1:]
    if not any(arg in ("--help", "-h") for arg in args) or any(arg.startswith("case=") for arg in args):
        return False
    print(f"usage: {USAGE}\ncases: {', '.join(case_names())}\nevery setting, for one case: python -m harness case=<name> --help")
    return True


def main() -> None:
    if _print_usage_without_a_case():
        sys.exit(EXIT_OK)
    try:
        _hydra_main()
    except JobCut as cut:  # SIGTERM or SIGUSR2 (harness/run.py): the record says which phase it cut
        where = f"; the record, to the phase it cut: {cut.record_path}" if cut.record_path else ""
        print(f"error: {cut}{where}", file=sys.stderr)
        if sweep.current is not None and sweep.sweep_jobs(*sweep.current):
            report_sweep(*sweep.current, _console())
        sys.exit(128 + getattr(signal, cut.signal))
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            if sweep.current is not None and sweep.sweep_jobs(*sweep.current):
                sys.exit(
                    max(EXIT_CHECK_FAILED, report_sweep(*sweep.current, _console()))
                )  # a job or the launcher failed (Hydra said which)
            if _jobs_started == 0:
                _hint_at_missing_launchers()
                sys.exit(EXIT_USAGE)  # Hydra refused the command line (unknown case, bad override)
        raise
    if sweep.current is not None:
        sys.exit(report_sweep(*sweep.current, _console()))
    sys.exit(_worst_exit)
