"""Gradients clipped under AMP before `scaler.unscale_`: the norm is 65536x too large, every step shrinks to nothing.

Upstream: https://github.com/pytorch/pytorch/issues/40907 (2020-07-02, torch 1.6's new `torch.cuda.amp`, on a GPU;
    its title "Gradient clipping with torch.cuda.amp"): the PyTorch MNIST example with `autocast()`, a `GradScaler`
    and one added line, and the reporter's words: "when I include the line `clip_grad_norm_(model.parameters(), 12)`
    the loss does not decrease anymore". The stored copy of the thread read here holds the description and the
    script up to the Net's forward; the train loop and the answer are cut off, so the loop below is the example's
    (pytorch/examples mnist/main.py at commit 49ec0bd, 2020-07-02) with the scaler's calls in the order the title
    and the sentence give: scale, backward, clip, step, update. The same order, fixed by adding
    `scaler.unscale_(optimizer)` before the clipping, outside pytorch/pytorch:
    https://github.com/milesial/Pytorch-UNet/issues/468 ("Gradients are clipped before the unscaling", train.py lines
    114-115) and https://github.com/milesial/Pytorch-UNet/pull/470 (commit 52b4f14, 2023-12-08, read here: one
    line, `grad_scaler.unscale_(optimizer)`); https://github.com/rwth-i6/returnn/issues/1590 ("the effective value
    gradient_clip_global_norm with AMP is reduced by a factor of 65k") fixed by
    https://github.com/rwth-i6/returnn/pull/1595; https://github.com/victorchall/EveryDream2trainer/pull/175 ("if
    you're using AMP clip_grad_scale is applied to the scaled gradients ... instead of effectively halting training").
    Still in pytorch/examples: https://github.com/pytorch/examples/issues/1196 (open), distributed/minGPT-ddp's
    `_run_batch` clips before `scaler.step` at the stored HEAD (77f55b9).

Fidelity: faithful in the loop and the model: the example's Net (conv 1->32 and 32->64 3x3, max-pool, Dropout2d(0.25),
    fc 9216->128, Dropout2d(0.5), fc 128->10, log_softmax) with its default init, `F.nll_loss`, Adadelta (lr 1.0,
    the example's default; rho 0.9, eps 1e-6), batch 64, the forward under autocast in float16 (CUDA autocast's
    dtype; CPU's default is bfloat16, so the dtype is named), `GradScaler` with its defaults, and the steps as the
    thread's loop takes them: zero_grad, scaled backward, clip, `scaler.step`, `scaler.update`. Synthetic: the
    digits (seeded sparse draws normalised with the example's (0.1307, 0.3081)) and labels; the dropout masks (drawn
    in make_inputs as the two Dropout2d would, whole channels after the pooling and single elements of fc1's (N, 128)
    output, and applied as products, so that the reference draws the same); the device (CPU: `torch.amp.GradScaler
    ("cpu")`, in every torch of the matrix, 2.3 on); max_norm 1.0 where #40907 used 12 (1.0 is Pytorch-UNet's
    `gradient_clipping`, minGPT-ddp's `grad_norm_clip` and EveryDream's "common/expected value": this stand-in's
    gradient norm at its first step is 1.75, under 12, where the fix would clip nothing and the bug alone would);
    and the scaler's state at the two steps, a scale of 2^15 as GradScaler holds it after one overflow (it halves
    the scale and skips the step whenever the scaled gradients hold an inf): at 2^16 this stand-in's first step is
    clean and its growth to 2^17, every 2000 clean steps, overflows and backs off to 2^16; a skipped step is not
    compared, the reference has no float16 to overflow.

Symptom on CUDA: nothing raises and nothing is printed; #40907 (torch 1.6, a GPU):
        when I include the line `clip_grad_norm_(model.parameters(), 12)` the loss does not decrease anymore.
    Not run on a GPU here: the arithmetic is the scaler's, the same on both devices.

Symptom on CPU: nothing raises and nothing is printed; the steps are wrong. torch 2.13.0 (run here, seed 0): the
    gradients the optimizer takes have a total norm of 3.05e-5 at both steps, 1/32768 of max_norm 1.0 (the clip
    coefficient applied to the scaled gradients, which scaler.step then divides by the scale), where the fix's have
    1.0; every parameter's gradient and update alike (Adadelta's first step is g * sqrt(eps) / sqrt((1 - rho) g^2 +
    eps), about g for these small g): the weights move 3.05e-5 where the fix moves them 0.82 and 0.55 (norms over all
    parameters), 27,000x less, and the second step's loss is the first's (2.2971, 2.3038) where the fix's has moved
    (2.9473 on these random labels). Every compared norm is off by 0.99997 of itself. Compiled (inductor, torch
    2.13.0): the same.

Cause: `scaler.scale(loss).backward()` leaves every gradient multiplied by the scale (2^16 by default), so that
    float16 gradients do not underflow; `clip_grad_norm_` then measures that norm, S times the true one, and scales
    the gradients down to max_norm; `scaler.step` unscales them afterwards, dividing by S again. The step's
    gradient norm becomes max_norm / S whenever S times the true norm exceeds max_norm, which is every step.

Fix: Pytorch-UNet's (#470), returnn's (#1595) and the AMP notes' ("Working with Unscaled Gradients"):
    `scaler.unscale_(optimizer)` before `clip_grad_norm_`; `scaler.step` then sees the optimizer already unscaled
    and does not divide again, and still skips a step whose gradients hold an inf. The reference takes the steps in
    float64 without autocast, GradScaler or torch.optim: the gradients by autograd, the clip coefficient
    min(1, max_norm / (norm + 1e-6)) and Adadelta written out. What is compared, per step: the loss, the total norm
    of the gradients the optimizer took (0 for a step the scaler skipped), and for each parameter the norm of its
    gradient and of its change. Not the elements: float16 autocast moves single elements of the gradients and the
    updates by up to a third of their tensor's largest (seeds 0-5; ReLUs that flip at 0 in float16), while every
    compared norm stays within 0.73% of the float64 one on seeds 0-9, and within 3.7% on seeds 0-252 (median 0.43%;
    the worst, 2.5-3.7% on 3 seeds, are conv1's bias, a sum of cancelling terms). Tolerance 5%: a grade's private
    seed in CI (2026-11-28) drew inputs where the conv biases' norms at step 2 were beyond it (max |diff| 0.0124),
    for upstream's own fix, the same arithmetic as `fixed`; on such inputs the model solution misses too, and a
    grade judges a submission against it instead (harness/grading/judge.py). The bad fixes are 20x the tolerance
    away, so a wider one would halve their margin.
    Wrong fixes, measured on the yaml's inputs against the reference (torch 2.13.0, seed 0), each rejected:
    raising max_norm by the scale, `clip_grad_norm_(..., max_norm * 65536)` before unscaling (EveryDream2trainer
    #175: "you have to pass values like `1e5` or `1e6` for cilp_grad_scale (depending on the state of the AMP
    scaler) ... because gradient scaling is dynamic, it's likely the value you pick won't be correct";
    suvojit-0x55aa/mixed-precision-pytorch#1 posts `max_norm=5*self._LOSS_SCALE` for a static scale): right while
    the scale is 2^16; at 2^15 it clips at 2.0 in true units, so not at all: the first step takes gradients of norm
    1.75 where the fix takes 1.0 and moves the weights 1.20 where it moves them 0.82 (46% more), and the second
    step's scaled gradients overflow float16 (the unclipped step moved the weights that far), so the scaler skips it
    (no gradient taken, no update, where the fix moves them 0.55) and halves its scale; relative error 0.447 over
    all compared norms; dropping the clipping (the comment in
    Pytorch-UNet #468: "if there exist gradinent explosion, scale.step will skip this iteration's parametes update,
    abosolutely there in no need for clipping"): the same two steps, 1.75 and skipped; clipping after `scaler.step`
    (a generic attempt, where the gradients are unscaled): the gradients left in .grad have the norm 1.0 of the
    reference, but the step took them unclipped: the same updates, 1.20 and a skipped step (relative error 0.375).
    Slow control: the norm to clip by measured on a second, unscaled forward and backward of the batch (correct, and
    the step's work twice).

Compiled: the model's two blocks, as regional compilation does (fresh() compiles each copy's convolutions and its
    head, the max-pool and the first dropout between them eager); the buggy steps are as wrong compiled (inductor,
    torch 2.13.0, CPU) and the fix matches the reference. Compiling the model whole (`torch.compile(model)`, the
    first unit tried) or the whole step makes the fix wrong there: conv1's and conv2's gradients (weights and
    biases) are exactly 0 at both steps, fc1's and fc2's right (a run of the harness, seed 0: relative error 1.0 for
    those eight norms). The cause is inductor's float16 `F.max_pool2d` backward on the CPU: the example's forward
    compiled alone, under float16 autocast, a loss times 32768, gives conv gradients of 0 at batch 64 and 32; the
    same with the pooling replaced by a strided slice gives them right; at batch 16 (seed 0) they were right. Not
    reduced further here.
"""

