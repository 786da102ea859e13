"""LoRA adapters created in float16 by a float16 UNet, trained under GradScaler: it refuses to unscale their gradients.

Upstream: https://github.com/huggingface/diffusers/issues/6086 (examples/text_to_image/train_text_to_image_lora.py
    on Colab with a V100, `--mixed_precision fp16`, batch 1 with 4 gradient accumulation steps; raised at the
    first optimizer step, `step_loss=0.126`, in `accelerator.clip_grad_norm_` -> `unscale_gradients` ->
    `self.scaler.unscale_(opt)`). The script had just moved to PEFT (diffusers PR #5388): it casts the frozen UNet to
    `weight_dtype` (float16) and then calls `unet.add_adapter(LoraConfig(r=4, init_lora_weights="gaussian",
    target_modules=["to_k", "to_q", "to_v", "to_out.0"]))`, and peft 0.7's `update_layer` moves each new adapter to
    its base layer's dtype. The fix: https://github.com/huggingface/diffusers/pull/6119 (commit 288ceebe,
    2023-12-19: "only upcast trainable parameters (LoRA) into fp32"), then the same for the SDXL script
    (https://github.com/huggingface/diffusers/pull/6231, "Fixes #6086") and the helper
    `training_utils.cast_training_params` (https://github.com/huggingface/diffusers/pull/6553). The stored copy of
    #6086 read here holds its log up to the accelerate frames; the torch version is not in it.

Fidelity: faithful in what decides the failure and its fix: the order of `unet.to(dtype=float16)` then
    `add_adapter`, peft 0.7.1's LoRA layer (A ~ N(0, 1/r), B = 0, lora_alpha 8 over r 4, the adapter moved to the
    base layer's dtype, its forward casting x to lora_A's dtype), the four target modules of both attentions,
    accelerate's step for `mixed_precision="fp16"` (the forward under `torch.autocast(float16)` with its output
    converted to float32, the MSE to the noise in float32, the loss divided by the 4 accumulation steps and scaled
    by a GradScaler, then `clip_grad_norm_` (unscale_ first, max_grad_norm 1.0), `scaler.step`, `scaler.update`),
    AdamW with the script's defaults (lr 1e-4, betas 0.9/0.999, weight decay 1e-2, eps 1e-8), the latent size of
    512-pixel images (4 x 64 x 64) and CLIP ViT-L's text states (77 x 768) in float16, and SD's DDPMScheduler
    (1000 steps, scaled_linear betas 0.00085-0.012) adding noise in float16. Synthetic: the UNet, a stand-in of
    SD's UNet2DConditionModel reduced to one attention level (conv_in and the timestep embedding at 64 x 64, a
    stride-2 Downsample2D, one Transformer2DModel with one BasicTransformerBlock at 32 x 32 (1024 tokens, 64
    channels, 2 heads; SD has 640 channels there), a nearest upsampling, the skip, conv_norm_out, SiLU,
    conv_out), its seeded frozen weights (untrained: its loss is 1.1-1.2 where SD's was 0.126, so its gradients
    are larger than SD's and its underflow understates SD's), the latents, noise, timesteps and text states
    (seeded draws). Upstream's `params_to_clip = lora_layers` is a `filter` the optimizer already consumed, so
    its clip clips nothing; here it clips the LoRA parameters, whose norm (0.03-0.05) is far under 1.0 either way.

Symptom on CUDA: from the threads (a V100 in #6086; torch 1.13 to 2.x in the others: the file is
    torch/cuda/amp/grad_scaler.py before torch 2.3, torch/amp/grad_scaler.py after):
        ValueError: Attempting to unscale FP16 gradients.
    Not run on a GPU here (this task had none).

Symptom on CPU: the same line, from `torch.amp.GradScaler("cpu").unscale_` (torch/amp/grad_scaler.py,
    `_unscale_grads_`), run here on torch 2.3.1, 2.4.1, 2.6.0, 2.9.1, 2.11.0, 2.13.0 and 2.15.0:
        ValueError: Attempting to unscale FP16 gradients.
    Every one of them has the CPU GradScaler (`torch.amp.GradScaler("cpu")`; `torch.cpu.amp.GradScaler()` is the
    same class, with a FutureWarning from 2.4) and runs CPU autocast in float16 (Linear, conv and SDPA give float16
    outputs), and none changes the check: the failure does not depend on the version.

Cause: GradScaler multiplies the loss by 65536 so that small float16 gradients stay representable, and divides
    them again before the step; its `unscale_` refuses float16 gradients (`allow_fp16=False`): it is built for
    an optimizer that owns float32 weights (its author in https://github.com/pytorch/pytorch/pull/26512: "the
    parameters themselves (the ones owned by the optimizer) will always be FP32"), and dividing in float16 would
    flush the gradients it lifted back under float16's range. The trainable adapters are float16 only because
    peft gave them the dtype of the UNet they were added to after its cast.

Fix: upstream's (PR #6119, then `cast_training_params`): upcast the trainable parameters alone to float32, keeping
    the frozen UNet in float16 and the GradScaler: autocast runs the forward in float16, the gradients land in
    float32 master weights, unscale_ divides them there, and AdamW steps float32 weights. The output is what the
    step leaves: the logged loss, every parameter's gradient as AdamW took it (after unscale_ and clipping; None
    for the frozen ones) and AdamW's two moments; the reference computes them in float64 without autocast,
    GradScaler or torch.optim. The parameters after the step are not compared: AdamW's first step moves each
    weight by lr * g / (|g| + eps), lr times the gradient's sign wherever |g| >> eps, so an element whose
    gradient is within float16 rounding of zero goes either way in any float16 training (measured against the
    float64 reference: 38 elements in 12 seeds moved by up to 1.6e-4, 1.6 lr); the moments are smooth in g.
    Cost, against the same step without master weights or scaler (the float16 adapters stepped directly): the
    casts of the adapters in each forward, AdamW in float32 and the unscale's inf check are small next to the UNet:
    1.006x [0.895, 1.132] with the 4 micro-batches, 1.04-1.07x (intervals up to 1.133) timed on one (the yaml's
    speed inputs), 1.02-1.03x (up to 1.147) compiled (torch 2.13.0, one thread, a loaded 2-core machine).
    Wrong fixes, each rejected (seed 0, torch 2.13.0; 2,655 of the 29,185 floats compared differ for the first
    two, 1,788 for the third, on every torch of the matrix within 2,650-2,661 and 1,772-1,797):
    dropping the GradScaler and training the float16 adapters directly (pytorch/pytorch#74739, a comment: "not
    using gradscaler if your model" is float16): the backward is no longer scaled, and 214,611 of the 262,144
    gradient entries reaching the self-attention's to_q output over the 4 micro-batches (237,513 at to_k) are
    exactly 0 in float16, the rest subnormal (with the scaler: 0 and 2), so the to_q and to_k adapters'
    gradients lose 85% and 90% of their norm (relative error 0.85, 0.90; the cross-attention's q and k 5-6%); and
    AdamW in float16 squares gradients of 1e-4 into (1 - beta2) * g**2 = 1e-11, which is 0 in float16, while its
    eps 1e-8 rounds to 0 too: 2,035 of the 2,048 exp_avg_sq entries of the B matrices are 0, and 9,715 of the
    9,728 adapter weights are inf or NaN after the one step. A larger AdamW eps on top (1e-4;
    jinxixiang/magic_animate_unofficial#6, a comment on float16 weights turning NaN after optimizer.step:
    "Increasing the adam_epsilon may help ... 1e-8, which may be too small for fp16"; it names no value) keeps
    the weights finite but not the step: the same lost gradients, and the B matrices move by up to 5.4e-3 (54
    lr) where the fix moves them by lr. Upcasting the adapters but dropping the scaler (half of the fix, a
    generic attempt) keeps float32 weights and the same lost gradients. Leaving the clipping out (a generic
    attempt, since the error is raised there; huggingface/diffusers#1246's log shows a script that does not
    clip raise it from `optimizer.step()`) still raises: `GradScaler.step` unscales first. Slow control: the fix
    with the check of what each half of it saves left on (`underflow_check_left_on`: the micro-batches also through
    two UNets made as the step's, float32 and float16 adapters, both without the scaler, each adapter's gradient
    norm read in the three): it costs the step's own work twice again, so it holds whatever float16 costs on the CPU
    and whatever the compiler redoes for a new model (torch 2.4.1 compiled retraces the block for each new UNet: its
    first micro-batch 3.5-4.1 s, the next 0.9-1.2 s). Against the 1.15x budget, each run beside another on a loaded
    2-core machine: 2.76x [2.30, 3.31] and 2.89x [2.77, 3.02] eager, 3.03x [2.79, 3.29] and 2.85x [2.54, 3.19]
    compiled (torch 2.13.0); 3.02x [2.04, 4.46] eager, 3.32x [2.84, 3.88] compiled (torch 2.4.1); the fix in the
    same runs 0.97-1.05x (intervals up to 1.145), inconclusive at 1.05x [0.74, 1.48] on 2.4.1 compiled. Not a
    control: anomaly detection left on, the control before it: its cost is a constant per autograd op (a traceback
    recorded, every gradient checked for NaN), large beside a fast float16 step and lost in a slow one: 1.98x where
    a step took 34 ms, 1.09x [1.05, 1.14] where it took 240 ms (torch 2.13.0), 0.85-1.04x on torch 2.3.1-2.6.0
    (steps of 6-8 s), 1.20-1.24x compiled, where a control must clear the budget by 1.3x at its interval's low end
    on any machine.

Compiled: the transformer block, as diffusers' regional compilation does (`unet.compile_repeated_blocks()`,
    UNet2DConditionModel's `_repeated_blocks = ["BasicTransformerBlock"]`). Compiling the whole stand-in UNet
    with inductor on torch 2.13.0 (CPU) returns a gradient of exactly 0 for every LoRA weight whenever the
    forward runs in float16 (autocast or a float16 model; float32 is right), with or without the scaler: the
    gradient dies in the backward of the conv_norm_out GroupNorm -> SiLU -> conv_out tail when that tail is in
    one graph with the block (a graph break before it, or either op removed, gives the right gradients; the tail
    compiled alone is right). torch 2.11.0 and 2.15.0 compute it right; torch 2.3.1's inductor differs even in
    float32 (the self-attention's to_k adapter 77.8 against eager's 46.7, scaled by 65536). The buggy step raises
    the same ValueError compiled. The block compiled alone matches the reference on 2.3.1, 2.6.0, 2.9.1, 2.13.0
    and 2.15.0 (run by hand, outside the harness); a compiled step takes 23-30 s on 2.3.1 and 2.6.0 (on 2.6.0,
    6.5-7 s for one micro-batch's forward and backward of the block, with no recompile; eager takes 0.05 s),
    0.1-0.4 s on 2.9.1, 2.13.0 and 2.15.0.
"""

