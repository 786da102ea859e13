"""Shared fixtures. The pytest process never touches CUDA itself: the harness forks
children that may, and CUDA cannot be re-initialised in a child forked after it."""

import os

import pytest
import torch
from hydra import compose, initialize_config_dir

from harness.cases import ROOT, Growth, Slow, case_names, load_case, symptom_on
from harness.phases import FAILURE_REPRODUCED
from harness.run import probe_environment, run_case

ENVIRONMENT = probe_environment()  # probed in an isolated child
CUDA_AVAILABLE = bool(ENVIRONMENT.get("cuda_available"))
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="needs a CUDA device; none is present")


MAX_WORKERS = 8
UNTIMED = "slow and untimed"  # the slow tests that time nothing (pyproject's `untimed` marker): a worker per core too


def pytest_configure(config) -> None:
    """A run of a worker per core (the plain run, and the slow tests that time nothing) runs every process one OpenMP
    thread: torch's default, a thread per core, has two workers' processes oversubscribe the cores, and an OpenMP thread
    that waits at a barrier spins. On this 2-core machine (2026-11-28, warm caches) four notebooks two at a time took
    141 s at torch's default and 97 s at one thread; two training loops side by side did 4347 steps at two threads
    each and 13577 at one. A timed run (no workers) keeps torch's default, and a thread count the user set wins."""
    workers = getattr(config.option, "numprocesses", None)
    if not hasattr(config, "workerinput") and isinstance(workers, int) and workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # the workers, and every process they start, inherit it


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): the plain run is a thousand small tests, most of them a child process or
    several, so one worker per core takes its time down by as much as there are cores. A run that selects the slow
    tests (`-m slow`, `-m ''`) or times benchmarks gets none: its grades' speed phases and its benchmarks are timings,
    and a timing needs the machine to itself. The slow tests that time nothing (`-m "slow and untimed"`, UNTIMED) get a
    worker per core again."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    if config.getoption("markexpr", "") not in ("not slow", UNTIMED) or any(
        config.getoption(option, None) for option in ("benchmark_only", "benchmark_save", "benchmark_autosave", "benchmark_compare")
    ):
        return 0
    return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="session")
def environment():
    return ENVIRONMENT


CORRECTNESS_PHASES = ("reproduce", "fix", "correct", "bad_fixes")


def failure_on_cpu_is(name: str, *kinds: type) -> bool:
    return isinstance(symptom_on(load_case(name).symptoms["cpu"], torch.__version__), kinds)


def timed_reproduce(name: str) -> bool:
    """Whether the case's failure is time (`Slow`) on CPU: its reproduce is a timing, left to the slow tests."""
    return failure_on_cpu_is(name, Slow)


def cases_failing_in_value() -> list[str]:
    """The cases whose failure on CPU is not a measurement (time, `Slow`; memory kept, `Growth`): a starter carrying
    it is rejected by its fix or correct phase, in seconds. The others' starters are rejected by a measurement, each
    graded in the phase that measures it (tests/test_grade.py, under -m slow)."""
    return [name for name in case_names() if not failure_on_cpu_is(name, Slow, Growth)]


def reproduce_params() -> list:
    """Every case, a case whose failure is time (`Slow`) marked slow: its reproduce is a timing, and its every phase
    compiles (the compiler's behaviour is its failure), too long for the plain run."""
    return [pytest.param(name, marks=pytest.mark.slow) if timed_reproduce(name) else name for name in case_names()]


class CorrectnessRecords:
    """Each case's correctness phases on CPU (reproduce, fix, correct, the bad fixes), run once per test session (per
    worker: the tests that read them are in one module, test_cases_cpu, and `--dist loadscope` keeps a module on one) on
    first use; a case whose reproduce is a
    timing runs it only where a test asks for it (under -m slow)."""

    def __init__(self, environment, tmp_path_factory):
        self.environment, self.tmp_path_factory, self.records = environment, tmp_path_factory, {}

    def __call__(self, name: str, *, with_timed_reproduce: bool = False):
        phases = [p for p in CORRECTNESS_PHASES if p != "reproduce" or with_timed_reproduce or not timed_reproduce(name)]
        key = (name, tuple(phases))
        if key not in self.records:
            cfg = compose_config(f"case={name}", "device=cpu", f"phases=[{','.join(phases)}]")
            self.records[key] = run_case(cfg, "cpu", self.tmp_path_factory.mktemp(name), self.environment)
        return self.records[key]


@pytest.fixture(scope="session")
def correctness_records(environment, tmp_path_factory):
    return CorrectnessRecords(environment, tmp_path_factory)


# -- a reproduce record read as a log (test_triage, test_cases_cpu) ------------------------------


def record_log(record: dict) -> str:
    """What a reproduce record holds of the failure: the text a user of the harness would paste."""
    reproduce = next(p for p in record["phases"] if p["phase"] == "reproduce")
    figures = reproduce["figures"]
    parts = [reproduce["message"], figures.get("error", ""), f"raised at {figures['raised_at']}" if "raised_at" in figures else ""]
    parts += [str(figures.get(key, "")) for key in ("traceback", "stack", "native_error", "output_line")]
    parts += figures.get("warnings", []) + figures.get("logged", [])
    return "\n".join(parts + [reproduce["output_tail"]])


def names_its_failure(reproduce: dict) -> bool:
    """Whether a reproduce record holds text that names its failure: an error, a native abort, a warning; not a
    compiled run that returned where eager raises (silent), nor a wrong result no warning announced."""
    status = reproduce["status"]
    if status not in FAILURE_REPRODUCED or status == "silent":
        return False
    warnings = [w for w in reproduce["figures"].get("warnings", []) if not any(a in w for a in ADVISORIES)]
    return status != "wrong_result" or bool(warnings)


ADVISORIES = (  # warnings about the machine, not the failure: a wrong result they come with is still unannounced
    "TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled",  # inductor, on a GPU with TF32
    "Skipping serialization of skipfiles_inline_module_allowlist value",  # torch 2.6's inductor, caching its config
    "the load_module() method is deprecated and slated for removal in Python 3.12",  # torch 2.3's inductor, loading a kernel
)