import copy
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from harness import compiled as compile_axis
from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}

# Nothing is printed: triage reads what a user writes (the clipping before the unscale, a loss that stalls once clipping
# is on under AMP) and the code shown; not GradScaler's errors, which are other bugs.
triage_signs = TriageSigns(
    family="gradients clipped or read while still multiplied by the AMP loss scale",
    cause="clip_grad_norm_ called on scaled gradients, before scaler.unscale_(optimizer)",
    confirm="the training step calls clip_grad_norm_ (or reads grad norms) between scaler.scale(loss).backward() and scaler.step() with no scaler.unscale_(optimizer) before it",
    also="a gradient penalty or a logged gradient norm computed on scaled gradients; unscale_ called twice for one step",
    signs=(
        Sign(
            "failure",
            r"(?i)\bclip\w*\b.{0,80}\b(?:applied to|on|uses?|used)\b.{0,20}\bscaled\W{0,2} grad",
            0.9,
            "the clipping measures the scaled gradients: their norm is the loss scale (65536) times the true one",
        ),
        Sign(
            "failure",
            r"(?im)\bclip\w*\b.{0,60}\bbefore\b.{0,40}\bunscal|^(?![^\n]*\bunscale_\([^\n]*#)[^\n]*?\bunscal\w*\b[^\n]{0,80}\bbefore\b[^\n]{0,40}\bclip",
            0.8,
            "the order of the clipping and the unscale: gradients clipped before GradScaler divides them by the scale (or the fix's words, unscale before clipping, not in a comment on the call itself: `scaler.unscale_(opt)  # unscale before clipping` is the right order at work)",
        ),
        Sign(
            "failure",
            r"(?i)\bclip\w*\b.{0,40}\bin between\b.{0,80}\bloss scale|\bclip\w*\b.{0,120}\b(?:reduced by a factor of|does not take the loss scale)",
            0.8,
            "a clip between the scaled backward and the step that ignores the loss scale: its threshold is effectively divided by the scale",
        ),
        Sign(
            "failure",
            r"(?i)\bclip\w*\b.{0,80}\b(?:loss (?:does not|doesn't|did not) decrease|flat learning curve|halting training)|(?:loss (?:does not|doesn't) decrease|flat learning curve).{0,80}\b(?:amp|fp16|mixed.precision)\b",
            0.6,
            "what a user sees: with clipping on under AMP, the loss stops decreasing",
        ),
        Sign(
            "failure",
            r"(?i)\bclip\w*",
            0.5,
            "a report in words: gradients clipped before GradScaler unscaled them",
            family=True,
            near=(
                r"(?i)\bunscale_?\b|\bGradScaler\b|\b(?:grad )?scaler\b|\bloss scal\w*|\bscaled grad\w*",
                r"(?i)\bbefore (?:unscal\w*|calling unscale)|\bwithout (?:calling )?unscal\w*|\bnot unscal\w*|\bforg[eo]t\w* (?:to )?(?:call )?unscal\w*|\bmissing (?:the )?unscal\w*|\bscaled (?:gradients?|grads?|norms?)\b|\bstill scaled\b",
            ),
        ),
        Sign(
            "context",
            r"scaler\.scale\(.*\)\.backward\(|scaled_loss\.backward\(|backward_loss\(",
            0.2,
            "the scaled backward that leaves the gradients multiplied by the scale",
        ),
        Sign("context", r"clip_grad_norm_?\(|grad_clip\w*\(|gradient_clip\w*", 0.2, "a gradient clipping call"),
        Sign("support", r"(?i)GradScaler|\bautocast\b|native amp|automatic mixed precision|\bfp16\b", 0.1, "AMP with a loss scaler"),
        Sign(
            "veto",
            r"Attempting to unscale FP16 gradients|unscale_\(\) has already been called|No inf checks were recorded",
            0,
            "GradScaler's own errors: float16 parameters, unscale_ twice, or no gradients; another bug, and it raises",
        ),
    ),
)

