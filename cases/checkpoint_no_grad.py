"""LoRA adapters inside reentrant-checkpointed layers get no gradient: a RoBERTa classifier trains only its head.

Upstream: https://github.com/huggingface/blog/issues/1824 (yao-matrix, 2024-02-19, on CPU): the blog post
    Lora-for-sequence-classification-with-Roberta-Llama-Mistral.md (huggingface/blog, PR #1595) fine-tunes
    roberta-large with PEFT's `LoraConfig(task_type=TaskType.SEQ_CLS, r=2, lora_alpha=16, lora_dropout=0.1,
    bias="none")` through a Trainer with `gradient_checkpointing=True`; "actually only classifier head is
    trained, LoRA weights will not be trained and keep as identity per initialization", and the checkpointed run
    was the faster one ("2 hr vs 6 hr in our CPU env"). The reporter's remedy, in that order: transformers upgraded to
    4.37.2 and two lines added to the blog's `get_lora_model`, `model.gradient_checkpointing_enable(
    gradient_checkpointing_kwargs={"use_reentrant": False})` BEFORE `model = get_peft_model(model, peft_config)`, the
    TrainingArguments left as they were; "LoRA weights will be trained". Why that works (source read, not said in the
    thread): wrapped while checkpointing is already on, `PeftModel.__init__` calls `enable_input_require_grads()`, a
    forward hook that makes the word embeddings' output require grad; the Trainer then enables checkpointing again with
    its own empty kwargs (reentrant), and the hook keeps the gradients flowing. The same silence, and the
    maintainer's diagnosis, in https://github.com/huggingface/transformers/issues/26221 ("Gradient checkpointing
    should have no functional impact", LoRA on a sequence classifier, closed as solved): pacman100 (2024-04-02)
    quotes the checkpoint docs,
    "At least one input and output must have requires_grad=True for the reentrant variant. If this condition is
    unmet, the checkpointed part of the model will not have gradients", and shows that the Trainer's own
    `gradient_checkpointing_enable` call replaced the user's `{"use_reentrant": False}` with the reentrant
    default. Why nothing makes the embedding output require grad here (source read): PEFT's `PeftModel.__init__`
    calls `enable_input_require_grads()` only `if getattr(model, "is_gradient_checkpointing", True)`, i.e. when
    checkpointing is already on when the model is wrapped (peft v0.5.0 to v0.20.0 and main); the Trainer turns it on
    afterwards; transformers' own call of it in `gradient_checkpointing_enable` (PR #25846) is only for adapters
    loaded with `add_adapter`. The Trainer passed `gradient_checkpointing_kwargs or {}` (until transformers PR
    #33208, 2024-08), so `checkpoint` got no `use_reentrant` and used torch's default, True.

Fidelity: faithful in the structure and the configuration that make the failure: a RoBERTa encoder
    (embeddings with RoBERTa's position ids from the padding mask, post-LayerNorm self-attention and GELU feed-forward
    layers, the `<s>` token's dense + tanh classification head) whose every weight is frozen, PEFT's LoRA (r=2,
    alpha=16, scaling alpha / r) on `query` and `value` of every layer (PEFT's default targets for roberta), the
    classifier trainable (SEQ_CLS puts it in `modules_to_save`), each layer run through
    `functools.partial(torch.utils.checkpoint.checkpoint, **kwargs)` as transformers' encoder does, kwargs `{}` as the
    Trainer passed them; the blog's `WeightedCELossTrainer` loss (cross entropy with class weights
    [0.8766697374481806, 1.1637114032405993]) on a batch of 8 padded tweets, attention mask from the padding.
    Synthetic: the sizes (hidden 128, 4 layers, 4 heads, feed-forward 512, a 1000-token vocabulary, 64 tokens;
    roberta-large has 1024, 24, 16, 4096, 50265), the token ids, lengths and labels, the weights (seeded, normal
    with std 0.02 as RoBERTa initialises; lora_B drawn too, where PEFT starts it at zero, so that every lora_A has a
    non-zero gradient to compare), dropout set to 0 (the blog's 0.1 would make the reference draw the same masks),
    and PEFT's wrapper classes written as plain modules. One training step's loss and every gradient is the case:
    the optimizer then skips each parameter whose gradient is None, so the adapters never move.

Symptom on CUDA: not run here (no GPU). The blog trained on A6000s; the check that warns is Python in
    torch/utils/checkpoint.py, before any kernel, so the same silence and warning are expected. A CUDA log of the
    pair, torch 2.1-2.2 wording (https://github.com/Victorwz/LLaVA-Llama-3/issues/4):
        UserWarning: torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly. The default value of use_reentrant will be updated to be False in the future. To maintain current behavior, pass use_reentrant=True. It is recommended that you use use_reentrant=False. Refer to docs for more details on the differences between the two variants.
        UserWarning: None of the inputs have requires_grad=True. Gradients will be None

Symptom on CPU: nothing raises; the step returns a loss and the classifier's gradients, and every LoRA gradient is
    None (16 of 20 trainable tensors here), with one warning per checkpointed layer (torch 2.13.0, run):
        UserWarning: torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly. Starting in PyTorch 2.9, calling checkpoint without use_reentrant will raise an exception. use_reentrant=False is recommended, but if you need to preserve the current default behavior, you can pass use_reentrant=True. Refer to docs for more details on the differences between the two variants.
        UserWarning: None of the inputs have requires_grad=True. Gradients will be None
    Per torch release (2.13.0 run; the rest from pytorch's source, PRs and users' logs, not run here): an unset
    `use_reentrant` means True in every release through 2.13.0, which still warns and still does not raise. The first
    warning is new in 2.1 (pytorch PR #100551, "for 2.1"), worded "please pass in use_reentrant=True or
    use_reentrant=False explicitly. The default value of use_reentrant will be updated to be False in the future. ...";
    2.3 rewords it "the use_reentrant parameter should be passed explicitly. In version 2.4 we will raise an exception if
    use_reentrant is not passed. ..." (2.3.0 release notes, PR #116710), and a 2.4 log still says "2.4"; v2.8.0 says
    "In version 2.5 ..." (pytorch issue #160534); PR #160643 (2025-08) made it "Starting in PyTorch 2.9, ...", the text
    2.13.0 prints. The release that first said "2.5" is not established. The second warning predates them all,
    unchanged in wording. transformers' own default passes `use_reentrant=True` explicitly since PR #28538 (2024-01):
    the first warning goes, the silence stays; since PR #43203 (2026-01) it passes False.

Cause: the reentrant checkpoint is an autograd.Function whose output requires grad only if one of its tensor
    inputs does; the parameters used inside do not count. The frozen embeddings give the first layer hidden states
    that need no grad, so every checkpointed layer's output needs none, the backward never enters the layers, and
    only the head after them, which is trainable, gets a gradient.

Fix: the maintainer's, pacman100 in transformers #26221 (2024-04-02): `TrainingArguments(gradient_checkpointing=True,
    gradient_checkpointing_kwargs={"use_reentrant": False})`: the non-reentrant checkpoint records the layer's
    ops in the outer graph (saved tensors are recomputed on use), so gradients reach parameters inside whatever the
    inputs. PEFT's and transformers' own alternative keeps the reentrant checkpoint and makes the embedding output
    require grad (`enable_input_require_grads()`, a forward hook on the word embeddings; the speed baseline). Blog
    #1824's own remedy is that alternative reached by the call order (checkpointing on before `get_peft_model`, whose
    `PeftModel.__init__` then installs the hook), not the non-reentrant checkpoint: the Trainer's later call makes it
    reentrant again. Graded as a correct submission in tests/fixes/upstream/checkpoint_no_grad.py (`reporter_order`,
    through `peft_model_init` below). Wrong ones: the same model call made AFTER the wrapping, while the Trainer
    still enables checkpointing (`use_reentrant_false_after_wrapping`): PEFT saw no checkpointing and installed no
    hook, and the Trainer's call replaces the kwargs (pacman100 in
    https://github.com/huggingface/transformers/issues/26221: "You were correctly setting
    model.gradient_checkpointing_enable(...) but the Trainer was resetting it"; the notebook's order relative to
    `get_peft_model` is not in what we could read of the thread; that the order after `get_peft_model` installs no
    hook is in https://github.com/huggingface/peft/pull/2398); still None. Training the embeddings instead of making
    their output require grad, as in https://github.com/huggingface/transformers/issues/23170 (the first parameter,
    the embedding, set to requires_grad=True: "it trains successfully"): the LoRA gradients come back, and a gradient
    for the frozen 1000 x 128 table appears where the reference has None (E5-V #19 shows the confusion of the two:
    https://github.com/kongds/E5-V/issues/19). `loss.requires_grad_()`, the answer to the sibling error `element 0
    of tensors does not require grad` in https://github.com/huggingface/trl/issues/801 ("add
    'losses.requires_grad_(True)' ... it works for me"): a no-op on a loss that already requires grad (still None); filtering the warning away, as a commenter offers in
    https://github.com/2U1/Qwen-VL-Series-Finetune/issues/56 (still None). Three of them leave the same 16 of 20
    trainable gradients None; unfreezing gets all 20 right and adds a 21st, the embedding table's. Dropping
    checkpointing is correct and the fastest, but keeps every layer's activations: it is a memory control, measured at
    12 layers (peak 38.2 MiB against the checkpointed baseline's 8.8, 4.3x; the fix 7.8 MiB; at the 4 layers of the
    other phases it was 2.0x, too near the 1.5x budget to prove anything), not a bad fix. Anomaly detection, the usual
    next step when gradients go missing, left on: correct, a slow control (3.7x). Speed, one thread, torch 2.13.0: the
    fix 1.07x [0.99, 1.15] of the hooked reentrant step; 1.6x the step without checkpointing (the recompute); the buggy
    step 0.30x the fix, since its backward never enters the layers: the blog's "2 hr vs 6 hr", checkpointing faster.

Compiled: under `torch.compile` (torch 2.13.0, run) the failure does not happen: dynamo traces
    `torch.utils.checkpoint.checkpoint` as its `tag_activation_checkpoint` higher-order op and sets
    `use_reentrant=False` itself (torch/_higher_order_ops/wrap.py: "use_reentrant is set to False because this op is
    going to be traced"), so the compiled buggy step returns every gradient, without either warning. The symptom
    says so (`modes=("off",)`): with compile=inductor the harness expects a clean run (reproduce clean_compiled), and
    what the failure's absence makes moot is recorded as such, not as a failure: three bad fixes right there
    (not_wrong_here: all but unfreezing), anomaly detection not slower (0.97x) and no checkpointing at a lower peak
    than the compiled baseline (34.5 against 49.8 MiB) (not_applicable).
"""

