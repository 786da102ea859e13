"""Compare a candidate output with the reference: integers exactly, floats within tolerance; and the tensors and
plain values inputs hold by path (`snapshot`), which grading and the timing protocol both read."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn


def flatten_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a tensor, tuple, list or dict, in a fixed order; a None (a gradient never computed) is left out."""
    return [tensor for _, tensor in named_tensors(output) if tensor is not None]


def named_tensors(output: Any, path: str = "output") -> list[tuple[str, torch.Tensor | None]]:
    """Each tensor in `output` by its path (`output['grad']['0.weight']`), dict keys sorted; a None inside a
    container (a gradient never computed) kept as None. An output that is None itself is no output."""
    if output is None and path == "output":
        raise TypeError("cannot compare outputs of type NoneType")
    return _named(output, path)


def _named(output: Any, path: str) -> list[tuple[str, torch.Tensor | None]]:
    if output is None or isinstance(output, torch.Tensor):
        return [(path, output)]
    if isinstance(output, dict):
        return [item for key in sorted(output, key=str) for item in _named(output[key], f"{path}[{key!r}]")]
    if isinstance(output, (tuple, list)):
        names = getattr(output, "_fields", None) or [f"[{index}]" for index in range(len(output))]
        return [item for name, value in zip(names, output) for item in _named(value, f"{path}.{name}".replace(".[", "["))]
    raise TypeError(f"cannot compare outputs of type {type(output).__name__}")


def training_outputs(
    module: nn.Module, loss: torch.Tensor | None = None, *, gradients: bool = True, parameters: bool = False
) -> dict[str, Any]:
    """What a training step leaves, to compare with a reference step: the loss, every parameter's gradient by name
    (None where none was computed: a silently missing gradient shows as one), and the parameters after the step."""
    named = dict(module.named_parameters())
    out: dict[str, Any] = {} if loss is None else {"loss": loss.detach()}
    if gradients:
        out["grad"] = {name: None if p.grad is None else p.grad.detach() for name, p in named.items()}
    if parameters:
        out["param"] = {name: p.detach() for name, p in named.items()}
    return out


def describe(output: Any) -> str:
    """Shapes and dtypes of the tensors in `output`; a submitted fix may return anything else."""
    try:
        named = named_tensors(output)
    except TypeError:
        return f"{type(output).__name__}, not tensors"
    return ", ".join("None" if t is None else f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for _, t in named)


MAX_NAMED = 8  # outputs named in `differing`


def tolerance_of(tolerance: Any) -> dict[str, float]:
    """`compare`'s keyword arguments from a case config's `tolerance` (`atol`, `rtol`, optional `scale`)."""
    return {"atol": float(tolerance["atol"]), "rtol": float(tolerance["rtol"]), "scale": float(tolerance.get("scale") or 0.0)}


def compare(got: Any, want: Any, *, atol: float, rtol: float, scale: float = 0.0) -> dict[str, Any]:
    """Figures of how far `got` is from `want`; `match` says whether it is within tolerance.

    Integer and bool tensors (indices, codes, a class map) must be equal; floating tensors
    must satisfy |got - want| <= atol + scale * max|want| + rtol * |want| elementwise, max|want| over
    that tensor (`scale`: float32's rounding of a tensor's large terms lands on its elements near zero;
    gradients of one step span orders of magnitude, so one `atol` is too loose for the small ones or too
    tight for the large); a None (a gradient never computed) matches only a None.
    `max_abs_diff`, `relative_error` (||got - want|| / ||want||) and `snr_db`
    (the same as a signal-to-noise ratio) are over the floating tensors; `tolerance_excess` is the largest
    |got - want| over the element's own allowance (1.0 is exactly at the line; infinite where the allowance is
    0, or the value NaN, and differs): how far a wrong output is from passing; `tolerance_used`, the same ratio over
    every floating element, passing or not: how near a right output came to failing; `differing` names the
    outputs that differ, each with its own figures, by their path in `want` (tensors pair up by
    position: a submitted output arrives as a list).
    """
    got_named, want_named = named_tensors(got), named_tensors(want)
    unlike = _unlike(got_named, want_named)
    if unlike is not None:
        return unlike
    counts = {"integers": 0, "mismatched_integers": 0, "floats": 0, "mismatched_floats": 0}
    sums = {"max_abs_diff": 0.0, "used": 0.0, "error_sq": 0.0, "reference_sq": 0.0}
    differing: list[dict[str, Any]] = []
    for (_, g), (path, w) in zip(got_named, want_named):
        if w is None:
            continue
        g, w = g.detach().cpu(), w.detach().cpu()
        if w.is_floating_point() or w.is_complex():
            differs = _compare_floats(g.double(), w.double(), path, atol, rtol, scale, counts, sums)
        else:
            differs = _compare_integers(g, w, path, counts)
        if differs:
            differing.append(differs)
    return _figures(counts, sums, differing)


