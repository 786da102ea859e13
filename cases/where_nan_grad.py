"""torch.where picks the finite branch, but the untaken branch's NaN reaches the gradients.

Upstream: https://github.com/Ciela-Institute/caustics/pull/83 ("Fix nan gradients in NFW and TNFW", ConnorStoneAstro,
    merged 2023-09-13, commit e1e27a3 "fix nans in TNFW and NFW evaluation"): the NFW lens of caustic (the package's
    name then) evaluated its helper `_h` (and `_f`, `_g`) as nested `torch.where(x > 1, <formula for x > 1>,
    torch.where(x < 1, <formula for x < 1>, <value at 1>))`, and each formula is NaN on the other side of 1 (the
    arccos of 1/x > 1, the square root of 1 - x**2 < 0). The PR: "It turns out that `torch.where` does not protect
    from nans in the off branch ... So nan's are somehow magically avoided in the forward pass when they probably
    shouldn't be, but in the backward pass there is no avoiding them." The same report in PyTorch, closed as expected
    behaviour: https://github.com/pytorch/pytorch/issues/52248 ("torch.where leads to unexpected gradients", labels
    "has workaround", "module: NaNs and Infs"), https://github.com/pytorch/pytorch/issues/68425 (torch 1.9.1,
    `torch.where(a <= 0, torch.exp(a), 1 + a)` at a = 100: "outputs tensor(101., ...) tensor(nan)"), and again
    https://github.com/pytorch/pytorch/issues/187297 (torch 2.12.0+cu130, 2026-06-15, "torch.where backward
    propagates NaN gradient from inactive sqrt branch": `torch.where(xt > 0, torch.sqrt(xt), xt)` on negative inputs,
    "actual: tensor([nan, nan]) expected: tensor([1., 1.])", reproduced on CPU).

Fidelity: faithful in the function that fails: caustic's `NFW._h` at the commit before e1e27a3 (the reduced deflection
    helper, nested `torch.where` over x > 1, x < 1 and x == 1), the NFW reduced deflection around it
    (alpha(theta) = 4 kappa_s r_s h(x) / x, x = theta / r_s, along theta's direction), a batch of lenses as caustics
    evaluates them, and a lens fit's gradient with respect to the lens's parameters. Synthetic: the deflection in
    arcseconds with the convergence scale kappa_s as a parameter (caustics derives it from mass, concentration and a
    cosmology; none of that touches the where), the pixel grid (a square of `npix` x `npix` pixel centres over
    `fov` arcseconds, no pixel at the centre), the lenses' parameters and an "observed" deflection field (seeded
    draws), and the loss (the mean squared residual of the field), all stand-ins for a caustics fit. The dtype is
    float64 where caustics' default is float32: in float32 the formula itself cancels near the lens centre
    (log(x / 2) + arccosh(1 / x) / sqrt(1 - x**2) as x -> 0), and the fixed code's x0 gradient is 50% off the float64
    truth there for reasons that are not the bug (tests/test_where_nan_grad.py); the NaN is the same in both dtypes.

Symptom on CUDA: the same NaN gradients, nothing device-specific (not run here: no GPU in this task). The threads:
    caustics #83 prints no log (its title: "Fix nan gradients in NFW and TNFW"); pytorch #187297 (CPU):
        actual:
        tensor([nan, nan])

Symptom on CPU: nothing raises and nothing is printed (torch 2.13.0, run here). The loss is finite and right
    (equal to the reference's to 1e-16); of the 4 x 4 = 16 parameter gradients (x0, y0, r_s, kappa_s of 4 lenses) the
    12 of x0, y0 and r_s are NaN, and kappa_s's 4 are right (it scales h's value, never its derivative). With
    `torch.autograd.set_detect_anomaly(True)` the backward raises instead:
        RuntimeError: Function 'DivBackward0' returned nan values in its 0th output.
    (the first backward node that makes one: the 1 / sqrt(1 - x**2) of the x < 1 formula, on pixels where x > 1).
    Compiled (inductor, torch 2.13.0): the same NaN gradients.

Cause: autograd differentiates both branches of `torch.where` at every element, and where's backward sends the
    untaken branch a gradient of 0; the chain rule then multiplies that 0 by the branch's own derivative, which is
    NaN or infinite where the branch is undefined (0 x NaN = NaN, 0 x inf = NaN), and the NaN adds into the input's
    gradient. The forward is finite because where selects values; the backward cannot be, because it adds.

Fix: the "double where": sanitise each branch's input with a where of its own before the formula, so the untaken
    branch computes on a harmless value (`x_gt = torch.where(x > 1, x, 2.0)`, `x_lt = torch.where(x < 1, x, 0.5)`), and
    select with the outer where as before; the inner where's backward routes the untaken branch's (now finite) zero
    gradient away from x. It is the workaround in pytorch #16317's own example (`x / torch.where(n==0,
    torch.ones_like(n), n)`) and #52248's "has workaround", and what caustics does today (each branch on an input
    clamped to its side of 1, `src/caustics/lenses/func/nfw.py`). Also correct (the alternative in
    tests/fixes/alternatives/): that clamp (graded: accepted, 1.054x [0.852, 1.304] against the buggy code). The reference is independent of both: float64, each formula evaluated
    only on its own pixels by boolean indexing (#83's own fix), one `torch.autograd.grad`; `correct` compares the
    loss, every gradient, and the count of non-finite gradients (0 for the reference, 12 for the buggy code).
    Wrong ones, each rejected (figures in the test file and on the page): `nan_to_num` of the where's output
    (https://github.com/pytorch/pytorch/issues/94700, albanD: "This is indeed the expected behavior"): the output had
    no NaN to replace, the 12 gradients stay NaN; `nan_to_num` of the gradients (a generic attempt): the 12 become 0,
    100% of each one's reference norm off (33% of all 16 together), and x0, y0 and r_s no longer move; a hook that
    zeroes the non-finite per-pixel gradient of x = theta / r_s (a generic attempt): finite and plausible, kappa_s's
    gradients right, x0's 17%, y0's 12% and r_s's 13% off (4.4% of all 16 together), every path through h's
    derivative dropped with the NaN; and #83 as merged (caustics 435118b) with its default `use_case="batchable"`,
    whose `_h_batchable` is the nested where again (the boolean indexing only under `use_case="differentiable"`):
    the same 12 NaN gradients (tests/fixes/upstream/where_nan_grad.py). Its cost: two wheres on the input against the buggy code's nested where, the
    same formulas on every pixel: 1.016x [1.001, 1.031] eager, 0.993x [0.742, 1.329] compiled (torch 2.13.0, this
    loaded 2-core CPU; budget 1.5). The slow control, correct: the same helper called on one row of pixels at a time
    (a Python loop over the grid's 128 rows, marked `torch.compiler.disable`): 8.975x [5.078, 15.861] eager (its
    interval's low end 3.4x the budget), 13.401x [12.461, 14.411] compiled (eager rows between compiled graphs; left
    to dynamo, the unrolled loop took 6 minutes to compile and still came out 2.264x [2.006, 2.556]). Caustics #83's
    own boolean indexing is no slow control: graded as a submission against `fixed` it took 1.348x [1.234, 1.473] and
    1.323x [1.263, 1.386] (float64): a third slower than `fixed` and within the 1.5x budget, so accepted; it is the
    reference's method.

Compiled: the harness compiles the whole fit step (the deflection, the loss and `torch.autograd.grad`); dynamo
    breaks the graph at `torch.autograd.grad` ("using `torch.autograd.grad` with
    `torch._dynamo.config.trace_autograd_ops=False`"): the deflection and the loss compile as one graph, whose backward
    inductor compiles with it, the gradients' count as a second. The 12 NaN gradients are the same (torch 2.13.0).
"""

