"""A fix submitted for grading, loaded in the child that runs it: by path and name, never pickled.

The parent passes only plain data (`Submission`: path, function name, sha256 of the file) inside the
case config the phases get, under `SUBMITTED_KEY`. Each child imports the file itself, after checking
that it still has the hash the record names, and before that it swaps the model solution's functions
in the case module for tripwires: called from inside the submitted fix, they raise
`ModelSolutionCalled`; called by the harness (the speed phase's baseline is the case's own `fixed`),
they do what they did. This stops a fix that imports `fixed`, `reference` or their helpers from the
case module; it cannot stop code that re-executes the case's source file itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any, Callable

from harness.cases import reachable

SUBMITTED_KEY = "submitted_fix"  # in the case config given to the phases: {path, function, sha256}
SOLUTION_ENTRY_POINTS = ("fixed", "reference", "speed_candidate")


class ModelSolutionCalled(BaseException):
    """The submitted fix called the case's own solution. A BaseException: `except Exception` in the fix does not hide it."""


@dataclass(frozen=True)
class Submission:
    path: str  # absolute
    function: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.function}"


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def submission_of(cfg: Any) -> Submission | None:
    """The submission a case config carries, or None when the case's own `fixed` is under test."""
    entry = cfg.get(SUBMITTED_KEY) if cfg is not None else None
    return None if entry is None else Submission(str(entry["path"]), str(entry["function"]), str(entry["sha256"]))


def import_file(path: str) -> ModuleType:
    """Import a Python file by path, under a module name of its own; module-level errors propagate."""
    name = "submitted_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_submitted(submission: Submission, case: ModuleType) -> Callable[[Any], Any]:
    """In a child: the submitted function, guarded so that it cannot call the case's solution."""
    if file_sha256(submission.path) != submission.sha256:
        raise RuntimeError(f"{submission.path} changed after it was validated (sha256 differs): grade it again")
    inside = _install_tripwires(case)
    watched = [case, *(module for name, module in sys.modules.items() if name.startswith("harness.") and module is not None)]
    settings, ids = process_settings(), namespace_ids(*watched)
    function = getattr(import_file(submission.path), submission.function)
    changed = changes(settings, process_settings(), ids, namespace_ids(*watched))
    if not callable(function):
        raise TypeError(f"{submission.spec} is a {type(function).__name__}, not a function")

    def submitted_fix(inputs):
        inside["now"] = True
        try:
            return function(inputs)
        finally:
            inside["now"] = False

    submitted_fix.changed_on_import = changed  # what its import changed in this process, for the record
    return submitted_fix


def _install_tripwires(case: ModuleType) -> dict[str, bool]:
    inside = {"now": False}
    solution = solution_functions(case)
    for name, value in list(vars(case).items()):
        if isinstance(value, FunctionType) and value in solution:
            setattr(case, name, _tripwire(case.__name__, name, value, inside))
    return inside


def _tripwire(module: str, name: str, original: Callable, inside: dict[str, bool]) -> Callable:
    def tripwire(*args, **kwargs):
        if inside["now"]:
            raise ModelSolutionCalled(f"the submitted fix called {module}.{name}, part of the case's own solution: write the fix yourself")
        return original(*args, **kwargs)

    return tripwire


def solution_functions(case: ModuleType) -> set[FunctionType]:
    """The case's functions reachable from `fixed`, `reference` and `speed_candidate` but not from `buggy` (nor from
    the methods of the classes `buggy` uses: a Dataset's __getitem__ that calls a helper makes it the buggy code's)."""
    roots = [getattr(case, name) for name in SOLUTION_ENTRY_POINTS if isinstance(getattr(case, name, None), FunctionType)]
    return reachable(case, roots) - reachable(case, [case.buggy], through_classes=True)


# -- what importing it changed in its process ------------------------------------------------------------