compiled_unit = (
    "the model's two blocks, as regional compilation does: its convolutions (conv1, ReLU, conv2, ReLU) and its head (fc1, "
    "ReLU, dropout, fc2, log_softmax), the max-pool between them eager; fresh() compiles each copy's as the run's "
    "`compile` says. Not the whole model nor the whole step: on torch 2.13.0 inductor's float16 max_pool2d backward on "
    "the CPU returns zeros, so conv1's and conv2's gradients are 0 (Compiled in the docstring)"
)
compiles_itself = True  # fresh() compiles the copy's two blocks as cfg says


class Net(nn.Module):
    """The PyTorch MNIST example's Net (pytorch/examples mnist/main.py, July 2020), as #40907 posts it; its two Dropout2d
    applied as the masks `keep1` (B, 64, 1, 1) and `keep2` (B, 128) drawn in make_inputs."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, keep1, keep2):
        x = self.features(x)
        x = F.max_pool2d(x, 2) * keep1.to(x.dtype)  # dropout1: whole channels, (B, 64, 12, 12), in x's dtype as Dropout2d
        return self.head(torch.flatten(x, 1), keep2)

    def features(self, x):
        return F.relu(self.conv2(F.relu(self.conv1(x))))

    def head(self, x, keep2):
        x = F.relu(self.fc1(x)) * keep2.to(x.dtype)  # dropout2 on (B, 128): single elements
        return F.log_softmax(self.fc2(x), dim=1)


class Inputs(NamedTuple):
    model: Net  # the weights the steps start from (each call trains a copy)
    batches: tuple  # per step: (images (B, 1, 28, 28), targets (B,), keep1 (B, 64, 1, 1), keep2 (B, 128))
    scaler_state: dict  # GradScaler's state_dict at the first step
    max_norm: float
    lr: float
    rho: float
    eps: float
    compile: dict  # how fresh() compiles the model: cfg's `compile` (off, or the backend) and `kernel_threads`


def make_inputs(cfg, device):
    generator = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)  # the layers' default init draws from the global generator
        model = Net()
    batch = cfg.sizes.batch
    batches = []
    for _ in range(cfg.steps):
        ink = torch.rand(batch, 1, 28, 28, generator=generator) < cfg.ink  # synthetic digits: sparse strokes
        pixels = ink * torch.rand(batch, 1, 28, 28, generator=generator)
        images = (pixels - 0.1307) / 0.3081  # transforms.Normalize((0.1307,), (0.3081,))
        targets = torch.randint(0, 10, (batch,), generator=generator)
        keep1 = (torch.rand(batch, 64, 1, 1, generator=generator) >= 0.25) / 0.75
        keep2 = (torch.rand(batch, 128, generator=generator) >= 0.5) / 0.5
        batches.append(tuple(t.to(device) for t in (images, targets, keep1, keep2)))
    scaler_state = {
        "scale": float(cfg.scaler.scale),
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 2000,
        "_growth_tracker": int(cfg.scaler.growth_tracker),
    }
    compile = {"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")}
    return Inputs(
        model.to(device), tuple(batches), scaler_state, float(cfg.max_norm), float(cfg.lr), float(cfg.rho), float(cfg.eps), compile
    )


def fresh(x):
    """A copy of the starting model (its convolutions and its head compiled where the run compiles, the pooling between
    them eager: Compiled in the docstring), Adadelta as the example builds it, and a GradScaler in the run's state."""
    model = copy.deepcopy(x.model)
    model.features = compile_axis.compiled(model.features, x.compile)
    model.head = compile_axis.compiled(model.head, x.compile)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=x.lr, rho=x.rho, eps=x.eps)
    scaler = torch.amp.GradScaler(x.batches[0][0].device.type)
    scaler.load_state_dict(dict(x.scaler_state))
    return model, optimizer, scaler