import functools
import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from harness.cases import WrongResult
from harness.measure.compare import training_outputs
from harness.triage import Sign, TriageSigns

NO_GRAD_WARNING = r"UserWarning: None of the inputs have requires_grad=True\. Gradients will be None"

symptoms = {
    "cpu": WrongResult(warning=NO_GRAD_WARNING, modes=("off",)),
    "cuda": WrongResult(warning=NO_GRAD_WARNING, modes=("off",)),
}  # compiled, dynamo traces the checkpoint non-reentrant: every gradient

# The reentrant checkpoint's own warning, placed by what makes it this failure: adapters (LoRA, PEFT) trained behind frozen
# embeddings, or checkpointing named around it. Alone it is also printed where nothing inside the block is trained (a frozen
# vision tower, a reference model's forward): too little to decide. An `element 0 of tensors does not require grad` after it
# is the same cause with nothing trainable after the blocks (the raising form); without it, that error names no case.
triage_signs = TriageSigns(
    family="a checkpointed block whose inputs do not require grad, so its parameters get no gradients",
    cause="reentrant gradient checkpointing over frozen embeddings while adapters (LoRA) inside the blocks are trained",
    confirm="the trainable parameters (adapters) sit inside checkpointed blocks whose input comes from a frozen layer; enable_input_require_grads() or use_reentrant=False fixes it",
    also="checkpointing at evaluation or under torch.no_grad(), where no gradient is wanted (then the warning is harmless)",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"None of the inputs have requires_grad=True\. Gradients will be None",
            0.45,
            "the reentrant checkpoint's check: no tensor input of a checkpointed block requires grad, so nothing inside it will get a gradient",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)^(?=.*checkpoint).*\blora\w*\b.*(?:(?:not|never) (?:be(?:ing)? )?(?:trained|updated|changed?)|gradients? (?:is|are|will be) '?none'?)|(?:prevents?|blocks?) lora (?:weight )?updates",
            0.45,
            "a user's words for the silence with checkpointing on: the LoRA weights never change, or their gradients are None",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\bcheckpoint\w*",
            0.45,
            "a report in words: the checkpointed block's weights never move (its input does not require grad)",
            near=(
                r"(?i)\b(?:gradients?|weights?|parameters?|params)\b[^.\n]{0,40}\b(?:stays?|remains?|stuck|(?:is|are) always)\b[^.\n]{0,10}\b(?:fix\w*|frozen|unchanged|zero|none)\b|\bfirst (?:block|layer)\b[^.\n]{0,40}\bcannot be checkpointed",
            ),
        ),
        Sign(
            "failure",
            r"element 0 of tensors does not require grad and does not have a grad_fn",
            0.3,
            "autograd found nothing to differentiate, beside a frozen model's adapters (LoRA, PEFT) or gradient checkpointing: the checkpointed blocks' inputs do not require grad",
            near=(r"(?i)\blora\b|\bpeft\b|gradient[_ ]checkpoint|use_reentrant|enable_input_require_grads",),
        ),
        Sign(
            "context",
            r"(?i)\b(?:lora|q?lora_[ab]|peft|get_peft_model|loraconfig|adapters?)\b|_with_peft\b",
            0.35,
            "adapters are trained behind frozen embeddings: the parameters inside the checkpointed blocks that lose their gradients",
        ),
        Sign(
            "context",
            r"(?i)gradient[_ ]checkpoint|use_reentrant",
            0.25,
            "gradient checkpointing in play (the reentrant variant when use_reentrant is not passed)",
        ),
        Sign(
            "support",
            r"(?i)enable_input_require_grads|make_inputs_require_grads?",
            0.2,
            "the hook that makes the embedding output require grad, the reentrant variant's remedy",
        ),
        Sign(
            "support",
            r"element 0 of tensors does not require grad and does not have a grad_fn",
            0.15,
            "after the warning: nothing trainable after the checkpointed blocks reached the loss either, so the backward raises",
        ),
        Sign(
            "veto",
            r"none of output has requires_grad=True, this checkpoint\(\) is not necessary",
            0,
            "the reentrant checkpoint's backward raised because none of a block's outputs requires grad: a raise in the backward, not the silent loss of the gradients inside",
        ),
    ),
)

