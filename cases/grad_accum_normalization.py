"""Gradient accumulation averages each micro-batch's token loss, then divides by the steps: not the effective batch's mean.

Upstream: https://github.com/huggingface/transformers/pull/34191 ("Fix Gradient Accumulation issue", muellerzr,
    merged October 2024, transformers 4.46; finished by https://github.com/huggingface/transformers/pull/34283, "Fully
    fixes #34263 / finishes #34191 & #34198"), after the finding the maintainers' blog post (huggingface/blog PR
    #2414) states: "Gradient accumulation is *supposed* to be mathematically equivalent to full batch training;
    however, losses did not match between training runs where the setting was toggled on and off". In the PR
    thread danielhanchen (2024-10-17): with sequences packed to blocks of 128 the runs with and without the fix
    "should nearly be equivalent", "But unfortunately if we don't pad it and use varying sequence lengths, the loss
    for `bsz = 1, ga = 32` actually seems to go haywire" against `bsz = 32, ga = 1`; muellerzr: "Can also confirm".
    Before it, the Trainer took the model's loss (a causal LM's CrossEntropyLoss, mean over the micro-batch's
    labels that are not -100) and accelerate's `backward` divided it by `gradient_accumulation_steps`; after it, the
    Trainer counts `num_items_in_batch = sum([(batch["labels"].ne(-100)).sum() for batch in batch_samples])` over the
    whole accumulation window before the first forward, the model's loss is `cross_entropy(..., reduction="sum") /
    num_items_in_batch`, and nothing divides by the steps. The same fix in torchtune,
    https://github.com/meta-pytorch/torchtune/pull/1875 (ebsmothers, 2024-10-20, "In honor of the day the ML community
    first discovered the fact that (x1 / n1) + (x2 / n2) != (x1 + x2) / (n1 + n2)"): "This way we'll get an exact
    match in loss curves with and without gradient accumulation", a running tally of unmasked tokens, each batch's
    mean loss multiplied back by its token count, divided by the window's total. A follow-up that went wrong:
    https://github.com/hiyouga/LlamaFactory/issues/7443 (llamafactory 0.9.2, transformers 4.49.0, torch 2.5.1+cu124,
    NVIDIA GPUs, LLaVA-1.5 at a total batch of 128): "We observed a positive correlation between the gradient
    accumulation steps and loss values": initial loss 6.4 at accumulation 2, 13.65 at 4, 69 at 16, 138 at 32: the
    Trainer no longer divides by the steps, and a model that does not take `num_items_in_batch` still returns its
    own micro-batch's mean (the first bad fix below).

Fidelity: faithful in the arithmetic that fails: a causal LM's loss as transformers computes it (labels padded with
    -100 on the right and shifted by one, `F.cross_entropy(..., ignore_index=-100)`, float32 logits), padding with
    -100 labels, the prompt's labels set to -100 as supervised fine-tuning does (LlamaFactory's SFT data), a micro-batch
    loop of `per_device_train_batch_size` sequences over `gradient_accumulation_steps` micro-batches with a backward
    after each (the Trainer's), the two normalisations as the Trainer applied them before and after #34191.
    Synthetic: the model, a tiny causal LM standing in for Llama/LLaVA (an embedding, a causal prefix-mean mixing
    layer with tanh, an untied LM head; 64-token vocabulary, hidden 32), the token ids, prompt and response lengths
    (seeded draws, response lengths from 1 to 26 tokens as varying SFT answers, every sequence padded to 32), the
    sizes (micro-batch 4 x accumulation 4 = 16 sequences; the threads run 1 x 32 against 32 x 1, #34191, and 16 x 2 to 1 x 32, #7443), no optimizer step
    (the accumulated gradients are what the step would use) and no distributed ranks. The output is what one
    accumulation window leaves: the loss the Trainer logs for it and every parameter's gradient.

Symptom on CUDA: the same numbers, as arithmetic, nothing device-specific (not run here: no GPU in this task). The
    threads are all on GPUs and print nothing but the losses; #7443's table, as the reporter posted it:
        | GPU | per device bs | gradient acc | Initial loss | 100-step loss |
        | 4   | 16            | 2            | 6.4          | 1.8           |
        | 4   | 8             | 4            | 13.65        | 3.6           |
        | 4   | 1             | 32           | 138          | 33.13         |
        | 8   | 1             | 16           | 69           | 16.5          |

Symptom on CPU: nothing raises and nothing is printed (torch 2.13.0, run here). On the yaml's window (16 sequences of
    2 to 23 trained tokens, 4 micro-batches of 4 holding 55, 62, 65 and 32 of them) every gradient is off by 27-29% of
    its norm (embedding 27.8%, mixing weight 29.2%, its bias 27.0%, LM head 27.6%): the micro-batch of 32 tokens weighs
    1.67x per token, the others 0.82-0.97x. The same 16 sequences split otherwise, at the same effective batch: 16 x 1
    exact, 8 x 2 8-9% off, 4 x 4 27-29%, 2 x 8 42-57%, 1 x 16 71-96% (tests/test_grad_accum_normalization.py); on
    other seeds 4 x 4 is 11-56% off. The logged loss moves too, but little at initialisation, where every token's loss
    is near log 64: 4.3115 for 4.3132 (4 x 4), 4.3212 at 1 x 16; the threads see it diverge over training. Compiled
    (inductor, torch 2.13.0): the same wrong numbers. Other releases: plain arithmetic, expected the same on every torch.

Cause: the mean of means is not the mean: (x1 / n1 + x2 / n2) / 2 != (x1 + x2) / (n1 + n2) unless every micro-batch
    holds as many trained tokens. Each micro-batch's cross entropy is averaged over its own non-padding tokens, then
    divided by the number of accumulation steps, so every micro-batch weighs the same whatever its token count, and a
    token in a micro-batch of short answers weighs more than one in a micro-batch of long ones. With one micro-batch
    per step (no accumulation) the mean is over the whole batch and right: the result depends on how the same
    sequences are split.

Fix: transformers #34191's: before the window's first forward, count the labels that are not -100 over all its
    micro-batches (`num_items_in_batch`); each micro-batch's loss is its summed token cross entropy divided by that
    count, and nothing is divided by the steps. The gradients add up to the gradient of the window's token mean, the
    full batch's. Also correct (the alternative in tests/fixes/alternatives/): torchtune's, each micro-batch's mean
    loss multiplied back by its own token count, the gradients scaled by one over the window's total at the step
    (torchtune #1917's `scale_grads`). The reference is independent of both: the 16 sequences in one batch, the
    model's forward written out in float64, the token losses summed by hand (log-softmax and gather) over the
    shifted labels that are not -100 and divided by their number, one `torch.autograd.grad`; `correct` compares every
    parameter's gradient and the logged loss. Wrong ones, each rejected (figures in the test file and on the page):
    each micro-batch's own mean with nothing divided by the steps (what #7443's setup does: its loss grew with the
    accumulation steps; the same proposal in https://github.com/huggingface/transformers/issues/35203, "should use num
    items in micro-batch instead of num items in batch"): exactly `steps` (4) x the buggy gradients, 3.1-3.3x their
    norm away from the reference's, and the logged loss 4x (17.25 for 4.31), as #7443's table grows with the steps; `num_items_in_batch` divided by the steps (https://github.com/huggingface/transformers/pull/35210,
    "`num_items_in_batch` should divided by `gradient_accumulation_steps`", closed unmerged): the weighting right, every
    gradient exactly `steps` x the reference's (3.0x its norm away), the loss 4x; and a mean per sequence averaged over the sequences (a generic attempt, not
    from the threads): every sequence weighs the same, short answers more than ever: 71-96% off (what the buggy code gives at 1 x 16). Its cost: the same forwards and
    backwards as the buggy loop and one sum over the window's labels: against the buggy loop 1.017x [0.945, 1.094]
    and 1.025x [1.000, 1.051] eager, 0.970x [0.850, 1.105] and 0.977x [0.860, 1.111] compiled (torch 2.13.0, this
    loaded 2-core CPU, one thread; budget 1.15). The slow control, correct: each sequence through the model alone (a
    batch of 1, the count as the fix's), 16 forwards and backwards for 4: 2.918x [1.694, 5.028] and 2.960x [2.866,
    3.057] eager, 2.627x [2.308, 2.990] and 3.445x [3.344, 3.550] compiled. Counting the tokens with a host sync per
    micro-batch (`.item()`) is no control on a CPU, where a sync costs nothing.

Compiled: the harness compiles the whole window's function (its forwards, losses and backwards); dynamo breaks the
    graph at each `backward` and compiles the forward and the loss. Every sequence is padded to one length, so the
    micro-batches share one shape and nothing recompiles.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from harness.cases import WrongResult
from harness.measure.compare import training_outputs
from harness.triage import Sign, TriageSigns

IGNORE_INDEX = -100  # transformers' and torch's ignore_index: padding and prompt tokens carry no loss

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: the gradients are off, and the logged loss

# A silent failure: what users post is prose and loss numbers. The signs are their words for it: the loss (or the
# gradient norm) moves with the accumulation steps at a fixed effective batch, accumulation not matching the full
# batch, the mean of per-micro-batch means. Not a loss that is merely high, nor accumulation's other complaints
# (no_sync in DDP, fp16 accumulation in FSDP-1, BatchNorm statistics).
triage_signs = TriageSigns(
    family="a loss normalised per micro-batch under gradient accumulation",
    cause="each micro-batch's loss averaged over its own tokens, then divided by the accumulation steps: not the mean over the effective batch's tokens",
    confirm="the loss is a mean per micro-batch (reduction='mean' over its non-padding tokens) and micro-batches hold different token counts; the loss or gradient changes with gradient_accumulation_steps at the same effective batch",
    also="a sum loss never divided, a divide by the steps left out, or per-sequence means over sequences of different lengths",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:weighted|weighs?|averag\w*|normali[sz]\w*|mean)\b[^\n]{0,30}\bby (?:each )?(?:micro-?batch|batch|pack|step)\w*\b[^\n]{0,30}\binstead of (?:by )?(?:the )?(?:target |total )?tokens?\b|\b(?:1|one|few)-token (?:micro-?batch|batch|sequence|example)\w*\b[^\n]{0,80}\bas much\b",
            0.5,
            "a report in words: losses averaged per micro-batch where the tokens should weigh",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\bdifferent micro[- ]?batch(?:es| sizes?)\b[^.?!]{0,40}\b(?:different|changes?|differ)\b[^.?!]{0,20}\b(?:gradients?|loss(?:es)?)\b|\bmicro[- ]?batch\w*\b[^.?!]{0,40}\b(?:uneven|different|varying) (?:numbers? of |counts? of )?tokens\b[^.?!]{0,80}\b(?:weigh\w*|count\w*)\b[^.?!]{0,40}\b(?:more|less)\b",
            0.45,
            "micro-batch sizes or their token counts that change the gradient at the same global batch",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:loss|gradients?|grad(?:ient)?[_ ]norm)\w*\b.{0,80}\b(?:scaled?|scales|increases?|grows?|changes?|differs?|different|depends?|varies|inconsistent|proportional|moves?|goes up|jumps?|gets? (?:larger|bigger|higher))\b.{0,60}\b(?:gradient[_ ]accumulation\w*|grad[_ ]acc\w*|accumulation[_ ]steps?|GA)\b",
            0.45,
            "the loss or the gradient moves with the accumulation steps",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:gradient[_ ]accumulation\w*|grad[_ ]acc\w*|accumulation[_ ]steps?|GA)\b.{0,80}\b(?:loss|gradients?|grad(?:ient)?[_ ]norm)\w*\b.{0,40}\b(?:scaled?|scales|increases?|grows?|changes?|differs?|different|inconsistent|proportional|goes up|jumps?|higher|larger|haywire|not (?:the )?same|does ?n[o']t match|mismatch)",
            0.45,
            "with more accumulation steps the loss or the gradient changes",
        ),
        Sign(
            "failure",
            r"(?i)(?:not|n't|never|supposed to be) (?:\w+ ){0,3}(?:equivalent|equal|the same|match\w*)\b.{0,60}\b(?:full|larger|bigger|same|effective|equivalent|combined) batch|\b(?:full|effective|equivalent) batch.{0,60}\b(?:not|n't) (?:\w+ ){0,2}(?:equivalent|equal|the same|match)|\b(?:worse|different) (?:results? )?than (?:the )?(?:equivalent|same|full|larger) batch",
            0.4,
            "accumulation does not give what the full (effective) batch gives",
        ),
        Sign(
            "failure",
            r"(?i)\(x1 / n1\) \+ \(x2 / n2\) != \(x1 \+ x2\) / \(n1 \+ n2\)|\bmean of (?:the )?(?:per[- ]\w+ )?means\b|short(?:er)? (?:sequences|samples|examples|answers) (?:weigh|get|have|count)|(?:averag|divid|normaliz|normalis)\w* (?:\w+ ){0,4}by (?:the )?(?:number of )?(?:gradient accumulation|accumulation|grad accum) steps.{0,80}\b(?:tokens?|padding|wrong|incorrect)|(?:averag|divid|normaliz|normalis)\w* (?:\w+ ){0,3}(?:each|every|per) (?:gradient accumulation|accumulation|micro-?batch|mini-?batch) step.{0,40}\b(?:wrong|incorrect|biased)|(?:normaliz|normalis|divid)\w*\b.{0,80}number of tokens? (?:of|in) (?:each|the|a) (?:mini|micro)-?batch",
            0.4,
            "the loss is normalised per micro-batch and by the steps, not by the window's tokens",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:grad(?:ient)?s?[_ ]?accum\w*|accumulation[_ ]steps?|micro[- ]?batch\w*)",
            0.5,
            "a report in words: the loss or its gradients averaged wrongly across gradient-accumulation micro-batches",
            family=True,
            near=(
                r"(?i)\b(?:divid\w*|normali[sz]\w*|averag\w*|means?|weigh\w*|scal(?:e|es|ed|ing))\b",
                r"(?i)\b(?:incorrect\w*|wrong\w*|without dividing|nothing divides|not divid\w*|linearly|proportional\w*|biased|instead of|different numbers? of (?:valid )?tokens|naive(?:ly)?|assum\w* (?:that )?(?:all )?(?:the )?(?:sequences|samples|batches|examples) (?:are|have) (?:the )?same (?:size|length))\b",
            ),
        ),
        Sign(
            "context",
            r"(?i)gradient[_ ]accumulation(?:_steps)?|grad[_ ]accum\w*|accumulation[_ ]steps?|\bga ?= ?\d+",
            0.35,
            "gradient accumulation in play",
        ),
        Sign(
            "context",
            r"(?i)num_items_in_batch|model_accepts_loss_kwargs|loss_kwargs|non[- ]?padd(?:ed|ing) tokens|-100\b|ignore_index|token[- ]level|per[- ]token|tokens? count|number of tokens|\d+ tokens\b|reduction ?= ?.sum",
            0.3,
            "token-level normalisation: the count of trained tokens, labels of -100",
        ),
        Sign(
            "support",
            r"(?i)per_device_train_batch_size|\bbsz? ?= ?\d+|batch size|micro[- ]?batch",
            0.1,
            "the micro-batch size against which the accumulation is set",
        ),
        Sign(
            "veto",
            r"(?i)\bno_sync\b|FSDP-?1 only allows accumulation|accumulat\w* in (?:16-bit|bf16|fp16|half)|BatchNorm|running (?:mean|var)|Attempting to unscale|not unscaled|MixedPrecision Callback|to_fp16\(",
            0,
            "another accumulation problem: DDP's gradient sync, accumulation in 16-bit precision, BatchNorm statistics per micro-batch, or the AMP loss scale",
        ),
    ),
)

compiled_unit = (
    "the accumulation window as a user compiles a training step: each micro-batch's forward and loss (dynamo breaks the "
    "graph at each backward and compiles the rest); the model is the causal LM, the loss its cross entropy"
)


class TinyCausalLM(nn.Module):
    """The synthetic stand-in for a causal LM: an embedding, a causal mixing layer (each position sees the mean of its
    prefix), tanh and a residual, and an untied LM head, logits (B, T, vocab)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)  # (B, T, H)
        positions = torch.arange(1, input_ids.shape[1] + 1, device=input_ids.device, dtype=h.dtype)
        prefix = h.cumsum(1) / positions[:, None]  # causal: position t sees tokens 0..t
        return self.lm_head(h + torch.tanh(self.mix(prefix)))  # (B, T, V)


