"""Run one case on one device: validate the config, make the run's `RunSpec` from it once (harness/spec.py), run the
phases on that spec, keep the record on disk."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from harness import compiled as compile_axis
from harness.cases import case_names, case_text, contract_problems, fork_server_modules, load_case
from harness.grading.seam import BadSubmission, Grading, grading_of, submitted
from harness.measure.footprint import MemorySettings
from harness.phases import PHASES, SpeedSettings
from harness.process.confine import Limits
from harness.process.fork_server import preload
from harness.process.isolate import run_isolated
from harness.process.submitted import Submission
from harness.records import CaseRecord, PhaseRecord, host_environment, now, probe_device, write_record
from harness.spec import RunSpec
from harness.statuses import Run

DEVICE_CHOICES = ("auto", "cpu", "cuda")
PROBE_TIMEOUT_S = 120.0


class ConfigError(ValueError):
    """The command line or a case yaml asks for something impossible; nothing has run."""


class DeviceUnavailable(RuntimeError):
    """The requested device is not present on this machine."""


CUT_SIGNALS = {
    "SIGTERM": "scancel, the time limit or a preemption under SLURM; `kill` elsewhere",
    "SIGUSR2": "SLURM's warning before the time limit (hydra.launcher.signal_delay_s)",
}


class JobCut(BaseException):
    """The run was told to stop mid-way (CUT_SIGNALS). A BaseException: no `except Exception` of a phase takes it for a result."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"cut by {signal_name} ({CUT_SIGNALS[signal_name]})")
        self.signal = signal_name
        self.at = time.monotonic()
        self.record_path: Path | None = None  # set by run_case once the record says where it was cut


@contextlib.contextmanager
def cut_by_signals():
    """While a case runs, SIGTERM and SIGUSR2 raise JobCut in it (the first of them; later ones are ignored).

    SLURM sends them to every process of a job: the phase's child dies of it, and the harness records the
    phase it was in as `cut` before it exits. Signal handlers belong to the main thread: elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [getattr(signal, name) for name in CUT_SIGNALS]

    def cut(signum: int, frame: Any) -> None:
        for number in signals:
            signal.signal(number, signal.SIG_IGN)  # the record is being written: one cut is enough
        raise JobCut(signal.Signals(signum).name)

    previous = {number: signal.signal(number, cut) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


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
    if not (
        speed.pairs >= 2
        and speed.warmup >= 0
        and 2 <= speed.min_processes <= speed.max_processes
        and speed.max_s > 0
        and speed.grade_max_s > 0
        and speed.grade_min_processes >= 2
        and 2 <= speed.grade_decides_after <= speed.grade_min_processes
        and speed.process_s >= 0
        and 0 < speed.level < 1
    ):
        raise ConfigError(
            f"speed: pairs={speed.pairs}, warmup={speed.warmup}, min_processes={speed.min_processes}, max_processes={speed.max_processes}, "
            f"max_s={speed.max_s}, grade_max_s={speed.grade_max_s}, grade_min_processes={speed.grade_min_processes}, "
            f"grade_decides_after={speed.grade_decides_after}, process_s={speed.process_s}, level={speed.level}: need pairs >= 2, warmup >= 0, "
            "2 <= min_processes <= max_processes, max_s > 0, grade_max_s > 0, 2 <= grade_decides_after <= grade_min_processes, process_s >= 0, "
            "0 < level < 1"
        )
    memory = memory_settings(cfg)
    if not (memory.steps >= 3 and memory.warmup >= 0 and 0 < memory.level < 1):
        raise ConfigError(
            f"memory: steps={memory.steps}, warmup={memory.warmup}, level={memory.level}: need steps >= 3 (a slope and its interval), warmup >= 0, 0 < level < 1"
        )
    if not cfg.speed.cpu_threads >= 1:
        raise ConfigError(f"speed.cpu_threads={cfg.speed.cpu_threads}: need at least 1")
    if cfg.case.name not in case_names():
        raise ConfigError(f"case yaml names {cfg.case.name!r}, but cases/ has no such module ({', '.join(case_names())})")
    unfinished = contract_problems(load_case(cfg.case.name))  # a scaffolded case (python -m harness new) until it is filled in
    if unfinished:
        raise ConfigError(
            f"case {cfg.case.name} does not meet the contract yet, {len(unfinished)} part(s) missing (python -m pytest tests/test_contract.py -k {cfg.case.name} "
            f"lists them): {'; '.join(unfinished[:3])}{'; ...' if len(unfinished) > 3 else ''}"
        )
    for scope in ("sizes", "speed.inputs.sizes", "speed.device_inputs.cpu.sizes", "speed.device_inputs.cuda.sizes"):
        for key, value in (OmegaConf.select(cfg.case, scope) or {}).items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"case.{scope}.{key}={value}: sizes must be positive integers")
    if sum(cfg.get(key) is not None for key in ("fix", "hint", "exercise")) > 1:
        raise ConfigError("fix=, hint= and exercise= are separate commands: give one of them")
    if cfg.get("exercise") is not None and not str(cfg.exercise).strip():
        raise ConfigError("exercise=: name a directory for the starter file")
    submitted_fix(cfg)


def submitted_fix(cfg: DictConfig) -> Submission | None:
    """The fix= submission, checked (its import runs in a child, once per file version); None without fix=."""
    if cfg.get("fix") is None:
        return None
    preload_cases()  # the import check starts the fork server: let it preload the cases first
    try:
        return submitted(str(cfg.fix), float(cfg.timeout_s))
    except BadSubmission as error:
        raise ConfigError(str(error)) from None


def speed_settings(cfg: DictConfig) -> SpeedSettings:
    """The timing settings: conf/config.yaml's `speed`, with any the case yaml's `speed` sets over them."""
    names = [f.name for f in dataclasses.fields(SpeedSettings)]
    merged = {name: cfg.speed[name] for name in names if name in cfg.speed}
    merged.update({name: cfg.case.speed[name] for name in names if name in (OmegaConf.select(cfg, "case.speed") or {})})
    return SpeedSettings(**merged)


def memory_settings(cfg: DictConfig) -> MemorySettings:
    """The memory settings: conf/config.yaml's `memory`, with any the case yaml's `memory` sets over them."""
    names = [f.name for f in dataclasses.fields(MemorySettings)]
    merged = {name: (OmegaConf.select(cfg, "memory") or {})[name] for name in names if name in (OmegaConf.select(cfg, "memory") or {})}
    merged.update({name: cfg.case.memory[name] for name in names if name in (OmegaConf.select(cfg, "case.memory") or {})})
    return MemorySettings(**merged)


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


@dataclass(frozen=True)
class Plan:
    """What a run's axes make of a case: the config its children get, and the phases to run."""

    case_cfg: Any
    phases: tuple[str, ...]


