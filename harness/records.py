"""Typed result records, the environment fingerprint, and the JSON file they go to."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.cases import ROOT
from harness.process.submitted import Submission
from harness.recordset import RECORD_FORMAT, check_format

UPSTREAM_PACKAGES = ("torch", "snac", "speechbrain", "torchaudio", "mmsegmentation", "mmengine", "mmcv", "mmcv-lite", "hydra-core", "numpy")


@dataclass
class PhaseRecord:
    phase: str
    status: str  # a member of its phase's family in harness/statuses.py, kept as its plain string (as JSON reads it back)
    ok: bool  # the status is the one this phase expects
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    output_tail: str = ""  # what the isolated child printed (CUDA device assertions, faulthandler stacks)

    def __post_init__(self) -> None:
        self.status = str(self.status)  # a StrEnum member's value: every writer sees the string the records hold


@dataclass
class CaseRecord:
    case: str
    title: str
    device: str
    started_at: str
    environment: dict[str, Any]
    config: dict[str, Any]
    phases: list[PhaseRecord] = field(default_factory=list)
    finished_at: str | None = None  # None while running: a record left like that was cut short
    graded_fix: Submission | None = None  # set when a submitted fix was graded (fix=<file.py>:<function>)
    verdict: str | None = None  # the grade's last line: "accepted: ..." or "rejected by <check>: ..."
    compile: str = "off"  # torch.compile's backend every phase ran under, or off (eager): harness/compiled.py
    format_version: int = RECORD_FORMAT  # the JSON layout, checked when read (harness/recordset.py)

    @property
    def ok(self) -> bool:
        return bool(self.phases) and all(phase.ok for phase in self.phases)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ok": self.ok}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_record(record: CaseRecord, path: Path) -> None:
    """Write atomically, so a crash mid-write never leaves a torn record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(record.to_json(), indent=2, default=str) + "\n")
    os.replace(partial, path)


def load_record(path: Path) -> CaseRecord:
    """A record back from its JSON file (fields a newer harness added are ignored; a newer format is refused)."""
    data = json.loads(Path(path).read_text())
    check_format(data, Path(path))
    phase_fields = {f.name for f in dataclasses.fields(PhaseRecord)}
    record_fields = {f.name for f in dataclasses.fields(CaseRecord)} - {"phases"}
    phases = [PhaseRecord(**{k: v for k, v in phase.items() if k in phase_fields}) for phase in data.get("phases", [])]
    record = CaseRecord(**{k: v for k, v in data.items() if k in record_fields}, phases=phases)
    if isinstance(record.graded_fix, dict):
        record.graded_fix = Submission(**record.graded_fix)
    return record


def host_environment() -> dict[str, Any]:
    """What the parent can tell without touching CUDA; the device part comes from `probe_device`."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": _package_versions(),
        "git_commit": _git_commit(),
        "argv": sys.argv,
        **({"slurm": slurm_job()} if slurm_job() else {}),
    }


def slurm_job() -> dict[str, str] | None:
    """The SLURM job this process runs in (None outside one): `job` is the id squeue, sacct and scancel take,
    `<array job>_<task>` for a job of an array (as submitit submits a sweep), and names its .submitit folder."""
    if "SLURM_JOB_ID" not in os.environ:
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = {"job": f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"], "job_id": os.environ["SLURM_JOB_ID"]}
    for key, variable in (("cluster", "SLURM_CLUSTER_NAME"), ("partition", "SLURM_JOB_PARTITION"), ("node", "SLURMD_NODENAME")):
        if os.environ.get(variable):
            job[key] = os.environ[variable]
    return job


def probe_device() -> dict[str, Any]:
    """Runs in an isolated child: initialising CUDA in the parent would break every later fork."""
    import torch

    cuda_available = torch.cuda.is_available()
    probe: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": cuda_available,
        "cpu_threads": torch.get_num_threads(),
        "cpu": _cpu_model(),
        "cpu_capability": _cpu_capability(torch),  # the vector ISA torch's CPU kernels dispatch to
    }
    if cuda_available:
        probe["cuda_device_count"] = torch.cuda.device_count()
        probe["cuda_device_name"] = torch.cuda.get_device_name(0)
        probe["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        probe["cuda_driver"] = _nvidia_driver()
    return probe


def _cpu_capability(torch: Any) -> str | None:
    """torch.backends.cpu is from torch 2.0 (None before: a case's older releases run beside the matrix's)."""
    cpu = getattr(torch.backends, "cpu", None)
    return cpu.get_cpu_capability() if cpu is not None else None


def _cpu_model() -> str | None:
    """The processor's name (a speed ratio is a ratio on that CPU: a float16 step costs 7x more on one than another)."""
    try:
        return next(
            (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
            None,
        )
    except OSError:
        return platform.processor() or None


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in UPSTREAM_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _git_commit() -> str | None:
    """HEAD of the checkout, `-dirty` with uncommitted changes; for a copied tree (a lent GPU machine, whose .git
    need not be the sender's), what the sender put in TORCH_ERROR_CASES_COMMIT."""
    if os.environ.get("TORCH_ERROR_CASES_COMMIT"):
        return os.environ["TORCH_ERROR_CASES_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _nvidia_driver() -> str | None:
    try:
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return query.stdout.strip().splitlines()[0] if query.returncode == 0 and query.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None
