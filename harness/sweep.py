"""A multirun's jobs, wherever a launcher ran them: their exit statuses and records, read back from disk.

A multirun (`-m`) may run its jobs in the launching process (Hydra's basic launcher), in joblib
workers (`hydra/launcher=local_parallel`) or as SLURM jobs (`hydra/launcher=slurm`). Whichever,
each job leaves beside its record a small `exit_status` file (JSON) in its directory under the sweep
dir, and once the sweep returns the launching process builds the summary and the worst exit status
from those files, never from what it happened to see itself. A job that left no status, or one cut
short, counts as failed; so does a sweep that finds no job of its own on disk. Jobs cut from outside
(scancel, a time limit: their records end in a phase with status `cut`) are counted apart in the summary.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console

from harness.records import CaseRecord, load_record
from harness.report import print_summary

EXIT_OK, EXIT_CHECK_FAILED = 0, 1
JOB_STATUS = "exit_status"  # per multirun job, in its output dir: {"sweep", "job", "exit_code", "record", "error", ...}
SWEEP_TOKEN = ".harness_sweep"  # in the sweep dir: tells this sweep's jobs from an earlier sweep's in a reused dir

current: tuple[Path, str] | None = None  # (sweep dir, token), set in the launching process when a multirun starts


class SweepCallback(Callback):
    """Registered in conf/config.yaml. `on_multirun_start` runs in the process that launches the jobs,
    before any job: it notes the sweep dir and leaves a token there that every job copies into its status."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global current
        sweep_dir = Path(str(config.hydra.sweep.dir))
        token = uuid.uuid4().hex
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / SWEEP_TOKEN).write_text(token + "\n")
        current = (sweep_dir, token)


def read_token(sweep_dir: Path) -> str | None:
    try:
        return (sweep_dir / SWEEP_TOKEN).read_text().strip() or None
    except OSError:
        return None


def write_status(output_dir: Path, status: dict[str, Any]) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    partial = output_dir / f"{JOB_STATUS}.partial"
    partial.write_text(json.dumps(status) + "\n")
    os.replace(partial, output_dir / JOB_STATUS)


@dataclass
class SweepJob:
    """What one multirun job left on disk."""

    directory: Path
    status: dict[str, Any]
    record: CaseRecord | None
    record_path: Path | None

    @property
    def exit_code(self) -> int:
        code = self.status.get("exit_code")
        if code is None or (self.record is not None and self.record.finished_at is None):
            return EXIT_CHECK_FAILED  # cut short
        return int(code)

    @property
    def note(self) -> str | None:
        if self.status.get("cut"):  # it caught the signal: the record's last phase is the one it cut
            phase = self.record.phases[-1].phase if self.record is not None and self.record.phases else None
            return f"cut in phase {phase}: {self.status['cut']}" if phase else f"cut before any phase: {self.status['cut']}"
        if self.status.get("exit_code") is None:
            return "cut short: the job ended without an exit status"
        if self.record is not None and self.record.finished_at is None:
            return "cut short: the record is unfinished"
        if self.status.get("error"):
            return self.status["error"]
        if self.record is None:
            return f"exit {self.exit_code}, no record"
        return None


def sweep_jobs(sweep_dir: Path, token: str | None = None) -> list[SweepJob]:
    """Every job status under `sweep_dir` (from this sweep, if `token`), with its record, in job order."""
    jobs = []
    for status_path in sorted(sweep_dir.rglob(JOB_STATUS)):
        try:
            status = json.loads(status_path.read_text())
        except (OSError, ValueError):
            continue
        if token is not None and status.get("sweep") not in (token, None):
            continue  # an earlier sweep's job in a reused sweep dir (None: the job could not read the token)
        record, record_path = None, None
        if status.get("record"):
            record_path = status_path.parent / status["record"]
            try:
                record = load_record(record_path)
            except (OSError, ValueError, TypeError):
                record = None
        elif status.get("exit_code") is None:  # cut short: its record, if it wrote one, holds the phases so far
            found = sorted(status_path.parent.glob(f"{status.get('case')}.*.json"))
            if found:
                record_path = found[0]
                try:
                    record = load_record(record_path)
                except (OSError, ValueError, TypeError):
                    record, record_path = None, None
        jobs.append(SweepJob(status_path.parent, status, record, record_path))
    return sorted(jobs, key=lambda job: (job.status.get("job", 0), str(job.directory)))


def report_sweep(sweep_dir: Path, token: str | None, console: Console) -> int:
    """The summary of a finished multirun, from its files; returns the worst exit status."""
    jobs = sweep_jobs(sweep_dir, token)
    if not jobs:
        print(f"error: no job of this sweep left its status in {sweep_dir} (is it on a file system the jobs share?)", file=sys.stderr)
        return EXIT_CHECK_FAILED
    failed = [job for job in jobs if job.exit_code != EXIT_OK]
    if len(jobs) > 1 or failed:
        rows = [(job.record, job.record_path, job.note, job.status) for job in jobs]
        print_summary(console, rows, sweep_dir=sweep_dir)
    return max(job.exit_code for job in jobs)