from typing import NamedTuple

import torch

from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: the loss is right, every gradient NaN

# A silent failure: what users post is NaN gradients with a finite forward and torch.where in the code, or the anomaly
# mode's report of a backward node (a sqrt, a log, a division, an arccos) that returned NaN. Not a loss that is NaN in
# the forward, nor NaN from fp16 overflow or a learning rate.
triage_signs = TriageSigns(
    needs_context=True,
    family="NaN or infinite gradients from a finite forward",
    cause="a torch.where whose untaken branch is undefined (a sqrt, log, arccos or division outside its domain) on the elements it does not select",
    confirm="a torch.where (np.where) whose other branch is NaN or infinite where it is not selected; anomaly mode names that branch's backward",
    also="anomaly mode prints the same line for any NaN in a backward: a NaN already in the forward, an overflow, a singular solve",
    signs=(
        Sign(
            "failure",
            r"(?i)\bwhere\b.{0,120}\b(?:grad\w*|backward|backprops?)\b.{0,80}\b(?:nan|inf)s?\b|\b(?:nan|inf)s?\b.{0,80}\b(?:grad\w*|backward|backprops?)\b.{0,120}\bwhere\b|\b(?:grad\w*|backprops?)\b.{0,60}\bwhere\b.{0,80}\b(?:nan|inf)s?\b|\b(?:nan|inf)s?\b.{0,40}\b(?:np|jnp|torch|tf)\.where\b.{0,40}\bgrad\w*",
            0.45,
            "NaN (or inf) gradients through a where",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:untaken|unselected|not[- ]selected|non-?selected|inactive|unused|masked[- ]out|off) (?:\w+ )?(?:branch|path)|\b(?:branch|path)\w* (?:that |which )?(?:was |is )?(?:never |not )(?:taken|executed)|\bnot used at all\b|\bnever selects\b",
            0.35,
            "the branch the where does not select still reaches the gradient",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:prun\w*|remov\w*|mask\w*|zero\w* out|replac\w*)\b.{0,40}\b(?:nan|inf)s?\b.{0,60}\bstill\b.{0,40}\b(?:nan|inf)s?\b",
            0.45,
            "the NaN values were masked off after the fact, and the gradients are still NaN",
        ),
        Sign(
            "failure",
            r"Function '\w+Backward\d*' returned nan values in its \w+ output",
            0.3,
            "anomaly mode: a backward node returned NaN (any NaN in a backward prints it)",
        ),
        Sign(
            "failure",
            r"(?i)\bnan\b[^.]{0,40}\bgrad\w*|\bgrad\w*\b[^.]{0,40}\b(?:nan|inf)\b",
            0.5,
            "a report in words: gradients NaN (or inf) while the forward is finite, through a where, a sqrt or a norm",
            family=True,
            near=(
                r"(?i)\b(?:loss|forward|outputs?|values?)\b[^.]{0,40}\b(?:finite|fine|normal|not nan|no nans?|is(?:n't| not) nan|valid)\b|\btorch\.where\b|\bwhere\(|\bsqrt\b|\blog\(0\)|\bnorm\b[^.]{0,30}\bzero\b|\bdivi\w* by zero\b|\bclamp\w*",
            ),
        ),
        Sign(
            "context",
            r"(?i)\b(?:torch|np|jnp|numpy|tf)\.where\b|\bS?WhereBackward\d*\b|\bwhere\((?:\w+ ?[<>=!]=?|cond|mask)|\[~torch\.isfinite\(|`where`",
            0.35,
            "a where in the code or the graph (or a mask of the non-finite elements)",
        ),
        Sign(
            "support",
            r"(?i)\b(?:sqrt|log2?|arccosh?|acosh?|arctanh|exp|cos)\(|\b0/0\b|\bx ?/ ?[nt]\b",
            0.1,
            "a function undefined somewhere in its input's range (sqrt, log, arccos, a division)",
        ),
        Sign(
            "veto",
            r"(?i)\bnan loss\b|\bloss (?:came to|becomes|became|goes to|turns (?:to )?)nan\b|GradScaler|found_inf|fp16|float16",
            0,
            "a NaN loss in training (overflow, a learning rate, fp16) rather than a where's untaken branch",
        ),
    ),
)