def forward_loss(model, batch):
    """#40907's forward: the model and the loss under autocast (float16, CUDA's autocast dtype)."""
    images, targets, keep1, keep2 = batch
    with torch.autocast(images.device.type, dtype=torch.float16):
        output = model(images, keep1, keep2)
        loss = F.nll_loss(output, targets)
    return loss


def what_the_step_left(model, before, loss):
    """The loss; the gradients the optimizer took (unscaled, after any clipping): their total norm and each parameter's
    norm, 0 where the scaler skipped the step (its gradients held an inf or a NaN: the optimizer took none); and the
    norm of each parameter's change."""
    grads = {name: p.grad.detach() for name, p in model.named_parameters()}
    skipped = not all(bool(torch.isfinite(g).all()) for g in grads.values())  # GradScaler's test: found_inf
    norms = {name: torch.zeros((), device=g.device) if skipped else torch.linalg.vector_norm(g) for name, g in grads.items()}
    return {
        "loss": loss.detach().float(),
        "clipped_norm": torch.linalg.vector_norm(torch.stack(list(norms.values()))),
        "grad_norm": norms,
        "update_norm": {name: torch.linalg.vector_norm(p.detach() - before[name]) for name, p in model.named_parameters()},
    }


def train(x, clip, after_step=None):
    """The thread's loop over the batches: zero_grad, the scaled backward, `clip`, scaler.step, scaler.update."""
    model, optimizer, scaler = fresh(x)
    out = []
    for batch in x.batches:
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        optimizer.zero_grad()
        loss = forward_loss(model, batch)
        scaler.scale(loss).backward()
        clip(model, optimizer, scaler, batch)
        scaler.step(optimizer)
        scaler.update()
        if after_step is not None:
            after_step(model)
        out.append(what_the_step_left(model, before, loss))
    return tuple(out)