import copy
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.measure.compare import training_outputs
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom("ValueError", r"^Attempting to unscale FP16 gradients\.$"),
    "cuda": Symptom("ValueError", r"^Attempting to unscale FP16 gradients\.$"),
}

# GradScaler refusing a float16 gradient: a trainable parameter is float16. Not the scaler's other complaints (no inf
# checks recorded, unscale_ called twice, bfloat16 gradients in its kernel) nor a NaN loss or a collapsed scale.
triage_signs = TriageSigns(
    family="GradScaler refusing float16 gradients",
    cause="a model or adapter cast to float16 while the scaler expects float32 master weights",
    confirm="the optimizer's parameters are float16 (model.half(), torch_dtype=torch.float16)",
    also="an optimizer built over a half model in any trainer with fp16=True",
    signs=(
        Sign(
            "failure",
            r"ValueError: Attempting to unscale FP16 gradients",
            0.9,
            "GradScaler.unscale_ met a float16 gradient: the optimizer holds a float16 parameter (a model or adapter cast to half)",
        ),
        Sign(
            "failure",
            r"(?i)\bunscale\W+(?:fp16|float16|half)\W+grad",
            0.8,
            "the same refusal where the log holds only its raise statement, or quotes or retells it without the exception's name",
        ),
        Sign(
            "failure",
            r"grad_scaler\.py.*\bin _unscale_grads_\b",
            0.5,
            "the frame of GradScaler's check itself, where the log was cut before its message (its only raise is this refusal)",
            family=True,
        ),
        Sign(
            "context",
            r"grad_scaler\.py.* in (?:_unscale_grads_|unscale_|step)\b",
            0.3,
            "raised in GradScaler's unscale, called by unscale_ or by step",
        ),
        Sign(
            "context",
            r"\bin (?:clip_grad_norm_|unscale_gradients)\b|scaler\.unscale_\(|scaler\.step\(",
            0.2,
            "the training loop's unscale: accelerate's clip_grad_norm_ or the Trainer's scaler.unscale_",
        ),
        Sign(
            "support",
            r"--fp16\b|fp16=True|mixed_precision[=: ]+\"?fp16|\.half\(\)|torch_dtype=torch\.float16",
            0.1,
            "float16 training or a float16 model in the command or the code shown",
        ),
        Sign(
            "veto",
            r"No inf checks were recorded (?:for this optimizer|prior to update)|unscale_\(\) has already been called on this optimizer",
            0,
            "the scaler's other complaints: no parameter of the optimizer had a gradient, or unscale_ ran twice before update()",
        ),
        Sign(
            "veto",
            r"_amp_foreach_non_finite_check_and_unscale_\w* ?\"? not implemented for 'BFloat16'",
            0,
            "bfloat16 gradients reached the scaler's kernel: bfloat16 needs no scaler, another fix",
        ),
    ),
)