compiled_unit = (
    "a lens fit's gradient step as a user compiles it: the NFW deflection of a batch of lenses on the pixel grid, the "
    "loss against the observed field, and torch.autograd.grad of the lens parameters"
)

PARAMETERS = ("x0", "y0", "r_s", "kappa_s")  # per lens: the centre (arcsec), the scale radius (arcsec), the convergence scale


class Inputs(NamedTuple):
    params: dict  # name -> (lenses,) leaf tensors in the yaml's dtype, requires_grad: what the fit differentiates
    theta_x: torch.Tensor  # (npix, npix) pixel centres, arcsec
    theta_y: torch.Tensor
    observed_x: torch.Tensor  # (lenses, npix, npix) the deflection field the fit matches
    observed_y: torch.Tensor


def make_inputs(cfg, device):
    sizes = cfg.sizes
    g = torch.Generator().manual_seed(cfg.seed)
    n = sizes.lenses
    step = cfg.fov / sizes.npix
    dtype = getattr(torch, cfg.dtype)
    centres = (torch.arange(sizes.npix, dtype=torch.float64) + 0.5) * step - cfg.fov / 2  # no pixel at 0
    theta_y, theta_x = torch.meshgrid(centres, centres, indexing="ij")

    def draw(low, high):
        return low + (high - low) * torch.rand(n, generator=g)

    truth = {"x0": draw(-0.3, 0.3), "y0": draw(-0.3, 0.3), "r_s": draw(0.8, 1.6), "kappa_s": draw(0.2, 0.6)}
    guess = {
        name: value * (1 + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)) + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)
        for name, value in truth.items()
    }
    with torch.no_grad():
        observed_x, observed_y = deflection(nfw_h_reference, truth, theta_x, theta_y)  # the field of the true lenses
    return Inputs(
        params={name: value.to(device, dtype).requires_grad_() for name, value in guess.items()},
        theta_x=theta_x.to(device, dtype),
        theta_y=theta_y.to(device, dtype),
        observed_x=observed_x.to(device, dtype),
        observed_y=observed_y.to(device, dtype),
    )


