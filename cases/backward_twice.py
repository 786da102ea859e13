"""An RNN's hidden state carried into the next window without detach(): the second backward reaches a freed graph.

Upstream: https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57 ("403: question about h_state = h_state.data",
    2018-11-12), on tutorial-contents/403_RNN_regressor.py of MorvanZhou/PyTorch-Tutorial: with the line
    `h_state = h_state.data` commented out, training raised the error below, which the user "found can actually be
    solved by `loss.backward(retain_graph=True)`". The maintainer's answer: the code is written for pytorch 0.4.
    The user's torch version and device are not given. The message's wording ("but the buffers have already been
    freed") does not date it closely: torch 1.0.0 and 1.5.0 print it, 1.6.0 prints "but the saved intermediate
    results have already been freed" (the strings in each release's libtorch, macOS wheels; by its title and date,
    May 2020, the change is pytorch PR #38625, "Do not use 'buffer' in reentrant autograd err msg"). The date does:
    #57 was filed before the torch 1.0.0 wheels were built (2018-12-06), so the user ran an older release or a 1.0
    preview. The script runs on CPU (its tensors come from numpy, never moved).

Fidelity: faithful in the model, sizes, data, optimizer and call order of 403_RNN_regressor.py: nn.RNN(input_size 1,
    hidden_size 32, 1 layer, batch_first), Linear(32, 1) applied per time step and stacked, MSELoss, Adam with lr 0.02;
    window `step` predicts cos from sin on np.linspace(step * pi, (step + 1) * pi, 10) in float32, a batch of 1; the
    hidden state returned by the RNN goes into the next window's forward. Synthetic: the initial weights (seeded with
    `seed`, upstream unseeded; its commented `torch.manual_seed(1)` is the seed used here), and the unit of a call:
    one call trains the loop's next two windows (`windows_per_call`), so that one call on fresh inputs reaches the
    second backward, where the error is raised, and each later call carries the state on.

Symptom on CUDA: not in this thread (the tutorial runs on CPU). Seen on an H200 (torch 2.11.0+cu130, CUDA 13.0, driver 580.159): the CPU's
    text, raised by the second backward on the host; no device-side assert, and an unrelated op afterwards runs fine.
    The fix's float32 numbers differ from the float64 reference by up to 1.5e-4 there (cuDNN's RNN in TF32, torch's
    default; 2.1e-6 with cudnn.allow_tf32 off): the yaml's `cuda_tolerance`.

Symptom on CPU: raised by the second window's loss.backward() (#57, torch version not given; before 1.0.0 by the date):
        RuntimeError: Trying to backward through the graph a second time, but the buffers have already been freed. Specify retain_graph=True when calling backward the first time.
    torch 2.13.0 words it:
        RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.

Cause: the hidden state returned by window k's forward is part of window k's graph. Window k+1 starts its RNN from it,
    so window k+1's loss depends, through it, on window k's graph, which window k's backward already freed: the
    backward walks back into it and finds its saved tensors gone. Nothing in the loop means to backpropagate into
    the previous window (truncated backpropagation through time: gradients stay within a window, the value carries).

Fix: the tutorial's own line, `h_state = h_state.data` right after the forward, written `h_state.detach()` as torch
    >= 0.4 recommends: the value carries on, the history does not. The speed baseline is the tutorial's `.data` line
    itself. (Detaching before the next forward instead, as pytorch/examples' word_language_model does with
    `repackage_hidden`, is as correct, but leaves the stored state attached: it cannot take turns on one Loop with a
    step that detaches after the forward, as the speed phase's interleaved calls do.) Wrong ones: the thread's
    `loss.backward(retain_graph=True)` keeps every window's graph alive and each backward walks the whole history
    back to the first window (full backpropagation through time with the weights each window saw then). On torch
    >= 1.5, whose optimizers bump the parameters' version counter, the second window's backward then raises
    "modified by an inplace operation" (a bad fix, rejected by raising); on the thread's torch (Adam wrote `p.data`,
    which the version counter does not see, until torch 1.5) it ran, and memory and time per call grew with the
    number of windows so far: `retain_graph_on_torch_0_4` replays that (a memory control: 98-102 KiB more retained per
    call than the baseline in 10 of 10 memory phases, the fix at most 2.2 KiB at its interval's top; a call took 8.5 ms at the
    first and 24 ms at the sixteenth, one process; it also differs from the reference from the second window on, its
    gradients running into past windows). It is no slow control: being wrong, it cannot stand for a correct but slow
    fix, and the speed phase's interleaved calls on one Loop let the baseline's backward cut its chain. Starting every window from a
    zero hidden state (`h_state = None`, proposed for the same file in
    https://github.com/MorvanZhou/PyTorch-Tutorial/issues/49: the error goes, the carried context with it) differs
    from the reference.
    Anomaly detection left on while training is correct but slow (a slow control).

Compiled: `torch.compile` of the RNN module (compiles_itself), as a user compiles a model; the loop's backward and
    Adam's step run around it as they do around a compiled model.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom("RuntimeError", r"Trying to backward through the graph a second time"),
    "cuda": Symptom("RuntimeError", r"Trying to backward through the graph a second time"),
}

# Autograd reaching a graph an earlier backward freed is common to many bugs (a loss backwarded twice, a tensor built
# once outside the loop, a GAN's D step reusing G's output): the failure names this case only beside a state carried
# from one step's graph into the next (an RNN's hidden state, a model attribute holding it, truncated BPTT).
triage_signs = TriageSigns(
    family="a backward through a graph whose saved tensors an earlier backward freed",
    cause="a recurrent hidden state carried from one batch into the next without .detach()",
    confirm="a state (hidden, memory, a running value) kept across iterations and fed to the next forward without .detach(): the case's fix is `hidden = hidden.detach()` each batch",
    also="two backwards through one graph: a GAN's G and D steps on one output, two losses sharing a subgraph without retain_graph, a tensor computed once outside the loop and reused every step",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"Trying to backward through the graph a second time",
            0.6,
            "autograd reached a graph whose saved tensors an earlier backward freed",
            family=True,
        ),
        Sign(
            "failure",
            r"[Ss]pecify retain_graph=True (?:if|when) you need to backward through the graph a second time|saved tensors after (?:calling backward|they have already been freed)",
            0.6,
            "the same error's second half (the advice to pass retain_graph=True), where its first line was cut or wrapped",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\b(?:multiple|subsequent|several|second|two|later|next) backward(?:s| pass(?:es)?| calls?)?\b[^.]{0,40}\bwithout\b[^.]{0,30}\b(?:retain\w*|detach\w*)|\breus\w* (?:the )?(?:state|hidden\w*|variables?|tensors?)\b[^.]{0,40}\b(?:subsequent|second|next|later|multiple) backward",
            0.5,
            "a report in words: state reused across backward passes without detaching it (or retaining the graph)",
            family=True,
        ),
        Sign(
            "context",
            r"\b(?:init_hidden|repackage_hidden|detach_hidden|reset_hidden|h_state|hidden_state|self\.hidden|self\.hx)\b|\bhidden *=",
            0.4,
            "a hidden state kept from one batch to the next (init_hidden, repackage_hidden, self.hidden)",
        ),
        Sign(
            "context",
            r"\b(?:truncated (?:BPTT|backprop\w*)|[Tt]?BPTT)\b|hidden states? (?:for|of) all|resets? (?:the )?hidden",
            0.4,
            "truncated backpropagation through time, or a recurrent state reset between batches",
        ),
        Sign(
            "context",
            r"\bnn\.(?:LSTM|GRU|RNN)\b|\b(?:LSTM|GRU|RNN)(?:Cell)?\(|\b_LSTM\b",
            0.3,
            "a recurrent layer, whose returned state is what gets carried into the next batch",
        ),
        Sign(
            "context",
            r"retain_graph=True.{0,40}(?:OOM|out of memory|more memory|memory blow)|(?:OOM|out of memory|more memory).{0,40}retain_graph",
            0.3,
            "retain_graph=True made memory grow: every step's graph was kept, as a state carried across steps keeps it",
        ),
        Sign(
            "context",
            r"cases/backward_twice\.py",
            0.3,
            "this harness's own reproduction in the frames (a reproduce record pasted back): its traceback shows only `loss.backward()`, as a user's does",
        ),
        Sign(
            "against",
            r"\b(?:netD|netG|[Dd]iscriminator|backward_[DG]|loss_[DG]|[DGdg]_loss|optimizer_?[DG]|opt_?[DG])\b",
            0,
            "a GAN's generator and discriminator steps: a second backward through G's output, not a carried hidden state",
        ),
    ),
)

compiled_unit = (
    "the RNN module, `torch.compile(rnn)`, as a user compiles a model; the loss's backward and Adam's step run around it. "
    "Not the step whole: its loop state (window index, hidden state) changes every call and backward() breaks the graph"
)
compiles_itself = True  # make_inputs compiles the RNN with cfg.compile's backend
carries_state = True  # each call trains the loop's next windows on the Loop it is given


class RNN(nn.Module):
    """403_RNN_regressor.py's model: the RNN, then one Linear per time step, stacked."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.rnn = nn.RNN(input_size=input_size, hidden_size=hidden_size, num_layers=1, batch_first=True)
        self.out = nn.Linear(hidden_size, 1)

    def forward(self, x, h_state):
        r_out, h_state = self.rnn(x, h_state)  # (batch, time_step, hidden_size), (1, batch, hidden_size)
        outs = [self.out(r_out[:, time_step, :]) for time_step in range(r_out.size(1))]
        return torch.stack(outs, dim=1), h_state