compiled_unit = (
    "the UNet's BasicTransformerBlock, compiled in place as diffusers' `unet.compile_repeated_blocks()` does: the block "
    "holds every LoRA adapter. Not the whole UNet: on torch 2.13.0 inductor returns zero LoRA gradients for the "
    "float16 stand-in compiled whole (see Compiled in the docstring)"
)
compiles_itself = True  # fresh_unet compiles each BasicTransformerBlock of its copy as cfg says (regional compilation)


# -- the model: a small stand-in of SD's UNet2DConditionModel around one cross-attention transformer block --------


class LoraLinear(nn.Module):
    """peft 0.7.1's `lora.Linear`, as `unet.add_adapter(LoraConfig(r=4, init_lora_weights="gaussian", ...))` wraps
    to_q, to_k, to_v and to_out.0: A ~ N(0, 1/r), B = 0, scaling lora_alpha / r, and the adapter moved to the base
    layer's device and dtype (`update_layer`: `self.to(weight.device, dtype=weight.dtype)`)."""

    def __init__(self, base_layer: nn.Linear, r: int, lora_alpha: int):
        super().__init__()
        self.base_layer = base_layer
        self.lora_A = nn.Linear(base_layer.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base_layer.out_features, bias=False)
        self.scaling = lora_alpha / r
        nn.init.normal_(self.lora_A.weight, std=1 / r)
        nn.init.zeros_(self.lora_B.weight)
        self.to(base_layer.weight.device, dtype=base_layer.weight.dtype)

    def forward(self, x):
        previous_dtype = x.dtype
        result = self.base_layer(x)
        x = x.to(self.lora_A.weight.dtype)
        result += self.lora_B(self.lora_A(x)) * self.scaling
        return result.to(previous_dtype)


