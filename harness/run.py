"""Run one case on one device: validate the config, run the phases, keep the record on disk."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from harness import compiled as compile_axis
from harness import grade
from harness.cases import case_names, case_text, fork_server_modules, load_case
from harness.isolate import preload, run_isolated
from harness.phases import PHASES, Settings, SpeedSettings, run_phase
from harness.records import CaseRecord, PhaseRecord, host_environment, now, probe_device, write_record

DEVICE_CHOICES = ("auto", "cpu", "cuda")
PROBE_TIMEOUT_S = 120.0


class ConfigError(ValueError):
    """The command line or a case yaml asks for something impossible; nothing has run."""


class DeviceUnavailable(RuntimeError):
    """The requested device is not present on this machine."""


def validate(cfg: DictConfig) -> None:
    if cfg.device not in DEVICE_CHOICES:
        raise ConfigError(f"device={cfg.device}: choose one of {', '.join(DEVICE_CHOICES)}")
    if compile_axis.problem(cfg.get("compile")):
        raise ConfigError(compile_axis.problem(cfg.get("compile")))
    phases = list(cfg.phases)
    if not phases:
        raise ConfigError("phases=[]: name at least one of " + ", ".join(PHASES))
    unknown = [phase for phase in phases if phase not in PHASES]
    if unknown:
        raise ConfigError(f"unknown phase {', '.join(map(str, unknown))}: choose from {', '.join(PHASES)}")
    if not cfg.timeout_s > 0:
        raise ConfigError(f"timeout_s={cfg.timeout_s}: must be positive")
    speed = speed_settings(cfg)
    if not (speed.pairs >= 2 and speed.warmup >= 0 and 2 <= speed.min_processes <= speed.max_processes and speed.max_s > 0 and speed.process_s >= 0 and 0 < speed.level < 1):
        raise ConfigError(
            f"speed: pairs={speed.pairs}, warmup={speed.warmup}, min_processes={speed.min_processes}, max_processes={speed.max_processes}, "
            f"max_s={speed.max_s}, process_s={speed.process_s}, level={speed.level}: need pairs >= 2, warmup >= 0, "
            "2 <= min_processes <= max_processes, max_s > 0, process_s >= 0, 0 < level < 1"
        )
    if not cfg.speed.cpu_threads >= 1:
        raise ConfigError(f"speed.cpu_threads={cfg.speed.cpu_threads}: need at least 1")
    if cfg.case.name not in case_names():
        raise ConfigError(f"case yaml names {cfg.case.name!r}, but cases/ has no such module ({', '.join(case_names())})")
    for scope in ("sizes", "speed.inputs.sizes", "speed.device_inputs.cpu.sizes", "speed.device_inputs.cuda.sizes"):
        for key, value in (OmegaConf.select(cfg.case, scope) or {}).items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"case.{scope}.{key}={value}: sizes must be positive integers")
    if sum(cfg.get(key) is not None for key in ("fix", "hint", "exercise")) > 1:
        raise ConfigError("fix=, hint= and exercise= are separate commands: give one of them")
    if cfg.get("hint") is not None and grade.hint_problem(cfg.case, cfg.hint):
        raise ConfigError(grade.hint_problem(cfg.case, cfg.hint))
    if cfg.get("exercise") is not None and not str(cfg.exercise).strip():
        raise ConfigError("exercise=: name a directory for the starter file")
    submitted_fix(cfg)


def submitted_fix(cfg: DictConfig) -> grade.Submission | None:
    """The fix= submission, checked (its import runs in a child, once per file version); None without fix=."""
    if cfg.get("fix") is None:
        return None
    preload_cases()  # the import check starts the fork server: let it preload the cases first
    try:
        path = Path(str(cfg.fix).rpartition(":")[0]).expanduser()
        return _checked_submission(str(cfg.fix), float(cfg.timeout_s), grade.file_sha256(path) if path.is_file() else "")
    except grade.BadSubmission as error:
        raise ConfigError(str(error)) from None


@functools.cache
def _checked_submission(spec: str, timeout_s: float, sha256: str) -> grade.Submission:  # sha256: a changed file is checked again
    return grade.submission(spec, timeout_s)


def speed_settings(cfg: DictConfig) -> SpeedSettings:
    """The timing settings: conf/config.yaml's `speed`, with any the case yaml's `speed` sets over them."""
    names = [f.name for f in dataclasses.fields(SpeedSettings)]
    merged = {name: cfg.speed[name] for name in names if name in cfg.speed}
    merged.update({name: cfg.case.speed[name] for name in names if name in (OmegaConf.select(cfg, "case.speed") or {})})
    return SpeedSettings(**merged)


def resolve_device(requested: str, probe: dict[str, Any]) -> str:
    if requested == "auto":
        return "cuda" if probe.get("cuda_available") else "cpu"
    if requested == "cuda" and not probe.get("cuda_available"):
        build = f"torch {probe.get('torch')}" + (f" with CUDA {probe['torch_cuda']}" if probe.get("torch_cuda") else ", a CPU-only build")
        raise DeviceUnavailable(f"device=cuda requested, but no CUDA device is available ({build}); use device=cpu or device=auto")
    return requested


def probe_environment() -> dict[str, Any]:
    preload_cases()
    result = run_isolated(probe_device, timeout_s=PROBE_TIMEOUT_S)
    if result.status != "returned":
        raise DeviceUnavailable(f"probing the devices failed: {result.summary}")
    return {**host_environment(), **result.value}


def preload_cases() -> None:
    """Have the fork server import every case once, so each phase's child starts with them loaded."""
    preload(fork_server_modules())


