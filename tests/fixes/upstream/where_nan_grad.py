"""Upstream's fixes of where_nan_grad as submissions, in the order caustics applied them.

The fit step is the case's (`fit_step`, which the buggy code uses too); only the NFW helper `_h` is upstream's, re-typed
from caustics' commits (read in the repository's history: https://github.com/Ciela-Institute/caustics, package then
named caustic, caustic/lenses/nfw.py). Graded by tests/test_upstream_fixes.py; the grades are in
docs/history/upstream_fixes.md.
"""

import torch

from cases.where_nan_grad import fit_step


def _h_boolean_indexing(x):
    """caustic's `NFW._h` after e1e27a3, verbatim: each formula assigned only on its own side of 1."""
    term_1 = (x / 2).log()
    term_2 = torch.ones_like(x)
    term_2[x > 1] = (1 / x[x > 1]).arccos() * 1 / (x[x > 1] ** 2 - 1).sqrt()
    term_2[x < 1] = (1 / x[x < 1]).arccosh() * 1 / (1 - x[x < 1] ** 2).sqrt()
    return term_1 + term_2


def _h_batchable(x):
    """caustic's `NFW._h_batchable` as merged by #83 (e50e936), the helper of the default `use_case="batchable"`: the
    nested where again, term_1 taken out of it."""
    term_1 = (x / 2).log()
    term_2 = torch.where(
        x > 1,
        (1 / x).arccos() * 1 / (x**2 - 1).sqrt(),
        torch.where(x < 1, (1 / x).arccosh() * 1 / (1 - x**2).sqrt(), torch.ones_like(x)),
    )
    return term_1 + term_2


def commit_e1e27a3_boolean_indexing(x):
    """https://github.com/Ciela-Institute/caustics/pull/83, its first commit e1e27a3 ("fix nans in TNFW and NFW
    evaluation", 2023-09-13): `_h` rewritten from the nested `torch.where` to `term_2 = torch.ones_like(x)`,
    `term_2[x > 1] = ...`, `term_2[x < 1] = ...` on `x[x > 1]` and `x[x < 1]` only (kept as `_h_differentiable` in the
    merged PR, unchanged)."""
    return fit_step(_h_boolean_indexing, x)


def pr_83_merged_default_batchable(x):
    """https://github.com/Ciela-Institute/caustics/pull/83 as merged (435118b; e50e936 "user may select from batchable
    or differentiable for NFW and TNFW", after 0f10741 "it seems batching and differentiable are at odds with each
    other"): `NFW(..., use_case="batchable")` by default, whose `_h_batchable` is the nested where; the boolean indexing
    only with `use_case="differentiable"` (the function above). A lens built with the defaults, as the case's is."""
    return fit_step(_h_batchable, x)