class Attention(nn.Module):
    """diffusers' Attention with AttnProcessor2_0: to_q, to_k, to_v without bias, to_out = [Linear, Dropout]."""

    def __init__(self, channels: int, context_dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(channels, channels, bias=False)
        self.to_k = nn.Linear(context_dim, channels, bias=False)
        self.to_v = nn.Linear(context_dim, channels, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels), nn.Dropout(0.0)])

    def forward(self, hidden_states, encoder_hidden_states=None):
        batch = hidden_states.shape[0]
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query, key, value = self.to_q(hidden_states), self.to_k(context), self.to_v(context)
        head_dim = query.shape[-1] // self.heads
        query, key, value = (t.view(batch, -1, self.heads, head_dim).transpose(1, 2) for t in (query, key, value))
        hidden_states = F.scaled_dot_product_attention(query, key, value)
        hidden_states = hidden_states.transpose(1, 2).reshape(batch, -1, self.heads * head_dim).to(query.dtype)
        return self.to_out[1](self.to_out[0](hidden_states))


class BasicTransformerBlock(nn.Module):
    """diffusers' BasicTransformerBlock of SD 1.x: self-attention, cross-attention to the text states, GEGLU
    feed-forward, each after a LayerNorm and added to its input."""

    def __init__(self, channels: int, context_dim: int, heads: int):
        super().__init__()
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(channels), nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.attn1 = Attention(channels, channels, heads)
        self.attn2 = Attention(channels, context_dim, heads)
        self.ff_proj = nn.Linear(channels, 8 * channels)  # GEGLU: value and gate, 4 x channels each
        self.ff_out = nn.Linear(4 * channels, channels)

    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.attn1(self.norm1(hidden_states)) + hidden_states
        hidden_states = self.attn2(self.norm2(hidden_states), encoder_hidden_states) + hidden_states
        value, gate = self.ff_proj(self.norm3(hidden_states)).chunk(2, dim=-1)
        return self.ff_out(value * F.gelu(gate)) + hidden_states