compiled_unit = (
    "the training step as the Trainer runs it with `torch_compile=True`: the model's forward (the checkpointed layers "
    "inside it), the weighted loss and the backward; dynamo traces the checkpoint as a higher-order op with "
    "use_reentrant=False, so compiled the adapters get their gradients (see the docstring's Compiled)"
)


# -- the model: RoBERTa for sequence classification, frozen, with PEFT's LoRA on query and value --------------------


class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear with one adapter: base(x) + lora_B(lora_A(dropout(x))) * lora_alpha / r."""

    def __init__(self, base_layer: nn.Linear, r: int, lora_alpha: int, dropout: float):
        super().__init__()
        self.base_layer = base_layer
        self.lora_dropout = nn.Dropout(dropout)
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False)
        self.scaling = lora_alpha / r

    def forward(self, x):
        return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.head_size = heads, hidden // heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)

    def split(self, x):  # (B, T, C) -> (B, heads, T, C / heads)
        return x.view(*x.shape[:2], self.heads, self.head_size).transpose(1, 2)

    def forward(self, hidden_states, attention_mask):
        q, k, v = self.split(self.query(hidden_states)), self.split(self.key(hidden_states)), self.split(self.value(hidden_states))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + attention_mask  # (B, heads, T, T)
        context = self.dropout(scores.softmax(-1)) @ v
        return context.transpose(1, 2).reshape(hidden_states.shape)


class AddNorm(nn.Module):
    """RobertaSelfOutput / RobertaOutput: dense, dropout, LayerNorm over the residual."""

    def __init__(self, d_in, hidden, eps, dropout):
        super().__init__()
        self.dense, self.LayerNorm, self.dropout = nn.Linear(d_in, hidden), nn.LayerNorm(hidden, eps=eps), nn.Dropout(dropout)

    def forward(self, x, residual):
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = nn.ModuleDict(
            {"self": SelfAttention(c.hidden, c.heads, c.dropout), "output": AddNorm(c.hidden, c.hidden, c.eps, c.dropout)}
        )
        self.intermediate = nn.Linear(c.hidden, c.intermediate)
        self.output = AddNorm(c.intermediate, c.hidden, c.eps, c.dropout)

    def forward(self, hidden_states, attention_mask):
        attended = self.attention["output"](self.attention["self"](hidden_states, attention_mask), hidden_states)
        return self.output(F.gelu(self.intermediate(attended)), attended)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self._gradient_checkpointing_func = None  # transformers: set by gradient_checkpointing_enable, None when off

    def forward(self, hidden_states, attention_mask):
        for layer in self.layer:
            if self._gradient_checkpointing_func is not None and self.training:
                hidden_states = self._gradient_checkpointing_func(layer.__call__, hidden_states, attention_mask)
            else:
                hidden_states = layer(hidden_states, attention_mask)
        return hidden_states


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab, c.hidden, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.positions, c.hidden, padding_idx=c.pad_token_id)
        self.token_type_embeddings = nn.Embedding(1, c.hidden)
        self.LayerNorm, self.dropout = nn.LayerNorm(c.hidden, eps=c.eps), nn.Dropout(c.dropout)
        self.padding_idx = c.pad_token_id

    def forward(self, input_ids):
        mask = input_ids.ne(self.padding_idx).long()
        position_ids = torch.cumsum(mask, dim=1) * mask + self.padding_idx  # create_position_ids_from_input_ids
        embeddings = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(torch.zeros_like(input_ids))
            + self.position_embeddings(position_ids)
        )
        return self.dropout(self.LayerNorm(embeddings))


class RobertaLoraClassifier(nn.Module):
    """get_peft_model(RobertaForSequenceClassification, LoraConfig(task_type=SEQ_CLS, ...)), flattened."""

    def __init__(self, c):
        super().__init__()
        self.embeddings, self.encoder = Embeddings(c), Encoder(c)
        self.classifier = nn.ModuleDict({"dense": nn.Linear(c.hidden, c.hidden), "out_proj": nn.Linear(c.hidden, c.labels)})
        self.classifier_dropout = nn.Dropout(c.dropout)

    def forward(self, input_ids, attention_mask):
        hidden_states = self.embeddings(input_ids)
        extended = (1.0 - attention_mask[:, None, None, :].to(hidden_states.dtype)) * torch.finfo(hidden_states.dtype).min
        features = self.encoder(hidden_states, extended)[:, 0]  # the <s> token
        x = torch.tanh(self.classifier["dense"](self.classifier_dropout(features)))
        return self.classifier["out_proj"](self.classifier_dropout(x))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """transformers 4.35's PreTrainedModel.gradient_checkpointing_enable: kwargs go to checkpoint as given."""
        if gradient_checkpointing_kwargs is None:
            gradient_checkpointing_kwargs = {}
        self.encoder._gradient_checkpointing_func = functools.partial(checkpoint, **gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self):
        self.encoder._gradient_checkpointing_func = None

    @property
    def is_gradient_checkpointing(self):
        return self.encoder._gradient_checkpointing_func is not None

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def enable_input_require_grads(self):
        """transformers' PreTrainedModel.enable_input_require_grads: a forward hook, the embedding output requires grad."""
        self._require_grads_hook = self.get_input_embeddings().register_forward_hook(
            lambda module, args, output: output.requires_grad_(True)
        )

    def disable_input_require_grads(self):
        self._require_grads_hook.remove()