@dataclass(eq=False)
class Loop:
    """The training loop's state between windows (module globals in 403_RNN_regressor.py), carried from call to call."""

    model: nn.Module  # RNN, compiled where the run compiles
    optimizer: torch.optim.Adam
    lr: float
    time_step: int  # points per window
    windows_per_call: int
    device: str
    h_state: torch.Tensor | None = None  # (1, 1, hidden_size); None before the first window, as upstream
    window: int = 0  # the next window's index, `step` upstream
    adam_on_data: dict = field(default_factory=dict)  # torch 0.4's Adam state, for retain_graph_on_torch_0_4


def make_inputs(cfg, device):
    torch.manual_seed(cfg.seed)  # nn.RNN's and nn.Linear's default init draw from the global generator
    model = RNN(cfg.sizes.input_size, cfg.sizes.hidden).to(device)
    return Loop(
        model=compile_axis.compiled(model, cfg),
        optimizer=torch.optim.Adam(model.parameters(), lr=cfg.lr),
        lr=cfg.lr,
        time_step=cfg.sizes.time_step,
        windows_per_call=cfg.windows_per_call,
        device=device,
    )


def next_window(x):
    """The loop's next (sin, cos) window, shaped (batch 1, time_step, input_size 1), as upstream builds it."""
    start, end = x.window * np.pi, (x.window + 1) * np.pi
    steps = np.linspace(start, end, x.time_step, dtype=np.float32)
    x.window += 1
    as_batch = lambda values: torch.from_numpy(values[np.newaxis, :, np.newaxis]).to(x.device)  # noqa: E731
    return as_batch(np.sin(steps)), as_batch(np.cos(steps))


