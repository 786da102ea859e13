"""A GAN step whose discriminator optimizer runs before the generator's backward through it.

Upstream: https://github.com/MorvanZhou/PyTorch-Tutorial/issues/89 (tutorial-contents/406_GAN.py of
    MorvanZhou/PyTorch-Tutorial; pytorch 1.5.0, python 3.7.4, CPU: the log names a torch.FloatTensor).
    The same loop, with a sine as the real data, is https://github.com/pytorch/pytorch/issues/39141
    (pytorch 1.5, closed by an autograd maintainer's explanation that PR #91 credits: opt_D.step()
    changes D's parameters in place, and G_loss.backward() still needs them). The fix the maintainer
    merged: https://github.com/MorvanZhou/PyTorch-Tutorial/pull/91 and commit f52e199 ("update for new
    version of torch", 2020-06-08). Why torch 1.4 ran it: torch 1.5's release notes, "torch.optim
    optimizers changed to fix in-place checks for the changes made by the optimizer" (1.4's Adam wrote
    `p.data`, which the version counter does not see).

Fidelity: faithful in the networks, sizes, losses, optimizers and call order of 406_GAN.py before
    commit f52e199: G = Linear(5, 128), ReLU, Linear(128, 15); D = Linear(15, 128), ReLU, Linear(128, 1),
    Sigmoid; Adam with lr 1e-4 for both; a batch of 64 ideas (N_IDEAS 5) and 64 real "paintings" of 15
    points `a * x**2 + (a - 1)`, a ~ U(1, 2), x in linspace(-1, 1, 15); D_loss and G_loss from one forward,
    `opt_D.zero_grad(); D_loss.backward(retain_graph=True); opt_D.step()`, then
    `opt_G.zero_grad(); G_loss.backward(); opt_G.step()`. One step is the case: the loop fails on its
    first. Synthetic: the initial weights, ideas and `a` (seeded torch draws; upstream draws `a` from
    numpy's unseeded global generator), and that each call trains fresh copies of G and D with fresh
    optimizers (the loop's first iteration), so the inputs never change.

Symptom on CUDA: not in this thread (it runs on CPU); other GAN repositories show the CUDA form, e.g.
    https://github.com/leftthomas/SRGAN/issues/89 (a conv weight, pytorch >= 1.5):
        RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.cuda.FloatTensor [1, 1024, 1, 1]] is at version 2; expected version 1 instead. Hint: enable anomaly detection to find the operation that failed to compute its gradient, with torch.autograd.set_detect_anomaly(True).
    Seen on an H200 (torch 2.11.0+cu130, CUDA 13.0, driver 580.159): the CPU's text but for the tensor type,
    `[torch.cuda.FloatTensor [128, 1]], which is output 0 of AsStridedBackward0, is at version 1; expected version 0`.

Symptom on CPU: raised by G_loss.backward() (#89, pytorch 1.5.0):
        RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation: [torch.FloatTensor [128, 1]], which is output 0 of TBackward, is at version 2; expected version 1 instead. Hint: the backtrace further above shows the operation that failed to compute its gradient. The variable in question was changed in there or anywhere later. Good luck!
    [128, 1] is D's last weight transposed, saved by its Linear for the gradient of its input. torch
    2.13.0 names it `output 0 of AsStrided`, at version 1, expected 0, and hints at anomaly detection
    instead; the op name and the version numbers change across releases.

Cause: G_loss's graph runs through D and saved D's weights (as views) to compute the gradient for G.
    opt_D.step() updates those weights in place before G_loss.backward() uses them, so the backward would
    mix D's old activations with its new weights; autograd's version counter refuses. torch 1.4 ran the
    same code and silently returned that mixture (see `downgrade_to_torch_1_4`).

Fix: the maintainer's (commit f52e199): take G's step first, through D as it was (G_loss.backward(),
    opt_G.step()), then D's: D on the real batch and on the generated batch detached, D_loss.backward(),
    opt_D.step(). Both gradients are then taken at the weights the step started from, as the buggy
    code's single forward meant. An equivalent with one forward: both backwards first, G's restricted to
    G's parameters (`inputs=`), then both steps (the speed baseline). Wrong ones: two generic attempts at
    this message, not from the cited threads: `retain_graph=True` on every backward (the buggy code already
    retains; still raises), `.clone()` on the activations (the modified tensor is a weight: still raises);
    and two from leftthomas/SRGAN's threads on the same error, each a commenter's: stepping both optimizers
    after both backwards without restricting G's backward (https://github.com/leftthomas/SRGAN/issues/89:
    "you can simply do optimizerD.step() and optimizerG.step() after both d_loss.backward and
    g_loss.backward to avoid this error"; D's gradient gets G_loss's too, whose fake term cancels D_loss's),
    and downgrading torch below 1.5 (https://github.com/leftthomas/SRGAN/issues/88: "fixed by using
    torch==1.4.0 and torchvision==0.5 . Not really long term fix"; in PyTorch-Tutorial #89 sijiali57 explains
    that 1.4 lacked the check and 1.5 added it), which cannot be a function: `downgrade_to_torch_1_4` replays what
    1.4 computed (Adam writing `p.data`), silently
    wrong. Anomaly detection, which the error's hint suggests, left on in training is correct but slow
    (a slow control). A `.clone()` of D's weights for G's pass (torch.func.functional_call) is correct and
    costs next to nothing at these sizes (0.99-1.23x of the baseline, one noisy process each), so it is
    neither a bad fix nor a slow control. Nor is a deep copy of D taken before its step for G's loss: correct,
    1.21-1.29x of the baseline against the 1.15x budget, flagged in 3 runs here and missed (inconclusive)
    in a fourth under load, too close to the budget to serve as a control.

Compiled: `torch.compile(G)` and `torch.compile(D)` (compiles_itself). The compiled D saves its first
    weight rather than the last one's transpose, so the message names [torch.FloatTensor [128, 15]] with no
    "which is output 0 of" (torch 2.13.0). With inductor's donated buffers on (its default from torch 2.6),
    the thread's `D_loss.backward(retain_graph=True)` through a compiled D raises first: "This backward
    function was compiled with non-empty donated buffers which requires create_graph=False and
    retain_graph=False"; `fresh_models` turns them off, as that message offers, to keep the thread's code.
"""