def peft_model_init(model):
    """The step of get_peft_model (PeftModel.__init__, peft v0.5.0 to v0.20.0) that depends on when it runs, after the
    adapters are injected: `if getattr(model, "is_gradient_checkpointing", True): model.enable_input_require_grads()`
    (via `_prepare_model_for_gradient_checkpointing`, for a model not quantized)."""
    if getattr(model, "is_gradient_checkpointing", True):
        model.enable_input_require_grads()


class Config(NamedTuple):
    vocab: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    positions: int
    labels: int
    pad_token_id: int
    eps: float
    dropout: float


class Inputs(NamedTuple):
    model: RobertaLoraClassifier  # frozen, LoRA on query/value, trainable classifier; in train mode, checkpointing off
    input_ids: torch.Tensor  # (B, T) long, <s> first, padded with pad_token_id to the batch's longest
    attention_mask: torch.Tensor  # (B, T) long, 0 on padding
    labels: torch.Tensor  # (B,) long in {0, 1}
    class_weights: torch.Tensor  # (2,): NEG_WEIGHT, POS_WEIGHT of the blog


def make_inputs(cfg, device):
    sizes = cfg.sizes
    c = Config(
        sizes.vocab,
        sizes.hidden,
        sizes.layers,
        sizes.heads,
        sizes.intermediate,
        sizes.positions,
        sizes.labels,
        cfg.pad_token_id,
        cfg.layer_norm_eps,
        0.0,
    )
    torch.manual_seed(cfg.seed)  # nn.Linear / nn.Embedding draw from the global generator
    model = RobertaLoraClassifier(c)
    for module in model.modules():  # RobertaPreTrainedModel._init_weights
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight.data[module.padding_idx].zero_()
    for layer in model.encoder.layer:  # get_peft_model: LoRA on PEFT's default targets for roberta
        attention = layer.attention["self"]
        attention.query, attention.value = (
            LoraLinear(linear, sizes.lora_rank, cfg.lora_alpha, 0.0) for linear in (attention.query, attention.value)
        )
        for lora in (attention.query, attention.value):
            nn.init.normal_(lora.lora_B.weight, std=cfg.initializer_range)  # synthetic: PEFT starts lora_B at zero
    for name, parameter in model.named_parameters():  # bias="none"; SEQ_CLS: the classifier in modules_to_save
        parameter.requires_grad_(".lora_" in name or name.startswith("classifier."))
    peft_model_init(model)  # the blog's order: wrapped with checkpointing off, so no input hook
    model.train()

    generator = torch.Generator().manual_seed(cfg.seed)
    lengths = torch.randint(sizes.tokens // 4, sizes.tokens + 1, (sizes.batch,), generator=generator)
    lengths[0] = sizes.tokens  # DataCollatorWithPadding pads to the batch's longest
    input_ids = torch.randint(3, sizes.vocab, (sizes.batch, sizes.tokens), generator=generator)
    attention_mask = (torch.arange(sizes.tokens) < lengths[:, None]).long()
    input_ids[:, 0] = cfg.bos_token_id
    input_ids[attention_mask == 0] = cfg.pad_token_id
    return Inputs(
        model=model.to(device),
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        labels=torch.randint(0, sizes.labels, (sizes.batch,), generator=generator).to(device),
        class_weights=torch.tensor(cfg.class_weights, device=device),
    )


def training_step(x, model):
    """One step of the blog's WeightedCELossTrainer on `model` as it is set: the loss and every gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    logits = model(x.input_ids, x.attention_mask)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), x.labels.view(-1), weight=x.class_weights.to(logits.dtype))
    loss.backward()
    return training_outputs(model, loss)


def trainer_step(x, gradient_checkpointing_kwargs=None):
    """Trainer.train() with `gradient_checkpointing=True` (transformers before PR #33208), then one step."""
    x.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs or {})
    return training_step(x, x.model)


def buggy(x):
    return trainer_step(x)  # TrainingArguments(gradient_checkpointing=True): checkpoint(...) gets no use_reentrant


def fixed(x):
    return trainer_step(x, {"use_reentrant": False})  # TrainingArguments(..., gradient_checkpointing_kwargs={"use_reentrant": False})


def reference(x):
    """The same step without checkpointing, written out in float64 from the parameters: the loss and every gradient
    (None for the frozen parameters), by torch.autograd.grad."""
    named = dict(x.model.named_parameters())
    p = {name: t.detach().double().requires_grad_(t.requires_grad) for name, t in named.items()}

    def linear(prefix, h):
        out = h @ p[f"{prefix}.weight"].T
        return out + p[f"{prefix}.bias"] if f"{prefix}.bias" in p else out

    def projection(prefix, h):  # a LoRA-wrapped Linear where the adapter is, else the Linear
        if f"{prefix}.lora_A.weight" not in p:
            return linear(prefix, h)
        scaling = x.model.get_submodule(prefix).scaling  # lora_alpha / r
        return linear(f"{prefix}.base_layer", h) + (h @ p[f"{prefix}.lora_A.weight"].T) @ p[f"{prefix}.lora_B.weight"].T * scaling

    def layer_norm(prefix, h, eps):
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        return (h - mean) / torch.sqrt(var + eps) * p[f"{prefix}.weight"] + p[f"{prefix}.bias"]

    eps = x.model.embeddings.LayerNorm.eps
    ids, keep = x.input_ids, x.attention_mask.bool()
    pad = x.model.embeddings.padding_idx
    positions = torch.where(ids != pad, torch.cumsum((ids != pad).long(), 1) + pad, torch.full_like(ids, pad))
    h = (
        p["embeddings.word_embeddings.weight"][ids]
        + p["embeddings.token_type_embeddings.weight"][0]
        + p["embeddings.position_embeddings.weight"][positions]
    )
    h = layer_norm("embeddings.LayerNorm", h, eps)
    heads = x.model.encoder.layer[0].attention["self"].heads
    batch, tokens, hidden = h.shape
    for index in range(len(x.model.encoder.layer)):
        at = f"encoder.layer.{index}"
        q, k, v = (
            projection(f"{at}.attention.self.{name}", h).view(batch, tokens, heads, -1).transpose(1, 2)
            for name in ("query", "key", "value")
        )
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hidden // heads)).masked_fill(~keep[:, None, None, :], -math.inf)
        weights = torch.exp(scores - scores.amax(-1, keepdim=True))
        context = ((weights / weights.sum(-1, keepdim=True)) @ v).transpose(1, 2).reshape(batch, tokens, hidden)
        attended = layer_norm(f"{at}.attention.output.LayerNorm", linear(f"{at}.attention.output.dense", context) + h, eps)
        inner = linear(f"{at}.intermediate", attended)
        inner = 0.5 * inner * (1 + torch.erf(inner / math.sqrt(2)))  # exact GELU
        h = layer_norm(f"{at}.output.LayerNorm", linear(f"{at}.output.dense", inner) + attended, eps)
    logits = linear("classifier.out_proj", torch.tanh(linear("classifier.dense", h[:, 0])))
    log_probs = logits - torch.logsumexp(logits, -1, keepdim=True)
    weight = x.class_weights.double()[x.labels]
    loss = -(weight * log_probs.gather(1, x.labels[:, None])[:, 0]).sum() / weight.sum()
    trainable = [name for name, t in p.items() if t.requires_grad]
    grads = dict(zip(trainable, torch.autograd.grad(loss, [p[name] for name in trainable])))
    return {"loss": loss.detach().float(), "grad": {name: grads[name].float() if name in grads else None for name in named}}


def speed_baseline(x):
    """PEFT's and transformers' own way (`enable_input_require_grads()`, the PeftModel it wraps already checkpointing):
    the reentrant checkpoint, with the word embeddings' output made to require grad by a forward hook."""
    x.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    hook = x.model.get_input_embeddings().register_forward_hook(lambda module, args, output: output.requires_grad_(True))
    try:
        return training_step(x, x.model)
    finally:
        hook.remove()


# -- bad fixes: plausible, each wrong ----------------------------------------------------------------------------


def use_reentrant_false_after_wrapping(x):
    """`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})` on the model AFTER
    get_peft_model (the order opposite to blog #1824's), with the Trainer's `gradient_checkpointing=True` left on: the
    wrapping saw no checkpointing and installed no input hook, and the Trainer enables checkpointing again with its own
    empty kwargs, reentrant. The call and the Trainer's replacing it are shown in
    https://github.com/huggingface/transformers/issues/26221 (pacman100, 2024-04-02)."""
    x.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return trainer_step(x)


def unfreeze_the_embeddings(x):
    """Train the word embeddings so that the first layer's input requires grad, as the reporter of
    https://github.com/huggingface/transformers/issues/23170 did (the first parameter, the embedding, set to
    requires_grad=True): the adapters get their gradients, and the frozen embedding table gets one too."""
    embeddings = x.model.get_input_embeddings().weight
    embeddings.requires_grad_(True)
    try:
        return trainer_step(x)
    finally:
        embeddings.requires_grad_(False)


def loss_requires_grad(x):
    """`loss.requires_grad_()` before the backward, the answer to the sibling error `element 0 of tensors does not
    require grad` under gradient checkpointing in https://github.com/huggingface/trl/issues/801 ("add
    'losses.requires_grad_(True)' ... it works for me"): here the loss already requires grad (through the head), so
    it is a no-op."""
    model = x.model
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={})
    model.zero_grad(set_to_none=True)
    logits = model(x.input_ids, x.attention_mask)
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), x.labels.view(-1), weight=x.class_weights).requires_grad_()
    loss.backward()
    return training_outputs(model, loss)