BACKEND_FLAGS = (
    "enabled",
    "benchmark",
    "deterministic",
    "allow_tf32",
    "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction",
    "fp32_precision",
    "engine",
    "benchmark_limit",
)
BACKENDS = ("cudnn", "mkldnn", "mkl", "nnpack", "opt_einsum", "cuda.matmul", "mha", "quantized", "cpu")
NAMESPACES = ("torch", "torch.nn.functional", "torch.Tensor", "torch.linalg", "torch.fft", "torch.special", "torch.nn.init")


def process_settings() -> dict[str, Any]:
    """torch's process-wide settings, and the interpreter's, as plain values: what code run in a process
    (a submitted file's import) can change for every other call made there."""
    import torch

    said: dict[str, Any] = {
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_num_interop_threads()": torch.get_num_interop_threads(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_default_dtype()": str(torch.get_default_dtype()),
        "torch.get_default_device()": str(torch.get_default_device()),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled(),
        "torch.is_anomaly_enabled()": torch.is_anomaly_enabled(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch.is_deterministic_algorithms_warn_only_enabled()": torch.is_deterministic_algorithms_warn_only_enabled(),
        "flush denormal (1e-39 * 1 == 0)": bool(torch.tensor([1e-39]).mul(1.0).item() == 0.0),
        "torch function modes": torch._C._is_torch_function_mode_enabled(),
        "sys.getprofile()": _named(sys.getprofile()),
        "sys.gettrace()": _named(sys.gettrace()),
        "sys.getswitchinterval()": sys.getswitchinterval(),
    }
    with contextlib.suppress(Exception):
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        said["torch dispatch modes"] = len(_get_current_dispatch_mode_stack())
    for backend in BACKENDS:
        module = _attribute(torch.backends, backend)
        for flag in BACKEND_FLAGS if module is not None else ():
            with contextlib.suppress(Exception):
                value = getattr(module, flag)
                if value is None or isinstance(value, (bool, int, float, str)):
                    said[f"torch.backends.{backend}.{flag}"] = value
    for name in ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"):
        with contextlib.suppress(Exception):
            said[f"torch.backends.cuda.{name}()"] = getattr(torch.backends.cuda, name)()
    return said


def namespace_ids(*modules: ModuleType) -> dict[str, int]:
    """The identity of every public name in torch's main namespaces and in `modules`: a name rebound (wrapped, patched) shows."""
    import torch

    found = {
        f"{module.__name__}.{name}": id(value)
        for module in modules
        for name, value in list(vars(module).items())
        if not name.startswith("__")
    }
    for namespace in NAMESPACES:
        owner = _attribute(torch, namespace.removeprefix("torch").lstrip(".")) if namespace != "torch" else torch
        for name, value in list(vars(owner).items()) if owner is not None else ():
            if not name.startswith("__"):
                found[f"{namespace}.{name}"] = id(value)
    return found


def changes(
    before: dict[str, Any], after: dict[str, Any], ids_before: dict[str, int] | None = None, ids_after: dict[str, int] | None = None
) -> list[str]:
    """One line per setting changed, then the names of torch's namespaces rebound, added or removed."""
    said = [
        f"{name} {before.get(name)!r} -> {after.get(name)!r}"
        for name in dict.fromkeys([*before, *after])
        if before.get(name) != after.get(name)
    ]
    if ids_before is not None and ids_after is not None:
        rebound = [name for name in ids_after if ids_before.get(name) not in (None, ids_after[name])]
        removed = [name for name in ids_before if name not in ids_after]
        said += [f"{name} replaced" for name in rebound[:20]] + [f"{name} deleted" for name in removed[:5]]
    return said


def _named(hook: Any) -> str | None:
    return None if hook is None else f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', type(hook).__qualname__)}"


def _attribute(root: Any, dotted: str) -> Any:
    for part in dotted.split(".") if dotted else ():
        root = getattr(root, part, None)
        if root is None:
            return None
    return root