class UNetOutput(NamedTuple):
    sample: torch.Tensor


class UNetStandIn(nn.Module):
    """conv_in and the timestep embedding at the latent's size, a Downsample2D, one Transformer2DModel (GroupNorm,
    proj_in, a BasicTransformerBlock, proj_out, residual) at half the size, an Upsample2D's nearest upsampling, the
    skip, then conv_norm_out, SiLU and conv_out: SD's UNet2DConditionModel reduced to one attention level."""

    _repeated_blocks = ("BasicTransformerBlock",)  # what diffusers' unet.compile_repeated_blocks() compiles

    def __init__(self, sizes):
        super().__init__()
        c = sizes.channels
        self.conv_in = nn.Conv2d(sizes.latent_channels, c, 3, padding=1)
        self.time_embedding = nn.Sequential(nn.Linear(c, c), nn.SiLU(), nn.Linear(c, c))
        self.downsample = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(32, c, eps=1e-6)
        self.proj_in = nn.Conv2d(c, c, 1)
        self.transformer_block = BasicTransformerBlock(c, sizes.text_dim, sizes.heads)
        self.proj_out = nn.Conv2d(c, c, 1)
        self.conv_norm_out = nn.GroupNorm(32, c, eps=1e-5)
        self.conv_out = nn.Conv2d(c, sizes.latent_channels, 3, padding=1)

    def timestep_proj(self, timesteps, dtype):
        """diffusers' Timesteps(c, flip_sin_to_cos=True, downscale_freq_shift=0), computed in float32 and cast to the
        sample's dtype as UNet2DConditionModel does before its time_embedding."""
        half = self.conv_in.out_channels // 2
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
        angles = timesteps[:, None].float() * torch.exp(exponent)[None]
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(dtype)

    def forward(self, sample, timestep, encoder_hidden_states):
        temb = self.time_embedding(self.timestep_proj(timestep, sample.dtype))
        skip = self.conv_in(sample) + temb[:, :, None, None]
        h = self.downsample(skip)
        batch, channels, height, width = h.shape
        residual = h
        h = self.proj_in(self.norm(h)).flatten(2).transpose(1, 2)  # (B, H*W, C)
        h = self.transformer_block(h, encoder_hidden_states)
        h = self.proj_out(h.transpose(1, 2).reshape(batch, channels, height, width)) + residual
        h = F.interpolate(h, scale_factor=2.0, mode="nearest") + skip
        return UNetOutput(self.conv_out(F.silu(self.conv_norm_out(h))))


LORA_TARGETS = ("to_k", "to_q", "to_v", "to_out.0")  # the script's LoraConfig(target_modules=...)


def add_adapter(unet, r, lora_alpha):
    """`unet.add_adapter(unet_lora_config)` after `unet.to(accelerator.device, dtype=weight_dtype)`: the frozen UNet
    is already float16, so peft makes the adapters float16 too."""
    for attention in (unet.transformer_block.attn1, unet.transformer_block.attn2):
        attention.to_q = LoraLinear(attention.to_q, r, lora_alpha)
        attention.to_k = LoraLinear(attention.to_k, r, lora_alpha)
        attention.to_v = LoraLinear(attention.to_v, r, lora_alpha)
        attention.to_out[0] = LoraLinear(attention.to_out[0], r, lora_alpha)