def buggy(x):
    """#40907's loop: clip_grad_norm_ on the scaled gradients, then scaler.step."""
    return train(x, lambda model, optimizer, scaler, batch: nn.utils.clip_grad_norm_(model.parameters(), x.max_norm))


def fixed(x):
    """Pytorch-UNet #470: scaler.unscale_(optimizer), then the clipping; scaler.step does not unscale again."""
    return train(x, lambda model, optimizer, scaler, batch: unscale_then_clip(x, model, optimizer, scaler))


def unscale_then_clip(x, model, optimizer, scaler):
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), x.max_norm)


def reference(x):
    """The steps in float64: no autocast, no GradScaler, no torch.optim; the gradients by autograd, the clipping and
    Adadelta written out."""
    params = {name: p.detach().double().clone() for name, p in x.model.named_parameters()}
    square_avg = {name: torch.zeros_like(p) for name, p in params.items()}
    acc_delta = {name: torch.zeros_like(p) for name, p in params.items()}
    out = []
    for images, targets, keep1, keep2 in x.batches:
        p = {name: value.clone().requires_grad_() for name, value in params.items()}
        h = F.relu(F.conv2d(images.double(), p["conv1.weight"], p["conv1.bias"]))
        h = F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"]))
        h = torch.flatten(F.max_pool2d(h, 2) * keep1.double(), 1)
        h = F.relu(h @ p["fc1.weight"].T + p["fc1.bias"]) * keep2.double()
        logits = h @ p["fc2.weight"].T + p["fc2.bias"]
        loss = -(logits - logits.logsumexp(1, keepdim=True)).gather(1, targets[:, None]).mean()
        grads = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        coef = min(1.0, x.max_norm / (norm + 1e-6))
        grad_norm, update_norm = {}, {}
        for name, g in grads.items():
            g = g * coef
            square_avg[name] = x.rho * square_avg[name] + (1 - x.rho) * g * g
            delta = (acc_delta[name] + x.eps).sqrt() / (square_avg[name] + x.eps).sqrt() * g
            acc_delta[name] = x.rho * acc_delta[name] + (1 - x.rho) * delta * delta
            params[name] = params[name] - x.lr * delta
            grad_norm[name] = torch.linalg.vector_norm(g).float()
            update_norm[name] = (x.lr * torch.linalg.vector_norm(delta)).float()
        out.append(
            {
                "loss": loss.detach().float(),
                "clipped_norm": torch.tensor(norm * coef, dtype=torch.float32),
                "grad_norm": grad_norm,
                "update_norm": update_norm,
            }
        )
    return tuple(out)