class Inputs(NamedTuple):
    model: TinyCausalLM
    micro_batches: tuple  # ((input_ids (b, T) long, labels (b, T) long with -100 on prompt and padding), ...): one window
    steps: int  # gradient_accumulation_steps


def sequence_lengths(cfg, generator):
    """Each sequence's prompt and response lengths, drawn from the seed: prompts of 2 to 5 tokens, responses of 1 to
    `seq_len - 6` (short and long answers in every window)."""
    n = cfg.sizes.micro_batch * cfg.sizes.steps
    prompts = torch.randint(2, 6, (n,), generator=generator)
    responses = torch.randint(1, cfg.sizes.seq_len - 5, (n,), generator=generator)
    return prompts, responses


def make_inputs(cfg, device):
    sizes = cfg.sizes
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # nn.Linear's and nn.Embedding's default init draw from the global generator
    model = TinyCausalLM(sizes.vocab, sizes.hidden)
    prompts, responses = sequence_lengths(cfg, generator)
    n = len(prompts)
    input_ids = torch.full((n, sizes.seq_len), cfg.pad_token_id, dtype=torch.long)
    labels = torch.full((n, sizes.seq_len), IGNORE_INDEX, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        tokens = torch.randint(1, sizes.vocab, (p + r,), generator=generator)  # 0 is the pad token
        input_ids[i, : p + r] = tokens
        labels[i, p : p + r] = tokens[p:]  # the response is trained on; the prompt and the padding are -100
    micro = tuple(zip(input_ids.split(sizes.micro_batch), labels.split(sizes.micro_batch)))
    return Inputs(
        model=model.to(device),
        micro_batches=tuple((ids.to(device), lab.to(device)) for ids, lab in micro),
        steps=sizes.steps,
    )


def causal_lm_loss(logits, labels, num_items_in_batch=None):
    """transformers' ForCausalLMLoss (>= 4.46): float32 logits, labels padded with -100 on the right and shifted by one,
    `fixed_cross_entropy`: the mean over the labels that are not -100, or their sum over `num_items_in_batch`. Before
    4.46 the model computed the same mean (shift_logits against shift_labels, CrossEntropyLoss())."""
    logits = logits.float()
    shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    logits, shift_labels = logits.reshape(-1, logits.shape[-1]), shift_labels.reshape(-1)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, shift_labels, ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="sum") / num_items_in_batch