def trained(x, predictions):
    """What the call leaves: each window's prediction, the carried hidden state, the parameters after the last step."""
    return tuple(p.detach() for p in predictions) + (x.h_state.detach().clone(),) + tuple(p.detach().clone() for p in x.model.parameters())


def buggy(x):
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, x.h_state = x.model(inputs, x.h_state)  # carried on with its graph
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


def fixed(x):
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, h_state = x.model(inputs, x.h_state)
        x.h_state = h_state.detach()  # the value carries to the next window, its graph does not
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


def reference(x):
    """The same windows from the same state, written out in float64: the Elman recurrence h_t = tanh(W_ih x_t + b_ih +
    W_hh h_t-1 + b_hh), the Linear, the mean squared error, gradients by autograd within the window only, and Adam's
    update by its formula (m / (sqrt(v / (1 - beta2^t)) + eps) * lr / (1 - beta1^t)), continuing the optimizer's state.
    Leaves `x` as it found it."""
    module = getattr(x.model, "_orig_mod", x.model)  # under a compiled run, the module torch.compile wraps
    rnn, out = module.rnn, module.out
    params = [rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0, out.weight, out.bias]
    order = {id(p): index for index, p in enumerate(module.parameters())}
    weights = [p.detach().double() for p in params]
    beta1, beta2 = x.optimizer.defaults["betas"]
    eps = x.optimizer.defaults["eps"]
    state = [x.optimizer.state.get(p, {}) for p in params]
    m = [s["exp_avg"].double() if s else torch.zeros_like(w) for s, w in zip(state, weights)]
    v = [s["exp_avg_sq"].double() if s else torch.zeros_like(w) for s, w in zip(state, weights)]
    t = int(state[0]["step"]) if state[0] else 0
    h = (
        x.h_state.detach().double().reshape(-1)
        if x.h_state is not None
        else torch.zeros(rnn.hidden_size, dtype=torch.float64, device=x.device)
    )
    predictions = []
    for window in range(x.window, x.window + x.windows_per_call):
        steps = np.linspace(window * np.pi, (window + 1) * np.pi, x.time_step, dtype=np.float32)
        sin, cos = (torch.from_numpy(values).to(x.device).double() for values in (np.sin(steps), np.cos(steps)))
        w = [weight.clone().requires_grad_() for weight in weights]
        w_ih, w_hh, b_ih, b_hh, w_out, b_out = w
        hidden, outputs = h, []
        for value in sin:
            hidden = torch.tanh(w_ih[:, 0] * value + b_ih + w_hh @ hidden + b_hh)
            outputs.append(w_out[0] @ hidden + b_out[0])
        prediction = torch.stack(outputs)
        loss = ((prediction - cos) ** 2).mean()
        grads = torch.autograd.grad(loss, w)
        h = hidden.detach()
        t += 1
        for index, g in enumerate(grads):
            m[index] = beta1 * m[index] + (1 - beta1) * g
            v[index] = beta2 * v[index] + (1 - beta2) * g * g
            denom = (v[index] / (1 - beta2**t)).sqrt() + eps
            weights[index] = weights[index] - x.lr / (1 - beta1**t) * m[index] / denom
        predictions.append(prediction.detach().reshape(1, x.time_step, 1))
    in_module_order = sorted(range(len(params)), key=lambda index: order[id(params[index])])
    return (
        tuple(p.float() for p in predictions) + (h.reshape(1, 1, -1).float(),) + tuple(weights[index].float() for index in in_module_order)
    )