def deflection(h, params, theta_x, theta_y):
    """The NFW reduced deflection of each lens at each pixel, (lenses, npix, npix) twice: caustic's
    `reduced_deflection_angle` in angular units, alpha = 4 kappa_s r_s h(x) / x with x = theta / r_s, along theta."""
    x = theta_x - params["x0"][:, None, None]  # (L, N, N) translate to each lens's centre
    y = theta_y - params["y0"][:, None, None]
    th = (x**2 + y**2).sqrt()
    r_s = params["r_s"][:, None, None]
    r = th / r_s
    alpha = 4 * params["kappa_s"][:, None, None] * r_s * h(r) / r
    return alpha * x / th, alpha * y / th


def fit_step(h, x, grads=None):
    """The loss of the lens fit (the mean squared residual of the field, summed over the lenses) and the gradient of
    every lens parameter, with `h` the NFW helper; `grads` post-processes the gradients (a bad fix's hook)."""
    ax, ay = deflection(h, x.params, x.theta_x, x.theta_y)
    loss = ((ax - x.observed_x) ** 2 + (ay - x.observed_y) ** 2).mean((1, 2)).sum()
    values = torch.autograd.grad(loss, [x.params[name] for name in PARAMETERS])
    if grads is not None:
        values = [grads(v) for v in values]
    return outputs(loss, values)


def outputs(loss, values):
    """The loss, each parameter's gradient, and the count of non-finite gradient elements (an integer: compared exactly)."""
    return {
        "loss": loss.detach(),
        "grad": dict(zip(PARAMETERS, (v.detach() for v in values))),
        "nonfinite_grads": sum((~torch.isfinite(v)).sum() for v in values),
    }


def nfw_h_buggy(x):
    """caustic's `NFW._h` before e1e27a3 (caustics #83), verbatim: each formula is NaN on the other side of 1."""
    term_1 = (x / 2).log()
    term_2 = torch.where(
        x > 1,
        term_1 + (1 / x).arccos() * 1 / (x**2 - 1).sqrt(),
        torch.where(
            x < 1,
            term_1 + (1 / x).arccosh() * 1 / (1 - x**2).sqrt(),
            1.0 + torch.tensor(1 / 2).log(),
        ),
    )
    return term_2


def nfw_h_double_where(x):
    """The double where: each formula computes on an input that a where of its own keeps on the formula's side of 1
    (2 and 1/2 stand in where the branch is not taken), the outer where selects as before."""
    term_1 = (x / 2).log()
    x_gt = torch.where(x > 1, x, 2.0)
    x_lt = torch.where(x < 1, x, 0.5)
    return torch.where(
        x > 1,
        term_1 + (1 / x_gt).arccos() * 1 / (x_gt**2 - 1).sqrt(),
        torch.where(x < 1, term_1 + (1 / x_lt).arccosh() * 1 / (1 - x_lt**2).sqrt(), 1.0 + torch.tensor(1 / 2).log()),
    )