def record_name(case: str, device: str, mode: str) -> str:
    """`<case>.<device>.json` eager, `<case>.<device>.<backend>.json` compiled: both can share a folder."""
    return f"{case}.{device}.json" if mode == "off" else f"{case}.{device}.{mode}.json"


def run_case(
    cfg: DictConfig,
    device: str,
    output_dir: Path,
    environment: dict[str, Any],
    on_phase: Callable[[str, PhaseRecord | None], None] = lambda phase, record: None,
) -> tuple[CaseRecord, Path]:
    """Run the configured phases; the record on disk is rewritten after each one.

    `on_phase(phase, None)` is called as a phase starts, `on_phase(phase, record)` as each record lands.
    """
    validate(cfg)
    preload_cases()
    case = load_case(cfg.case.name)
    submitted = submitted_fix(cfg)
    case_cfg = cfg.case if submitted is None else grade.graded_config(cfg.case, submitted)
    mode = compile_axis.mode_of(cfg)
    case_cfg = compile_axis.case_config(case_cfg, mode)
    phase_runner = run_phase if submitted is None else grade.run_phase
    settings = Settings(device=device, timeout_s=float(cfg.timeout_s), speed=speed_settings(cfg), cpu_threads=int(cfg.speed.cpu_threads))
    record = CaseRecord(
        case=cfg.case.name,
        title=case_text(case).title,
        device=device,
        compile=mode,
        started_at=now(),
        environment=environment,
        config=OmegaConf.to_container(cfg, resolve=True),
        graded_fix=submitted,
    )
    path = output_dir / record_name(cfg.case.name, device, mode)
    write_record(record, path)
    sources = grade.project_sources() if submitted is not None else {}
    try:
        for phase in cfg.phases:
            on_phase(phase, None)
            for phase_record in phase_runner(phase, case, case_cfg, settings):
                record.phases.append(phase_record)
                write_record(record, path)
                on_phase(phase, phase_record)
    finally:
        if submitted is not None:  # the sources are checked, and restored, even when grading stopped half-way
            on_phase("integrity", None)
            record.phases.append(grade.integrity(sources, record))
            write_record(record, path)
            on_phase("integrity", record.phases[-1])
    record.finished_at = now()
    if submitted is not None:
        record.verdict = grade.verdict(record).line
    write_record(record, path)
    return record, path