import copy
import math
from typing import NamedTuple

import torch
from torch import nn

from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom(
        "RuntimeError",
        r"one of the variables needed for gradient computation has been modified by an inplace operation: \[torch\.FloatTensor \[128, 1\]\]",
    ),
    "cuda": Symptom(
        "RuntimeError",
        r"one of the variables needed for gradient computation has been modified by an inplace operation: \[torch\.cuda\.FloatTensor \[128, 1\]\]",
    ),
}

# Autograd's version check on a tensor saved for backward, whatever changed it (an optimizer step, `+=`, an inplace
# activation); not the view checks made at the in-place op itself, nor a second backward through a freed graph.
triage_signs = TriageSigns(
    family="autograd's version check: a saved tensor changed in place",
    cause="an in-place operation on a tensor that autograd saved for the backward",
    confirm="the op named in `output 0 of XBackward` and an in-place op (+=, relu_(inplace=True), optimizer.step()) on it before backward",
    also="a GAN stepping D's optimizer before G's backward through D",
    signs=(
        Sign(
            "failure",
            r"one of the variables needed for gradient computation has been modified by an inplace operation",
            0.9,
            "autograd's version check: a tensor saved for backward was changed in place before the backward used it",
        ),
        Sign(
            "failure",
            r"\]\]?,? (?:which is output \d+ of \w+, )?is at version \d+; expected version \d+ instead|is at version \d+, not expected version \d+",
            0.7,
            "the version check's figures (saved tensor, version seen, version saved), where the line with the message was cut or wrapped",
        ),
        Sign(
            "failure",
            r"(?i)\bin-?(?:place|palce|plcae) (?:operation|op)s?\b[^.]{0,20}\b(?:error|exception|problem|issue)s?\b|\b(?:error|exception)s?\b[^.]{0,20}\bin-?place (?:operation|op)s?\b",
            0.45,
            "a report in words: an in-place operation error (a tensor autograd saved, modified in place)",
        ),
        Sign(
            "context",
            r"(?i:opt(?:imizer)?_?(?:net)?D\.step\(\))|optimizerD\.step\(\)|netD\b|(?i:discriminator|adversarial)|d_loss|D_loss",
            0.3,
            "a GAN's discriminator step in play: an optimizer stepping D before G's backward through D is the classic cause",
        ),
        Sign(
            "context",
            r"which is output \d+ of \w+",
            0.2,
            "names the op whose output was saved (TBackward / AsStrided: a weight; ReluBackward: an in-place activation)",
        ),
        Sign("support", r"set_detect_anomaly\(True", 0.1, "the version check's hint to rerun with anomaly detection"),
    ),
)

