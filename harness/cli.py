"""`python -m harness case=<name> [device=auto|cpu|cuda] [phases=[...]]`: a thin Hydra entry point.

Exit status: 0 every phase met its expectation; 1 some phase did not;
2 the command line or config is wrong (Hydra's own config errors included);
3 the requested device is not available.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.console import Console

from harness.cases import ROOT
from harness.records import CaseRecord
from harness.report import print_progress, print_report, print_summary
from harness.run import ConfigError, DeviceUnavailable, probe_environment, resolve_device, run_case, validate

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_NO_DEVICE = 0, 1, 2, 3

_worst_exit = EXIT_OK
_jobs_started = 0
_environment: dict | None = None
_finished: list[tuple[CaseRecord, Path]] = []


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    global _worst_exit, _jobs_started
    _jobs_started += 1
    _worst_exit = max(_worst_exit, run_from_config(cfg, Path(HydraConfig.get().runtime.output_dir)))


def run_from_config(cfg: DictConfig, output_dir: Path, console: Console | None = None) -> int:
    """Run one configured case and print its report; returns the exit status."""
    global _environment
    console = console or _console()
    try:
        validate(cfg)
        if _environment is None:  # probed once per process: a multirun reuses it
            _environment = probe_environment()
        device = resolve_device(cfg.device, _environment)
        record, path = run_case(
            cfg,
            device,
            output_dir,
            _environment,
            on_phase=lambda phase, phase_record: print_progress(console, cfg.case.name, device, phase, phase_record),
        )
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except DeviceUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_NO_DEVICE
    print_report(console, record, path)
    _finished.append((record, path))
    return EXIT_OK if record.ok else EXIT_CHECK_FAILED


def _console() -> Console:
    return Console(highlight=False, width=shutil.get_terminal_size((120, 24)).columns)  # 120 wide in logs and pipes


def main() -> None:
    try:
        _hydra_main()
    except SystemExit as exit_:
        if exit_.code not in (None, 0) and _jobs_started == 0:
            sys.exit(EXIT_USAGE)  # Hydra refused the command line (unknown case, bad override)
        raise
    if len(_finished) > 1:
        print_summary(_console(), _finished)
    sys.exit(_worst_exit)