class Inputs(NamedTuple):
    unet: nn.Module  # the float16 stand-in with float16 LoRA adapters, as the script holds it before the optimizer
    noisy_latents: torch.Tensor  # (accumulation, batch, 4, 64, 64) float16: noise_scheduler.add_noise(latents, noise, t)
    timesteps: torch.Tensor  # (accumulation, batch) long
    encoder_hidden_states: torch.Tensor  # (accumulation, batch, 77, 768) float16: the text encoder's last hidden state
    target: torch.Tensor  # (accumulation, batch, 4, 64, 64) float16: the noise (prediction_type epsilon)
    optimizer: dict  # AdamW's arguments: lr, betas, weight_decay, eps
    max_grad_norm: float
    compile: dict  # how fresh_unet compiles the UNet: cfg's `compile` (off, or the backend) and `kernel_threads`


def make_inputs(cfg, device):
    sizes = cfg.sizes
    torch.manual_seed(cfg.seed)  # nn.Module init and peft's normal_ draw from the global generator
    unet = UNetStandIn(sizes)
    unet.requires_grad_(False)
    unet.to(device, dtype=torch.float16)  # unet.to(accelerator.device, dtype=weight_dtype)
    add_adapter(unet, sizes.rank, cfg.lora_alpha)

    generator = torch.Generator().manual_seed(cfg.seed)
    shape = (sizes.accumulation, sizes.batch, sizes.latent_channels, sizes.latent_size, sizes.latent_size)
    latents = torch.randn(shape, generator=generator).half()  # synthetic: vae.encode(...).latent_dist.sample() * scaling_factor
    noise = torch.randn(shape, generator=generator).half()  # torch.randn_like(latents)
    timesteps = torch.randint(0, cfg.scheduler.num_train_timesteps, shape[:2], generator=generator)
    states = torch.randn(sizes.accumulation, sizes.batch, sizes.text_tokens, sizes.text_dim, generator=generator).half()
    return Inputs(
        unet=unet,
        noisy_latents=add_noise(cfg.scheduler, latents, noise, timesteps).to(device),
        timesteps=timesteps.to(device),
        encoder_hidden_states=states.to(device),
        target=noise.to(device),
        optimizer={"lr": cfg.learning_rate, "betas": tuple(cfg.adam_betas), "weight_decay": cfg.adam_weight_decay, "eps": cfg.adam_epsilon},
        max_grad_norm=cfg.max_grad_norm,
        compile={"compile": compile_axis.mode_of(cfg), "kernel_threads": cfg.get("kernel_threads")},
    )


def add_noise(scheduler, latents, noise, timesteps):
    """DDPMScheduler.add_noise with SD's scaled_linear betas: alphas_cumprod cast to the latents' dtype (float16)."""
    betas = torch.linspace(scheduler.beta_start**0.5, scheduler.beta_end**0.5, scheduler.num_train_timesteps, dtype=torch.float32) ** 2
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).to(latents.dtype)
    sqrt_alpha_prod = (alphas_cumprod[timesteps] ** 0.5)[..., None, None, None]
    sqrt_one_minus_alpha_prod = ((1 - alphas_cumprod[timesteps]) ** 0.5)[..., None, None, None]
    return sqrt_alpha_prod * latents + sqrt_one_minus_alpha_prod * noise


# -- the training step ----------------------------------------------------------------------------------------------


def fresh_unet(x):
    """The step on a copy (the inputs keep their weights), compiled where the run compiles: each
    BasicTransformerBlock, as diffusers' `unet.compile_repeated_blocks()` does."""
    unet = copy.deepcopy(x.unet)
    for module in unet.modules():
        if type(module).__name__ in unet._repeated_blocks:
            module.forward = compile_axis.compiled(module.forward, x.compile)
    return unet


def lora_parameters(unet):
    return [p for p in unet.parameters() if p.requires_grad]