def compile_transform(plan: Plan, cfg: DictConfig, device: str, grading: Grading) -> Plan:
    """The compile axis (harness/compiled.py): the mode, its tolerance and budgets, the kernels' thread count."""
    threads = int(cfg.speed.cpu_threads) if device == "cpu" else None
    return dataclasses.replace(plan, case_cfg=compile_axis.case_config(plan.case_cfg, compile_axis.mode_of(cfg), threads))


def grading_transform(plan: Plan, cfg: DictConfig, device: str, grading: Grading) -> Plan:
    """The grading axis (harness/grading/seam.py): a grade's config (the submission, its budgets) and the phases that judge it."""
    return Plan(*grading.plan(plan.case_cfg, plan.phases, device))


def device_transform(plan: Plan, cfg: DictConfig, device: str, grading: Grading) -> Plan:
    """The device axis: the tolerance the device needs (`on_device`)."""
    return dataclasses.replace(plan, case_cfg=on_device(plan.case_cfg, device))


AXES = (compile_transform, grading_transform, device_transform)  # applied in this order, each once


def plan_run(cfg: DictConfig, device: str, grading: Grading) -> Plan:
    """The case as this run's axes leave it: one pass over `AXES`, one transform per axis; nothing goes back."""
    plan = Plan(cfg.case, tuple(cfg.phases))
    for transform in AXES:
        plan = transform(plan, cfg, device, grading)
    return plan


def on_device(case_cfg: Any, device: str) -> Any:
    """The case config on `device`: where the yaml sets `<device>_tolerance` (CUDA: TF32 in cuDNN, fp16 kernels), each
    of its bounds widens `tolerance` (or `compile_tolerance`, already in place) to at least that much there."""
    wider = case_cfg.get(f"{device}_tolerance")
    if wider is None:
        return case_cfg
    merged = OmegaConf.merge(case_cfg, {})
    merged.tolerance = {
        **merged.tolerance,
        **{bound: max(float(case_cfg.tolerance[bound]), float(wider[bound])) for bound in ("atol", "rtol")},
    }
    return merged