def _unlike(got_named: list, want_named: list) -> dict[str, Any] | None:
    """Why `got` cannot be compared with `want` element by element (a count, a None, a shape), or None."""
    if len(got_named) != len(want_named):
        return {"match": False, "reason": f"{len(got_named)} outputs, reference has {len(want_named)}"}
    for (_, g), (path, w) in zip(got_named, want_named):
        if (g is None) != (w is None):
            missing = sum((a is None) != (b is None) for (_, a), (_, b) in zip(got_named, want_named))
            return {
                "match": False,
                "reason": f"{path} is {'None' if g is None else 'a tensor'} where the reference has {'a tensor' if g is None else 'None'} ({missing} such)",
                "missing": missing,
            }
        if g is not None and g.shape != w.shape:
            return {"match": False, "reason": f"{path}: shape {tuple(g.shape)}, reference {tuple(w.shape)}"}
    return None


def _compare_floats(
    g: torch.Tensor, w: torch.Tensor, path: str, atol: float, rtol: float, scale: float, counts: dict[str, int], sums: dict[str, float]
) -> dict[str, Any] | None:
    """Adds one floating output's figures to `counts` and `sums`; what it differs by, if it does."""
    raw = g - w
    distance, magnitude = raw.abs(), w.abs()
    largest = (float(distance.max()), float(magnitude.max())) if w.numel() else None
    if largest and all(map(math.isfinite, largest)):  # every element finite: the same figures in a few passes
        this_max, mismatched, used = _finite_figures(raw, distance, magnitude, largest, atol, rtol, scale, sums)
    else:
        this_max, mismatched, used = _any_figures(g, w, raw, atol, rtol, scale, sums)
    sums["max_abs_diff"] = max(sums["max_abs_diff"], this_max)
    sums["used"] = max(sums["used"], used)
    counts["floats"] += w.numel()
    counts["mismatched_floats"] += mismatched
    if not mismatched:
        return None
    norm = float(w.norm())
    return {
        "output": path,
        "mismatched": mismatched,
        "of": w.numel(),
        "max_abs_diff": this_max,
        "relative_error": float(raw.nan_to_num(nan=math.inf).norm()) / norm if norm else math.inf,
    }


def _finite_figures(
    raw, distance, magnitude, largest, atol: float, rtol: float, scale: float, sums: dict[str, float]
) -> tuple[float, int, float]:
    """`_any_figures` where every element of both is finite (a judge compares dozens of outputs of millions of
    elements: torch.isclose and the NaN handling took 60% of autocast_device's): the same figures, each element
    within `bound + rtol * |want|` or not as torch.isclose decides it. `magnitude` (|want|) is overwritten."""
    sums["error_sq"] += float(raw.pow(2).sum())
    sums["reference_sq"] += float(magnitude.pow(2).sum())
    bound = atol + scale * largest[1] if scale else atol
    allowed = magnitude.mul_(rtol).add_(bound)
    mismatched = int((distance > allowed).sum())
    ratio = distance.div_(allowed)
    if bound <= 0:  # an element of `want` at 0 is allowed nothing: exact (0 / 0) is 0, anything else infinitely over
        ratio.nan_to_num_(nan=0.0, posinf=math.inf)
    return largest[0], mismatched, float(ratio.max())