def accumulate(x, micro_loss):
    """The Trainer's accumulation window: for each micro-batch a forward, its loss as `micro_loss(logits, labels)`
    says, a backward; the gradients add up across the window. Returns the logged loss (the sum of the losses
    backpropagated, as the Trainer's tr_loss adds them) and every parameter's gradient."""
    x.model.zero_grad(set_to_none=True)
    logged = 0.0
    for input_ids, labels in x.micro_batches:
        loss = micro_loss(x.model(input_ids), labels)
        loss.backward()
        logged = logged + loss.detach()
    return training_outputs(x.model, logged)


def buggy(x):
    """transformers < 4.46: the model's mean over its own micro-batch, divided by the steps (accelerate's backward)."""
    return accumulate(x, lambda logits, labels: causal_lm_loss(logits, labels) / x.steps)


def num_items_in_batch(x):
    """The Trainer's count (>= 4.46), before the window's first forward: every label that is not -100 in the window."""
    return sum((labels.ne(IGNORE_INDEX)).sum() for _, labels in x.micro_batches)


def fixed(x):
    """transformers #34191: the window's token count first; each micro-batch's summed loss over it; no division by the
    steps. Every prompt starts with a label of -100, so counting the unshifted labels counts the shifted ones."""
    count = num_items_in_batch(x)
    return accumulate(x, lambda logits, labels: causal_lm_loss(logits, labels, num_items_in_batch=count))


