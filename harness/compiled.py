"""The compile axis: run a case's functions under `torch.compile` (`compile=inductor|aot_eager`) or eager (`off`).

    python -m harness case=embedding_oob compile=inductor
    python -m harness -m 'case=glob(*)' compile=off,inductor

The mode travels to the children in the case config (`cfg.compile`); each child compiles the function it
runs, so nothing compiled ever lives in the fork server. What a user would compile is the case's
`compiled_unit` (the model step, the loss, the decode); the harness compiles `buggy`, `fixed` and each timed,
slow or bad fix whole, never `reference`, which stays eager: the answer a compiled function is judged by. A
case whose unit runs elsewhere (a launcher's ranks) sets `compiles_itself = True` and compiles it there,
from `cfg.compile`.

Kernels are kept in a cache the harness owns, one folder per torch version (`cache_dir`), so a second run
reuses them; every phase but reproduce generates CPU kernels for the speed phase's thread count, so that one
phase's kernels are the next one's cache hits. A child that runs a submitted fix is confined
(harness/process/confine.py), and compiles into a folder of its grade's own instead (its precompiled header
too), shared by that grade's confined children (and the ranks they start) and deleted after it: a submission
can neither read what another submission left nor leave anything for the next, and it cannot write the
harness's cache, which the model solution's children read in a grade too (a poisoned kernel of the baseline
would make any fix fast).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

MODES = ("off", "inductor", "aot_eager")  # off: eager; aot_eager: dynamo and AOTAutograd without inductor's kernels
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch-error-cases" / "inductor"
# Exceptions of the compiler itself, by the module that defines them (their names moved between releases).
COMPILER_MODULES = re.compile(r"^torch\.(?:_dynamo|_inductor|_functorch|_subclasses|_higher_order_ops|_export|fx)\b")
# What a process killed by a native error printed last: the C++ exception from a generated kernel and the like.
NATIVE_LINES = re.compile(
    r"terminate called|what\(\):|index out of bounds|Fatal Python error|Assertion .* failed|Aborted|Segmentation fault"
)


def mode_of(cfg: Any) -> str:
    mode = cfg.get("compile", "off")
    return "off" if mode is False or mode is None else str(mode)  # YAML 1.1 reads a bare `off` as false


def problem(mode: Any) -> str | None:
    """Why `compile=<mode>` cannot run; None when it can."""
    if mode is False or mode is None or mode == "off":
        return None
    if mode not in MODES:
        return f"compile={mode}: choose one of {', '.join(MODES)} (torch.compile's backend; off runs eager)"
    return unable_to_compile()


def unable_to_compile() -> str | None:
    """Why this torch cannot compile on this Python (a case's older releases: the matrix runs them eager); None when it can."""
    import sys

    import torch
    from torch.torch_version import TorchVersion

    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile (it is from torch 2.0): run it with compile=off"
    if TorchVersion(torch.__version__) < "2.1" and sys.version_info >= (3, 11):
        return f"torch {torch.__version__} cannot compile on {python} (dynamo runs there from torch 2.1): run it with compile=off"
    return None


def case_config(case_cfg: Any, mode: str, kernel_threads: int | None = None) -> Any:
    """The case config the children get: the mode in `compile`; compiled, the yaml's `compile_tolerance` (where
    it sets one: inductor reorders float32 reductions) in place of `tolerance`, its `speed.compile_grade_budget`
    in place of `speed.grade_budget` (where compiling speeds the model solution up more than a correct
    alternative), and `kernel_threads`, the threads the CPU kernels are generated for: the speed phase's
    (`speed.cpu_threads`) in every phase, so that a kernel compiled in one phase is the one the next finds in the
    cache (inductor writes the count into each kernel, and a kernel for 2 threads is no cache hit for 1)."""
    from omegaconf import OmegaConf

    merged = OmegaConf.merge(OmegaConf.to_container(case_cfg, resolve=True), {"compile": mode})
    if mode == "off":
        return merged
    if merged.get("compile_tolerance") is not None:
        merged.tolerance = merged.compile_tolerance
    if OmegaConf.select(merged, "speed.compile_grade_budget") is not None:
        merged.speed.grade_budget = merged.speed.compile_grade_budget
    if kernel_threads is not None:
        merged.kernel_threads = kernel_threads
    return merged


def as_users_run_it(cfg: Any) -> Any:
    """The config without `kernel_threads`: kernels for torch's own thread count, as in a user's process (the
    reproduce phase: a kernel's failed bounds check aborts the process from a parallel region, and raises from a
    serial one)."""
    from omegaconf import OmegaConf

    return OmegaConf.create({key: value for key, value in OmegaConf.to_container(cfg, resolve=True).items() if key != "kernel_threads"})


def cache_dir(private: bool) -> Path:
    """A private folder, or the harness's own for this torch; a folder the user set in TORCHINDUCTOR_CACHE_DIR wins."""
    import torch

    if private:  # beneath $TMPDIR, which a confined child may write (tempfile may have cached /tmp before it was set)
        return Path(tempfile.mkdtemp(prefix="inductor-", dir=os.environ.get("TMPDIR")))
    users = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # torch sets the variable to its default once used, `<tmp>/torchinductor_<user>`, and <tmp> differs where a child's TMPDIR does
    torch_default = f"torchinductor_{getpass.getuser()}"
    if users and os.path.basename(os.path.abspath(users)) != torch_default:
        return Path(users)
    return CACHE_ROOT / f"torch-{torch.__version__.split('+')[0]}"


PRIVATE_KERNELS = (
    "HARNESS_PRIVATE_KERNELS"  # "1" in a confined child: the processes it starts (a launcher's ranks) compile into its folder too
)


def prepare(private: bool, kernel_threads: int | None = None) -> str:
    """In a child, before its first compile (private: a graded one, and every process it starts): where kernels are cached, one compile worker (no pool of processes
    on a 2-core machine, nothing left running), eager's random numbers, the FX graph cache on (torch < 2.5
    left it off), and the threads CPU kernels are generated for, where given (else torch's thread count)."""
    import torch._inductor.config as inductor_config

    inherited = os.environ.get(PRIVATE_KERNELS) == "1" and os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    private = private or bool(inherited)
    folder = Path(inherited) if inherited else cache_dir(private)  # a graded child's ranks share its private folder
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    if private:
        os.environ[PRIVATE_KERNELS] = "1"
    os.environ["TRITON_CACHE_DIR"] = str(folder / "triton")
    inductor_config.compile_threads = 1
    inductor_config.fallback_random = True  # random ops draw as eager does (SNAC's decoder adds noise): the reference stays comparable
    if hasattr(inductor_config, "fx_graph_cache"):
        inductor_config.fx_graph_cache = True
    if kernel_threads is not None:
        inductor_config.cpp.threads = int(kernel_threads)
    quiet_progress_bar_lock()
    if private:
        private_headers(folder)
    return str(folder)


def private_headers(folder: Path) -> None:
    """Inductor precompiles the header every C++ kernel includes (torch >= 2.9), which halves a cold compile (SNAC's
    decoder: 42 s against 81 s, 2-core CPU), into one folder for every process of the user, fixed when its module is
    imported (the fork server's). A confined child may not write there, and must not read what others left there:
    its header goes to the grade's folder, where its kernels go."""
    import torch._inductor.config as inductor_config

    if not getattr(inductor_config, "cpp_cache_precompile_headers", False):
        return
    try:
        from torch._inductor import codecache, cpp_builder
    except ImportError:
        codecache = cpp_builder = None
    if not (
        hasattr(codecache, "_HEADER_DIR") and hasattr(cpp_builder, "_create_if_dir_not_exist")
    ):  # kept elsewhere: none, rather than shared
        inductor_config.cpp_cache_precompile_headers = False
        return
    codecache._HEADER_DIR = str(folder / "precompiled_headers")
    codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
    # The header's build asks for its output folder "" (the working directory, which exists) to be made; confined,
    # making a folder where it may not write is refused before the folder is found to exist, and the build fails.
    make_folder = cpp_builder._create_if_dir_not_exist
    if getattr(make_folder, "skips_the_working_directory", False):
        return

    @functools.wraps(make_folder)
    def make_folder_but_the_working_directory(path: str) -> None:
        if path != "":
            make_folder(path)

    make_folder_but_the_working_directory.skips_the_working_directory = True
    cpp_builder._create_if_dir_not_exist = make_folder_but_the_working_directory


def quiet_progress_bar_lock() -> None:
    """tqdm's lock for a thread's lock. Inductor makes a progress bar, and tqdm's first bar in a process makes a
    multiprocessing lock, a semaphore the resource tracker holds for the child; a child ends with `os._exit`, so
    each one left a semaphore that the tracker reported at the harness's exit ("There appear to be 35 leaked
    semaphore objects", one sweep of both modes)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def compiled(function: Callable, cfg: Any, *, fullgraph: bool = False, dynamic: bool | None = None) -> Callable:
    """`function` (or an nn.Module) as the config's compile mode runs it: itself when off, else
    `torch.compile(function, backend=...)`, its CPU kernels generated for the config's `kernel_threads`."""
    return under(mode_of(cfg), function, fullgraph=fullgraph, dynamic=dynamic, kernel_threads=cfg.get("kernel_threads"))


def under(
    mode: str, function: Callable, *, fullgraph: bool = False, dynamic: bool | None = None, kernel_threads: int | None = None
) -> Callable:
    """`function` (or an nn.Module) compiled with backend `mode` (torch.compile's `fullgraph` and `dynamic` as given);
    itself when `mode` is off. A confined child (a grade's) has its kernel folder set by confinement
    (harness/process/confine.py), which `prepare` follows."""
    if mode == "off":
        return function
    import torch

    prepare(private=False, kernel_threads=kernel_threads)
    return torch.compile(function, backend=mode, fullgraph=fullgraph, dynamic=dynamic)


def requested(arguments: list[str]) -> bool:
    """Whether a command line asks for a compiled run (`compile=inductor`, `compile=off,inductor`, ...)."""
    values = [argument.partition("=")[2] for argument in arguments if argument.lstrip("+~").partition("=")[0] == "compile"]
    return any(mode in value for value in values for mode in MODES if mode != "off")


# What a first compile imports (torch 2.13.0: 722 modules, 0.7 s here); older releases lack some.
COMPILER_IMPORTS = (
    "torch._functorch.aot_autograd",
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "torch._inductor.lowering",
    "torch._inductor.graph",
    "torch._inductor.scheduler",
    "torch._inductor.codegen.cpp",
)


def preload_compiler() -> None:
    """In the fork server of a run that compiles: inductor's modules, and its probe of the vector ISAs the C++
    compiler may use (a build and a subprocess per ISA: 0.8 s here), both kept for every child, so that a child's
    first compile does not repeat them (1.7 s -> 0.3 s per child, warm cache, torch 2.13.0 CPU). Nothing is
    compiled: no graph, guard or counter of dynamo lives in the fork server. Best effort: a failure here only costs
    the children the time."""
    import importlib

    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # before the imports: no pool of compile workers, here or in a child
    for name in COMPILER_IMPORTS:
        with contextlib.suppress(Exception):  # moved or missing in this release
            importlib.import_module(name)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir(private=False))  # where the probe builds its test library
    try:
        for name in ("torch._inductor.cpu_vec_isa", "torch._inductor.codecache"):  # the probe moved in torch 2.5
            with contextlib.suppress(Exception):
                importlib.import_module(name).pick_vec_isa()  # fills valid_vec_isa_list's cache, which the children inherit
                break
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def is_compiler_error(types: tuple[str, ...], modules: tuple[str, ...]) -> bool:
    """Whether an exception came from the compiler (dynamo, AOTAutograd, inductor) rather than from the code compiled."""
    return any(COMPILER_MODULES.match(module) for module in modules) or any(
        name in ("BackendCompilerFailed", "Unsupported", "InternalTorchDynamoError") for name in types
    )