def accumulate(x, unet, scaler):
    """`gradient_accumulation_steps` micro-batches under `accelerator.accumulate(unet)`: the forward autocast as
    accelerate wraps `unet.forward` (its output converted to float32), the MSE to the noise, `accelerator.backward`
    (the loss divided by the accumulation steps, scaled by the GradScaler where there is one). Returns the logged
    train_loss."""
    device_type = x.target.device.type
    steps = x.target.shape[0]
    train_loss = torch.zeros((), device=x.target.device)
    for noisy_latents, timesteps, states, target in zip(x.noisy_latents, x.timesteps, x.encoder_hidden_states, x.target):
        with torch.autocast(device_type, dtype=torch.float16):
            model_pred = unet(noisy_latents, timesteps, states).sample
        model_pred = model_pred.float()  # accelerate's convert_outputs_to_fp32
        loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
        train_loss += loss.detach() / steps
        loss = loss / steps
        (loss if scaler is None else scaler.scale(loss)).backward()
    return train_loss


def what_the_step_leaves(unet, optimizer, train_loss):
    """The logged loss, every parameter's gradient as the optimizer took it (None for the frozen ones), and AdamW's
    moments after its step, by parameter name."""
    out = training_outputs(unet, train_loss)
    names = {p: name for name, p in unet.named_parameters() if p.requires_grad}
    for moment in ("exp_avg", "exp_avg_sq"):
        out[moment] = {name: optimizer.state.get(p, {}).get(moment) for p, name in names.items()}
    return out


def buggy(x):
    unet = fresh_unet(x)
    params = lora_parameters(unet)  # float16: peft gave the adapters the UNet's dtype
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    scaler = torch.amp.GradScaler(x.target.device.type)  # Accelerator(mixed_precision="fp16")
    train_loss = accumulate(x, unet, scaler)
    scaler.unscale_(optimizer)  # accelerator.clip_grad_norm_ -> unscale_gradients: raises here
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return what_the_step_leaves(unet, optimizer, train_loss)


def fixed(x):
    unet = fresh_unet(x)
    for param in unet.parameters():  # diffusers PR #6119, then training_utils.cast_training_params (PR #6553)
        if param.requires_grad:  # only the trainable (LoRA) parameters: float32 master weights
            param.data = param.to(torch.float32)
    params = lora_parameters(unet)
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    scaler = torch.amp.GradScaler(x.target.device.type)
    train_loss = accumulate(x, unet, scaler)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return what_the_step_leaves(unet, optimizer, train_loss)


def reference(x):
    """In float64, without autocast, GradScaler or torch.optim: the same network with its frozen weights as loaded
    (float16 values) and the adapters as initialised; the gradient of the mean micro-batch loss by autograd, the
    micro-batches taken as one batch (their losses are means over equal sizes); the clipping and AdamW's first
    moments by their formulas."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: on a busy 2-core machine a second thread only waits (6.2 s against 0.4 s)
    try:
        return _reference(x)
    finally:
        torch.set_num_threads(threads)


def _reference(x):
    unet = copy.deepcopy(x.unet).double()
    names = [name for name, p in unet.named_parameters() if p.requires_grad]
    params = [p for p in unet.parameters() if p.requires_grad]
    prediction = unet(x.noisy_latents.flatten(0, 1).double(), x.timesteps.flatten(), x.encoder_hidden_states.flatten(0, 1).double()).sample
    loss = ((prediction - x.target.flatten(0, 1).double()) ** 2).mean()
    grads = torch.autograd.grad(loss, params)
    norm = torch.sqrt(sum((g**2).sum() for g in grads))
    grads = [g * torch.clamp(x.max_grad_norm / (norm + 1e-6), max=1.0) for g in grads]
    beta1, beta2 = x.optimizer["betas"]
    by_name = dict(zip(names, grads))
    return {
        "loss": loss.detach().float(),
        "grad": {name: by_name[name].float() if name in by_name else None for name, _ in unet.named_parameters()},
        "exp_avg": {name: ((1 - beta1) * g).float() for name, g in by_name.items()},
        "exp_avg_sq": {name: ((1 - beta2) * g * g).float() for name, g in by_name.items()},
    }


def speed_baseline(x):
    """The step as it runs without what the fix adds: the float16 adapters stepped directly, no GradScaler (so
    nothing to unscale). The fix adds the float32 master weights (their casts in each forward, AdamW in float32)
    and the scaler's unscale and inf check. The same step as the bad fix `drop_the_scaler`."""
    return drop_the_scaler(x)


# -- bad fixes: plausible, each wrong ------------------------------------------------------------------------------