def reference(x):
    """The window's 16 sequences as one batch, in float64, the forward written out and the token losses summed by hand
    over the shifted labels that are not -100, over their number; one autograd.grad for every parameter."""
    params = {name: p.detach().double().requires_grad_() for name, p in x.model.named_parameters()}
    input_ids = torch.cat([ids for ids, _ in x.micro_batches])
    labels = torch.cat([lab for _, lab in x.micro_batches])
    h = params["embed_tokens.weight"][input_ids]  # (N, T, H)
    prefix = h.cumsum(1) / torch.arange(1, h.shape[1] + 1, dtype=h.dtype, device=h.device)[:, None]
    hidden = h + torch.tanh(prefix @ params["mix.weight"].T + params["mix.bias"])
    logits = hidden[:, :-1] @ params["lm_head.weight"].T  # position t predicts token t + 1
    targets = labels[:, 1:]
    trained = targets != IGNORE_INDEX
    log_probs = logits - logits.logsumexp(-1, keepdim=True)
    token_loss = -log_probs.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    loss = token_loss[trained].sum() / trained.sum()
    grads = torch.autograd.grad(loss, list(params.values()))
    return {"loss": loss.detach().float(), "grad": {name: g.float() for name, g in zip(params, grads)}}


def speed_baseline(x):
    """The buggy window: the same forwards and backwards, normalised per micro-batch (what the fix's cost is against)."""
    return buggy(x)


