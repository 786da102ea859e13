"""Compare a candidate output with the reference: integers exactly, floats within tolerance; and the tensors and
plain values inputs hold by path (`snapshot`), which grading and the timing protocol both read."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn


def flatten_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a tensor, tuple, list or dict, in a fixed order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for key in sorted(output) for t in flatten_tensors(output[key])]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in flatten_tensors(item)]
    raise TypeError(f"cannot compare outputs of type {type(output).__name__}")


def describe(output: Any) -> str:
    """Shapes and dtypes of the tensors in `output`; a submitted fix may return anything else."""
    try:
        flatten_tensors(output)
    except TypeError:
        return f"{type(output).__name__}, not tensors"
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in flatten_tensors(output))


def compare(got: Any, want: Any, *, atol: float, rtol: float) -> dict[str, Any]:
    """Figures of how far `got` is from `want`; `match` says whether it is within tolerance.

    Integer and bool tensors (indices, codes) must be equal; floating tensors
    must satisfy |got - want| <= atol + rtol * |want| elementwise.
    `max_abs_diff`, `relative_error` (||got - want|| / ||want||) and `snr_db`
    (the same as a signal-to-noise ratio) are over the floating tensors.
    """
    got_tensors, want_tensors = flatten_tensors(got), flatten_tensors(want)
    if len(got_tensors) != len(want_tensors):
        return {"match": False, "reason": f"{len(got_tensors)} tensors, reference has {len(want_tensors)}"}
    for g, w in zip(got_tensors, want_tensors):
        if g.shape != w.shape:
            return {"match": False, "reason": f"shape {tuple(g.shape)}, reference {tuple(w.shape)}"}

    counts = {"integers": 0, "mismatched_integers": 0, "floats": 0, "mismatched_floats": 0}
    max_abs_diff = 0.0
    error_sq = reference_sq = 0.0
    for g, w in zip(got_tensors, want_tensors):
        g, w = g.detach().cpu(), w.detach().cpu()
        if w.is_floating_point() or w.is_complex():
            g, w = g.double(), w.double()
            diff = (g - w).nan_to_num(nan=math.inf)
            if diff.numel():
                max_abs_diff = max(max_abs_diff, float(diff.abs().max()))
            error_sq += float(diff.pow(2).sum())
            reference_sq += float(w.pow(2).sum())
            counts["floats"] += w.numel()
            counts["mismatched_floats"] += int((~torch.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True)).sum())
        else:
            counts["integers"] += w.numel()
            counts["mismatched_integers"] += int((g != w).sum())

    figures: dict[str, Any] = {"match": counts["mismatched_integers"] + counts["mismatched_floats"] == 0, **counts, "max_abs_diff": max_abs_diff}
    if reference_sq > 0:
        relative_error = math.sqrt(error_sq / reference_sq)
        figures["relative_error"] = relative_error
        figures["snr_db"] = math.inf if relative_error == 0 else -20 * math.log10(relative_error)
    return figures


def snapshot(value: Any, path: str = "inputs") -> dict[str, Any]:
    """Every tensor and plain value in the inputs by path: tuples and NamedTuples, lists, dicts, and a
    module's parameters, buffers and plain attributes (of each submodule)."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach()}
    if isinstance(value, nn.Module):
        found = {f"{path}.{name}": tensor.detach() for name, tensor in itertools.chain(value.named_parameters(), value.named_buffers())}
        for name, module in value.named_modules():
            for key, attribute in vars(module).items():
                if not key.startswith("_"):
                    found[f"{path}{'.' + name if name else ''}.{key}"] = _plain(attribute)
        return found
    if isinstance(value, dict):
        return {k: v for key in value for k, v in snapshot(value[key], f"{path}[{key!r}]").items()}
    if isinstance(value, (tuple, list)):
        names = getattr(value, "_fields", None) or [f"[{index}]" for index in range(len(value))]
        return {k: v for name, item in zip(names, value) for k, v in snapshot(item, f"{path}.{name}".replace(".[", "[")).items()}
    return {path: _plain(value)}


def _plain(value: Any) -> Any:
    """A value `torch.load(weights_only=True)` reads back and `==` compares: opaque objects by their type."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, (tuple, list)) and all(item is None or isinstance(item, (bool, int, float, str)) for item in value):
        return tuple(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"function {getattr(value, '__module__', '?')}.{value.__qualname__}"
    return f"object {type(value).__module__}.{type(value).__qualname__}"