compiled_unit = (
    "the two networks, `torch.compile(G)` and `torch.compile(D)`, as a user compiles a model; the backwards and the "
    "optimizer steps run as they do around a compiled model. Not the step whole: each call trains fresh copies with a "
    "fresh Adam (the loop's first iteration), and dynamo guards on the optimizer object, so a whole-step compile "
    "recompiled every frame after each graph break on every call (17 recompiles per timing process, 0.4-0.7 s a call, "
    "torch 2.13.0)"
)
compiles_itself = True  # fresh_models compiles the copies of G and D as cfg says (Inputs.compile)


class Inputs(NamedTuple):
    G: nn.Sequential  # Linear(5, 128), ReLU, Linear(128, 15)
    D: nn.Sequential  # Linear(15, 128), ReLU, Linear(128, 1), Sigmoid
    ideas: torch.Tensor  # (64, 5): G_ideas
    paintings: torch.Tensor  # (64, 15): artist_works()
    lr_g: float
    lr_d: float
    compile: dict  # how fresh_models compiles G and D: cfg's `compile` (off, or the backend) and `kernel_threads`


def make_inputs(cfg, device):
    generator = torch.Generator().manual_seed(cfg.seed)
    sizes = cfg.sizes
    torch.manual_seed(cfg.seed)  # nn.Linear's default init draws from the global generator
    G = nn.Sequential(nn.Linear(sizes.ideas, sizes.hidden), nn.ReLU(), nn.Linear(sizes.hidden, sizes.components))
    D = nn.Sequential(nn.Linear(sizes.components, sizes.hidden), nn.ReLU(), nn.Linear(sizes.hidden, 1), nn.Sigmoid())
    points = torch.linspace(-1, 1, sizes.components).expand(sizes.batch, -1)
    a = 1 + torch.rand(sizes.batch, 1, generator=generator, dtype=torch.float64)
    paintings = (a * points.double() ** 2 + (a - 1)).float()
    return Inputs(
        G=G.to(device),
        D=D.to(device),
        ideas=torch.randn(sizes.batch, sizes.ideas, generator=generator).to(device),
        paintings=paintings.to(device),
        lr_g=cfg.lr_g,
        lr_d=cfg.lr_d,
        compile={"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")},
    )


def fresh_models(x):
    """The loop's first iteration on copies (the inputs keep their weights), compiled where the run compiles."""
    G, D = copy.deepcopy(x.G), copy.deepcopy(x.D)
    opt_G, opt_D = torch.optim.Adam(G.parameters(), lr=x.lr_g), torch.optim.Adam(D.parameters(), lr=x.lr_d)
    if compile_axis.mode_of(x.compile) != "off" and hasattr(torch._functorch.config, "donated_buffer"):
        # inductor (torch >= 2.6) donates saved buffers and then refuses the thread's retain_graph=True, as its message says
        torch._functorch.config.donated_buffer = False
    return compile_axis.compiled(G, x.compile), compile_axis.compiled(D, x.compile), opt_G, opt_D


def trained(G, D):
    """What the step leaves: each parameter's gradient, then its new value (G's, then D's)."""
    parameters = [*G.parameters(), *D.parameters()]
    return tuple(p.grad for p in parameters) + tuple(p.detach() for p in parameters)


def buggy(x):
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings)
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()  # in place on D's weights, which G_loss's graph saved
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
    return trained(G, D)


def fixed(x):
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist1 = D(G_paintings)
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings.detach())  # G's step does not reach D's loss
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)  # kept from upstream; nothing reuses the graph now
    opt_D.step()
    return trained(G, D)