def drop_the_scaler(x):
    """A commenter in https://github.com/pytorch/pytorch/issues/74739: "not using gradscaler if your model" is
    float16. The float16 adapters train directly: the backward is not scaled, and AdamW runs in float16."""
    unet = fresh_unet(x)
    params = lora_parameters(unet)
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    train_loss = accumulate(x, unet, None)
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    optimizer.step()
    return what_the_step_leaves(unet, optimizer, train_loss)


def larger_adam_epsilon(x):
    """A commenter in https://github.com/jinxixiang/magic_animate_unofficial/issues/6, on float16 weights turning NaN
    after optimizer.step: "Increasing the adam_epsilon may help ... 1e-8, which may be too small for fp16". The
    scaler dropped as above, AdamW's eps 1e-4 (the comment names no value)."""
    unet = fresh_unet(x)
    params = lora_parameters(unet)
    optimizer = torch.optim.AdamW(params, **{**x.optimizer, "eps": 1e-4})
    train_loss = accumulate(x, unet, None)
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    optimizer.step()
    return what_the_step_leaves(unet, optimizer, train_loss)


def upcast_without_scaler(x):
    """The adapters upcast as the fix does, the GradScaler left out (half of the fix; a generic attempt, not from
    the cited threads): float32 master weights, gradients still taken unscaled through the float16 forward."""
    unet = fresh_unet(x)
    for param in unet.parameters():
        if param.requires_grad:
            param.data = param.to(torch.float32)
    params = lora_parameters(unet)
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    train_loss = accumulate(x, unet, None)
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    optimizer.step()
    return what_the_step_leaves(unet, optimizer, train_loss)


def skip_the_clipping(x):
    """`accelerator.clip_grad_norm_` is where the error is raised, so leave clipping out (a generic attempt; the
    logs of huggingface/diffusers#1246 show the same error raised from optimizer.step() in a script that did not
    clip): GradScaler.step unscales first, and raises the same ValueError."""
    unet = fresh_unet(x)
    params = lora_parameters(unet)
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    scaler = torch.amp.GradScaler(x.target.device.type)
    train_loss = accumulate(x, unet, scaler)
    scaler.step(optimizer)
    scaler.update()
    return what_the_step_leaves(unet, optimizer, train_loss)


bad_fixes = {
    "drop_the_scaler": drop_the_scaler,
    "larger_adam_epsilon": larger_adam_epsilon,
    "upcast_without_scaler": upcast_without_scaler,
    "skip_the_clipping": skip_the_clipping,
}


# -- slow fixes: correct, slower than the budget allows -----------------------------------------------------------


def unscaled_norms(x, upcast):
    """Each adapter's gradient norm in a step without the scaler, on a UNet of its own made as the step makes its
    (`fresh_unet`: a copy of the loaded one, compiled as the run compiles), the adapters upcast to float32 (the fix
    without its scaler) or left float16 (the step before the fix): the micro-batches through it, an ordinary
    backward, each norm read as a Python float (a host sync per parameter)."""
    unet = fresh_unet(x)
    if upcast:
        for param in unet.parameters():
            if param.requires_grad:
                param.data = param.to(torch.float32)
    accumulate(x, unet, None)
    return [param.grad.norm().item() for param in lora_parameters(unet)]


def underflow_check_left_on(x):
    """The fix, with the check one writes to see what each half of it saves still on: beside the step, the same
    micro-batches through two more UNets made as the step makes its own, one with float32 adapters and one with the
    float16 adapters of before the fix, both without the scaler (`unscaled_norms`), and each adapter's gradient
    norm in the two read to log beside the step (without the scaler, the self-attention's to_q and to_k adapters
    keep 16% and 11% of theirs, whatever their dtype). The step is the fix's, so it is correct; the check costs two
    more steps' forward and backward, and their UNets made and compiled as the step's: the step's own work twice
    again, whatever float16 costs on the CPU at hand and whatever the compiler redoes for a new model."""
    checked = {"float32, no scaler": unscaled_norms(x, upcast=True), "float16, no scaler": unscaled_norms(x, upcast=False)}
    del checked  # what the check logs beside the fix's step (the logging left out)
    return fixed(x)


slow_fixes = {"underflow_check_left_on": underflow_check_left_on}