def silence_the_warning(x):
    """A commenter in https://github.com/2U1/Qwen-VL-Series-Finetune/issues/56: `warnings.filterwarnings("ignore",
    message="None of the inputs have requires_grad=True")`. The warning goes; the gradients stay None."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="None of the inputs have requires_grad=True")
        return trainer_step(x)


bad_fixes = {
    "use_reentrant_false_after_wrapping": use_reentrant_false_after_wrapping,
    "unfreeze_the_embeddings": unfreeze_the_embeddings,
    "loss_requires_grad": loss_requires_grad,
    "silence_the_warning": silence_the_warning,
}


# -- slow fixes: correct, slower than the budget allows ----------------------------------------------------------


def anomaly_detection_left_on(x):
    """The fix, with the anomaly detection one turns on to find where gradients go missing still on."""
    with torch.autograd.detect_anomaly():
        return fixed(x)


slow_fixes = {"anomaly_detection_left_on": anomaly_detection_left_on}


# -- memory: dropping checkpointing is correct, and keeps every layer's activations --------------------------------


def without_checkpointing(x):
    """TrainingArguments(gradient_checkpointing=False): correct; every layer's activations live until the backward."""
    x.model.gradient_checkpointing_disable()
    return training_step(x, x.model)


memory_fixes = {"without_checkpointing": without_checkpointing}