def speed_baseline(x):
    """The tutorial's own line, `h_state = h_state.data`: the same cut, through the attribute torch 0.4 deprecated."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, h_state = x.model(inputs, x.h_state)
        x.h_state = h_state.data
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


# -- bad fixes: plausible, from the threads, each wrong ---------------------------------------


def retain_graph(x):
    """The `loss.backward(retain_graph=True)` of https://github.com/MorvanZhou/PyTorch-Tutorial/issues/57, with
    torch's Adam: the second window's backward reaches the first window's graph, whose saved weights Adam's step has
    since changed in place."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, x.h_state = x.model(inputs, x.h_state)
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward(retain_graph=True)
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


def fresh_hidden_state_each_window(x):
    """`h_state = None` for every window, as proposed for the same tutorial file in
    https://github.com/MorvanZhou/PyTorch-Tutorial/issues/49 ("the line `h_state = None` should do the trick"): nothing
    to backward into, and nothing carried either."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, x.h_state = x.model(inputs, None)
        loss = nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return trained(x, predictions)


bad_fixes = {
    "retain_graph": retain_graph,
    "fresh_hidden_state_each_window": fresh_hidden_state_each_window,
}


# -- memory fixes: they run, and keep every window's graph ------------------------------------


def adam_step_on_data(x, betas=(0.9, 0.999), eps=1e-8):
    """torch 0.4's Adam.step(), line for line: it wrote `p.data`, which autograd's version counter does not see."""
    for p in x.model.parameters():
        state = x.adam_on_data.setdefault(p, {"step": 0, "exp_avg": torch.zeros_like(p.data), "exp_avg_sq": torch.zeros_like(p.data)})
        state["step"] += 1
        state["exp_avg"].mul_(betas[0]).add_(p.grad.data, alpha=1 - betas[0])
        state["exp_avg_sq"].mul_(betas[1]).addcmul_(p.grad.data, p.grad.data, value=1 - betas[1])
        denom = state["exp_avg_sq"].sqrt().add_(eps)
        step_size = x.lr * math.sqrt(1 - betas[1] ** state["step"]) / (1 - betas[0] ** state["step"])
        p.data.addcdiv_(state["exp_avg"], denom, value=-step_size)


def retain_graph_on_torch_0_4(x):
    """What the thread's `retain_graph=True` did on its torch: it ran, and every window's graph stayed alive, linked
    through the carried hidden state; each backward walks all of them back to the first window."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = next_window(x)
        prediction, x.h_state = x.model(inputs, x.h_state)
        loss = nn.functional.mse_loss(prediction, target)
        x.model.zero_grad()
        loss.backward(retain_graph=True)
        adam_step_on_data(x)
        predictions.append(prediction.detach())
    return trained(x, predictions)


memory_fixes = {"retain_graph_on_torch_0_4": retain_graph_on_torch_0_4}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def anomaly_detection_left_on(x):
    """The fix, with the anomaly detection people turn on to find which backward failed still on."""
    with torch.autograd.detect_anomaly(check_nan=True):
        return fixed(x)


slow_fixes = {"anomaly_detection_left_on": anomaly_detection_left_on}