def speed_baseline(x):
    """The same steps without clipping: what the scaled step costs (scaler.step unscales)."""
    return train(x, lambda model, optimizer, scaler, batch: None)


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def max_norm_times_the_scale(x):
    """Clip the scaled gradients at max_norm times 65536, the default scale: users of
    https://github.com/victorchall/EveryDream2trainer/pull/175 had to pass "values like `1e5` or `1e6`" for the clip
    "depending on the state of the AMP scaler", and https://github.com/suvojit-0x55aa/mixed-precision-pytorch/issues/1
    posts `max_norm=5*self._LOSS_SCALE`. Right while the scale stays 2^16; the scale is dynamic."""
    return train(x, lambda model, optimizer, scaler, batch: nn.utils.clip_grad_norm_(model.parameters(), x.max_norm * 65536.0))


def drop_the_clipping(x):
    """No clipping, since scaler.step skips a step whose gradients overflowed (a comment in
    https://github.com/milesial/Pytorch-UNet/issues/468: "absolutely there in no need for clipping")."""
    return train(x, lambda model, optimizer, scaler, batch: None)


def clip_after_the_step(x):
    """Clip after scaler.step, where the gradients are unscaled (a generic attempt): the step took them unclipped."""
    return train(
        x, lambda model, optimizer, scaler, batch: None, after_step=lambda model: nn.utils.clip_grad_norm_(model.parameters(), x.max_norm)
    )


bad_fixes = {
    "max_norm_times_the_scale": max_norm_times_the_scale,
    "drop_the_clipping": drop_the_clipping,
    "clip_after_the_step": clip_after_the_step,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def norm_from_an_unscaled_pass(x):
    """Leave the scaled gradients to the scaler and measure the norm to clip by on a second, unscaled forward and
    backward of the same batch (autograd.grad: nothing lands in .grad), then scale the scaled gradients by the clip
    coefficient that norm gives: correct (float16's underflow without the scale is within the tolerance), and the
    step's forward and backward twice."""

    def clip(model, optimizer, scaler, batch):
        params = list(model.parameters())
        grads = torch.autograd.grad(forward_loss(model, batch), params)
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coef = torch.clamp(x.max_norm / (norm + 1e-6), max=1.0)
        for param in params:
            param.grad.mul_(coef)

    return train(x, clip)


slow_fixes = {"norm_from_an_unscaled_pass": norm_from_an_unscaled_pass}