def make_spec(cfg: DictConfig, device: str) -> RunSpec:
    """The run, typed, made once where it starts from a config `validate` passed: the phases read its fields (the
    compile mode, the submission, the device, the settings), and the case config the run's axes leave (`plan_run`)."""
    grading = grading_of(submitted_fix(cfg))
    plan = plan_run(cfg, device, grading)
    return RunSpec(
        case=str(cfg.case.name),
        device=device,
        timeout_s=float(cfg.timeout_s),
        case_cfg=plan.case_cfg,
        compile=compile_axis.mode_of(cfg),
        submission=grading.submission,
        phases=plan.phases,
        speed=speed_settings(cfg),
        cpu_threads=int(cfg.speed.cpu_threads),
        limits=Limits(gpu=device == "cuda"),
        memory=memory_settings(cfg),
        config=OmegaConf.to_container(cfg, resolve=True),
    )


def run_case(
    cfg: DictConfig,
    device: str,
    output_dir: Path,
    environment: dict[str, Any],
    on_phase: Callable[[str, PhaseRecord | None], None] = lambda phase, record: None,
) -> tuple[CaseRecord, Path]:
    """Validate the config, make its spec and run it (`run_spec`)."""
    validate(cfg)
    return run_spec(make_spec(cfg, device), output_dir, environment, on_phase)


def run_spec(
    spec: RunSpec,
    output_dir: Path,
    environment: dict[str, Any],
    on_phase: Callable[[str, PhaseRecord | None], None] = lambda phase, record: None,
) -> tuple[CaseRecord, Path]:
    """Run the spec's phases; the record on disk is rewritten after each one.

    `on_phase(phase, None)` is called as a phase starts, `on_phase(phase, record)` as each record lands.
    """
    preload_cases()
    case = load_case(spec.case)
    grading = grading_of(spec.submission)
    with grading.session(spec) as spec:
        record = _new_record(spec, case, environment)
        path = output_dir / record_name(spec.case, spec.device, spec.compile)
        write_record(record, path)
        phase, started, appended = None, time.monotonic(), 0.0
        try:
            for phase in spec.phases:
                on_phase(phase, None)
                started = time.monotonic()
                for phase_record in grading.run_phase(phase, case, spec, record.phases):
                    record.phases.append(phase_record)
                    appended = time.monotonic()
                    write_record(record, path)
                    on_phase(phase, phase_record)
        except JobCut as cut:  # finished_at stays None: the record was cut short, and its last phase says where
            _record_cut(record, phase, cut, started, appended)
            write_record(record, path)
            cut.record_path = path
            on_phase(str(phase), record.phases[-1])
            raise
        finally:  # a grade's sources are checked, and restored, even when it stopped half-way
            for name in grading.at_close:
                on_phase(name, None)
                record.phases.append(grading.check_at_close(name, record, path.parent))
                write_record(record, path)
                on_phase(name, record.phases[-1])
    record.finished_at = now()
    record.verdict = grading.verdict(record)
    write_record(record, path)
    return record, path


def _new_record(spec: RunSpec, case: ModuleType, environment: dict[str, Any]) -> CaseRecord:
    return CaseRecord(
        case=spec.case,
        title=case_text(case).title,
        device=spec.device,
        compile=spec.compile,
        started_at=now(),
        environment=environment,
        config=spec.config,
        graded_fix=spec.submission,
    )


def _record_cut(record: CaseRecord, phase: str | None, cut: JobCut, started: float, appended: float) -> None:
    """The phase running when the job was cut becomes a `cut` record. The signal reaches the phase's child too:
    a result the parent recorded from that child an instant before its own handler ran (killed by the same
    signal) was the cut, not the case, and is replaced."""
    last = record.phases[-1] if record.phases else None
    if last is not None and 0 <= cut.at - appended < 2.0 and (last.figures.get("signal") == cut.signal or cut.signal in last.message):
        record.phases.pop()
    record.phases.append(
        PhaseRecord(
            phase=str(phase or "setup"),
            status=Run.CUT,
            ok=False,
            message=f"the job was {cut} {cut.at - started:.1f} s into this phase; the phases before it are complete",
            figures={"signal": cut.signal},
            seconds=round(cut.at - started, 4),
        )
    )