# -- bad fixes: plausible, each wrong ---------------------------------------------------------


def own_token_mean_without_steps(x):
    """Each micro-batch's own mean, nothing divided by the steps: a Trainer that no longer divides (it counted
    `num_items_in_batch`) with a model that does not take the count, as in https://github.com/hiyouga/LlamaFactory/issues/7443
    (the loss grew with the accumulation steps); the per-micro-batch count proposed in
    https://github.com/huggingface/transformers/issues/35203."""
    return accumulate(x, lambda logits, labels: causal_lm_loss(logits, labels))


def count_divided_by_steps(x):
    """`num_items_in_batch` divided by the steps, as https://github.com/huggingface/transformers/pull/35210 proposed
    (closed unmerged): the weighting right, every gradient `steps` times too large."""
    count = num_items_in_batch(x) / x.steps
    return accumulate(x, lambda logits, labels: causal_lm_loss(logits, labels, num_items_in_batch=count))


def mean_per_sequence(x):
    """Each sequence's own token mean, averaged over the window's sequences (a generic attempt, not from the cited
    threads): every answer weighs the same whatever its length."""
    sequences = sum(len(labels) for _, labels in x.micro_batches)

    def micro_loss(logits, labels):
        shift = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
        token = F.cross_entropy(logits.float().transpose(1, 2), shift, ignore_index=IGNORE_INDEX, reduction="none")  # (b, T)
        per_sequence = token.sum(1) / shift.ne(IGNORE_INDEX).sum(1)
        return per_sequence.sum() / sequences

    return accumulate(x, micro_loss)


bad_fixes = {
    "own_token_mean_without_steps": own_token_mean_without_steps,
    "count_divided_by_steps": count_divided_by_steps,
    "mean_per_sequence": mean_per_sequence,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def one_sequence_at_a_time(x):
    """Correct and careless: the window's count as the fix's, then each sequence through the model alone, a batch of
    1, its summed loss over the count and a backward each: 16 forwards and backwards for 4."""
    count = num_items_in_batch(x)
    x.model.zero_grad(set_to_none=True)
    logged = 0.0
    for input_ids, labels in x.micro_batches:
        for ids, lab in zip(input_ids.split(1), labels.split(1)):
            loss = causal_lm_loss(x.model(ids), lab, num_items_in_batch=count)
            loss.backward()
            logged = logged + loss.detach()
    return training_outputs(x.model, logged)


slow_fixes = {"one_sequence_at_a_time": one_sequence_at_a_time}