def reference(x):
    """Both gradients at the starting weights, by autograd over the networks written out in float64, and
    Adam's first step by its formula: m / (sqrt(v) + eps) with bias correction is g / (|g| + eps)."""
    g = [p.detach().double().requires_grad_() for p in x.G.parameters()]  # w1, b1, w2, b2
    d = [p.detach().double().requires_grad_() for p in x.D.parameters()]

    def generator(ideas):
        return torch.relu(ideas @ g[0].T + g[1]) @ g[2].T + g[3]

    def discriminator(paintings, w):
        return torch.sigmoid(torch.relu(paintings @ w[0].T + w[1]) @ w[2].T + w[3])

    fake = generator(x.ideas.double())
    g_grads = torch.autograd.grad(torch.log(1 - discriminator(fake, d)).mean(), g)
    d_loss = -(torch.log(discriminator(x.paintings.double(), d)) + torch.log(1 - discriminator(fake.detach(), d))).mean()
    d_grads = torch.autograd.grad(d_loss, d)
    grads = [*g_grads, *d_grads]
    rates = [x.lr_g] * len(g) + [x.lr_d] * len(d)
    stepped = [p - lr * grad / (grad.abs() + 1e-8) for p, grad, lr in zip([*g, *d], grads, rates)]
    return tuple(t.detach().float() for t in grads + stepped)


def speed_baseline(x):
    """The intended step at its least work: one forward, both backwards (G's restricted to G), then both steps."""
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings)
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True, inputs=list(D.parameters()))
    opt_G.zero_grad()
    G_loss.backward(inputs=list(G.parameters()))
    opt_D.step()
    opt_G.step()
    return trained(G, D)


# -- bad fixes: plausible, each wrong (two generic attempts, two from leftthomas/SRGAN's threads) --


def retain_graph_everywhere(x):
    """`retain_graph=True` on G's backward too (the buggy code already retains on D's): still raises. A generic
    attempt at this message, not from the cited threads."""
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings)
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()
    opt_G.zero_grad()
    G_loss.backward(retain_graph=True)
    opt_G.step()
    return trained(G, D)


def clone_the_activations(x):
    """`.clone()` on the generated batch and on D's outputs: the modified tensor is D's weight, not these. A generic
    attempt at this message, not from the cited threads."""
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas).clone()
    prob_artist0 = D(x.paintings).clone()
    prob_artist1 = D(G_paintings.clone()).clone()
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1.clone()))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_D.step()
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
    return trained(G, D)


def step_after_both_backwards(x):
    """A commenter in https://github.com/leftthomas/SRGAN/issues/89: both steps after both backwards. G_loss.backward()
    also adds into D's gradients, so D steps on D_loss + G_loss, whose generated-batch terms cancel: D learns from the
    real batch only."""
    G, D, opt_G, opt_D = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings)
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)
    opt_G.zero_grad()
    G_loss.backward()
    opt_D.step()
    opt_G.step()
    return trained(G, D)


def adam_first_step_on_data(parameters, lr, betas=(0.9, 0.999), eps=1e-8):
    """torch 1.4's Adam.step() for a fresh optimizer, line for line: it wrote `p.data`, unseen by autograd."""
    for p in parameters:
        exp_avg = (1 - betas[0]) * p.grad
        exp_avg_sq = (1 - betas[1]) * p.grad * p.grad
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - betas[1])).add_(eps)
        p.data.addcdiv_(exp_avg, denom, value=-lr / (1 - betas[0]))


def downgrade_to_torch_1_4(x):
    """A commenter in https://github.com/leftthomas/SRGAN/issues/88: "fixed by using torch==1.4.0". Downgrading torch
    cannot be a function; this is what the buggy code computed on torch 1.4: D's step bypasses the version counter,
    so G's backward uses D's new weights with its old activations."""
    G, D, opt_G, _ = fresh_models(x)
    G_paintings = G(x.ideas)
    prob_artist0 = D(x.paintings)
    prob_artist1 = D(G_paintings)
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    D.zero_grad()
    D_loss.backward(retain_graph=True)
    adam_first_step_on_data(D.parameters(), x.lr_d)
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()
    return trained(G, D)


bad_fixes = {
    "retain_graph_everywhere": retain_graph_everywhere,
    "clone_the_activations": clone_the_activations,
    "step_after_both_backwards": step_after_both_backwards,
    "downgrade_to_torch_1_4": downgrade_to_torch_1_4,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def anomaly_detection_left_on(x):
    """The fix, with the anomaly detection the error's hint asks for still on (it records a traceback per op)."""
    with torch.autograd.detect_anomaly(check_nan=True):
        return fixed(x)


slow_fixes = {"anomaly_detection_left_on": anomaly_detection_left_on}