def _any_figures(
    g: torch.Tensor, w: torch.Tensor, raw: torch.Tensor, atol: float, rtol: float, scale: float, sums: dict[str, float]
) -> tuple[float, int, float]:
    """(max |got - want|, elements torch.isclose rejects, `_excess`) where an element may be NaN or infinite; `raw`: got - want."""
    diff = raw.nan_to_num(nan=math.inf)
    this_max = float(diff.abs().max()) if diff.numel() else 0.0
    sums["error_sq"] += float(diff.pow(2).sum())
    sums["reference_sq"] += float(w.pow(2).sum())
    bound = atol + scale * float(w.abs().max()) if scale and w.numel() else atol
    mismatched = int((~torch.isclose(g, w, atol=bound, rtol=rtol, equal_nan=True)).sum())
    return this_max, mismatched, _excess(g, w, bound, rtol) if w.numel() else 0.0


def _compare_integers(g: torch.Tensor, w: torch.Tensor, path: str, counts: dict[str, int]) -> dict[str, Any] | None:
    mismatched = int((g != w).sum())
    counts["integers"] += w.numel()
    counts["mismatched_integers"] += mismatched
    return {"output": path, "mismatched": mismatched, "of": w.numel()} if mismatched else None


def _figures(counts: dict[str, int], sums: dict[str, float], differing: list[dict[str, Any]]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "match": counts["mismatched_integers"] + counts["mismatched_floats"] == 0,
        **counts,
        "max_abs_diff": sums["max_abs_diff"],
    }
    if counts["floats"]:
        figures["tolerance_used"] = sums["used"]
    if counts["mismatched_floats"]:  # the worst element is then one isclose rejects: its excess over the line
        figures["tolerance_excess"] = sums["used"]
    if sums["reference_sq"] > 0:
        relative_error = math.sqrt(sums["error_sq"] / sums["reference_sq"])
        figures["relative_error"] = relative_error
        figures["snr_db"] = math.inf if relative_error == 0 else -20 * math.log10(relative_error)
    if differing:
        figures["differing"] = differing[:MAX_NAMED]
        figures["outputs_differing"] = len(differing)
    return figures


def _excess(got: torch.Tensor, want: torch.Tensor, bound: float, rtol: float) -> float:
    """The largest |got - want| / (bound + rtol * |want|) over the elements (1.0: exactly at the line)."""
    same = (got == want) | (got.isnan() & want.isnan())  # equal infinities too
    diff = (got - want).abs().nan_to_num(nan=math.inf, posinf=math.inf).masked_fill(same, 0.0)
    allowed = bound + rtol * want.abs().nan_to_num(nan=0.0, posinf=math.inf)
    ratio = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed)  # 0 / 0 where both are exact
    return float(ratio.nan_to_num(nan=math.inf, posinf=math.inf).max())


def snapshot(value: Any, path: str = "inputs") -> dict[str, Any]:
    """Every tensor and plain value in the inputs by path: tuples and NamedTuples, lists, dicts (a key is in the
    path: a renamed one is a path gone and one new) with a dict subclass's own attributes, an empty container as
    its type, and a module's parameters, buffers and plain attributes (of each submodule)."""
    if isinstance(value, torch.Tensor):
        return {path: value.detach()}
    if isinstance(value, nn.Module):
        found = {f"{path}.{name}": tensor.detach() for name, tensor in itertools.chain(value.named_parameters(), value.named_buffers())}
        for name, module in value.named_modules():
            for key, attribute in vars(module).items():
                if not key.startswith("_"):
                    found[f"{path}{'.' + name if name else ''}.{key}"] = _plain(attribute)
        return found
    if isinstance(value, dict):  # its items, and a dict subclass's own attributes (a state dict's `_metadata`, which load_state_dict reads)
        items = [(f"{path}[{key!r}]", value[key]) for key in value]
        attributes = getattr(value, "__dict__", {})
        items += [
            (f"{path}.{name}", attribute) for name, attribute in (attributes.items() if attributes is not value else ())
        ]  # an AttrDict's are its items
        return (
            {k: v for where, item in items for k, v in snapshot(item, where).items()}
            if items
            else {path: f"empty {type(value).__qualname__}"}
        )
    if isinstance(value, (tuple, list)):
        names = getattr(value, "_fields", None) or [f"[{index}]" for index in range(len(value))]
        if not names:
            return {path: f"empty {type(value).__qualname__}"}
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