def native_message(output: str, limit: int = 6) -> list[str]:
    """The lines a native abort left in the child's output, verbatim (the C++ message behind a SIGABRT)."""
    lines = [line.rstrip()[:400] for line in output.splitlines() if NATIVE_LINES.search(line)]
    return list(dict.fromkeys(lines))[-limit:]  # each once: every thread of a parallel kernel may throw


def native_headline(lines: list[str]) -> str:
    """The line of a native abort that says what broke: the C++ exception's `what():`, else the first one."""
    telling = [line for line in lines if "what():" in line] or [line for line in lines if "index out of bounds" in line] or lines
    return (
        re.sub(r"(?:/[^/\s,]+)+/(?:[a-z0-9]{32,}\.)?([^/\s,]+)", r"\1", telling[0].strip()) if telling else "no native message"
    )  # a kernel's path: its file name


def graph_report(function: Callable, inputs: Any) -> dict[str, Any]:
    """Dynamo's account of `function` on `inputs`: graphs, graph breaks and why (torch._dynamo.explain)."""
    import torch._dynamo

    torch._dynamo.reset()
    explained = torch._dynamo.explain(function)(inputs)
    reasons = [getattr(reason, "reason", str(reason)).strip().splitlines()[0][:300] for reason in explained.break_reasons]
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count, "break_reasons": list(dict.fromkeys(reasons))[:8]}


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far: more than a function's graphs means it recompiled (0 on a
    torch without dynamo, before 2.0)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0

    return int(counters["stats"]["unique_graphs"])


def frames_traced() -> int:
    """Frames dynamo has tried to trace in this process so far, those it then gave up on included (0 before torch 2.0).
    A compiled function settled in its cache adds none per call; one that adds a frame on every call is traced again
    each time (torch 2.15.0 skips a frame whose graph broke at `torch.autograd.grad` for that call only)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0

    return int(counters["frames"]["total"])


def timed_first_call(function: Callable, inputs: Any, synchronize: Callable[[], None]) -> tuple[Any, float]:
    """Call once and say how long it took: for a compiled function, the compile and one run."""
    started = time.perf_counter()
    output = function(inputs)
    synchronize()
    return output, round(time.perf_counter() - started, 3)