def nfw_h_reference(x):
    """h(x) in any dtype, each formula evaluated only on its own elements (boolean indexing, caustics #83's fix)."""
    term_2 = torch.full_like(x, 1.0 + torch.tensor(1 / 2, dtype=torch.float64).log().item())
    gt, lt = x > 1, x < 1
    xg, xl = x[gt], x[lt]
    term_2 = term_2.index_put((gt,), (1 / xg).arccos() / (xg**2 - 1).sqrt())
    term_2 = term_2.index_put((lt,), (1 / xl).arccosh() / (1 - xl**2).sqrt())
    return (x / 2).log() + term_2


def buggy(x):
    """The fit step through caustic's `_h` before #83: the loss finite, every gradient NaN."""
    return fit_step(nfw_h_buggy, x)


def fixed(x):
    """The fit step through the double-where `_h`."""
    return fit_step(nfw_h_double_where, x)


def reference(x):
    """Float64 whatever the inputs' dtype, each formula only on its own pixels (boolean indexing), one autograd.grad;
    then the inputs' dtype."""
    params = {name: p.detach().double().requires_grad_() for name, p in x.params.items()}
    ax, ay = deflection(nfw_h_reference, params, x.theta_x.double(), x.theta_y.double())
    loss = ((ax - x.observed_x.double()) ** 2 + (ay - x.observed_y.double()) ** 2).mean((1, 2)).sum()
    values = torch.autograd.grad(loss, [params[name] for name in PARAMETERS])
    dtype = x.theta_x.dtype
    return outputs(loss.to(dtype), [v.to(dtype) for v in values])


def speed_baseline(x):
    """The buggy fit step: the same two formulas on every pixel, the one where."""
    return buggy(x)


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def nan_to_num_output(x):
    """`nan_to_num` of the where's output, as https://github.com/pytorch/pytorch/issues/94700 did with its loss
    (albanD: "This is indeed the expected behavior"): the output holds no NaN to replace; the gradients stay NaN."""
    return fit_step(lambda r: torch.nan_to_num(nfw_h_buggy(r)), x)


def nan_to_num_gradients(x):
    """`nan_to_num` of the gradients before the step (a generic attempt, not from the cited threads): every gradient
    was NaN, so every gradient becomes 0 and the fit does not move."""
    return fit_step(nfw_h_buggy, x, grads=torch.nan_to_num)


def hook_on_the_scaled_radius(x):
    """A hook that zeroes the non-finite gradient of x = theta / r_s, pixel by pixel (a generic attempt, not from the
    cited threads): the NaN goes, and with it every pixel's gradient through x, the right part included."""

    def h(r):
        r.register_hook(torch.nan_to_num)
        return nfw_h_buggy(r)

    return fit_step(h, x)


bad_fixes = {
    "nan_to_num_output": nan_to_num_output,
    "nan_to_num_gradients": nan_to_num_gradients,
    "hook_on_the_scaled_radius": hook_on_the_scaled_radius,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


@torch.compiler.disable  # compiled, dynamo would unroll the loop's 128 calls: minutes of compiling, and a user disables it
def nfw_h_row_by_row(r):
    """The double-where helper called on one row of pixels at a time, the row of every lens at once, stacked back."""
    return torch.stack([nfw_h_double_where(r[:, row]) for row in range(r.shape[1])], dim=1)


def one_row_at_a_time(x):
    """Correct and careless: the double-where helper, but called on one row of pixels at a time (a Python loop over
    the grid's rows): the same arithmetic in `npix` small calls for one. Marked `torch.compiler.disable`, as a user
    marks a helper whose compile takes minutes (dynamo unrolls the loop: 6 minutes here), so compiled it runs eager
    between the compiled graphs."""
    return fit_step(nfw_h_row_by_row, x)


slow_fixes = {"one_row_at_a_time": one_row_at_a_time}
