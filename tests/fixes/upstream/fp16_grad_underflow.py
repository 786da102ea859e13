"""diffusers' fix of fp16_grad_underflow, as its PRs wrote it, each as a submission.

The step is the case's accelerate step (`fresh_unet`, `lora_parameters`, `accumulate`, `what_the_step_leaves`,
which the buggy code uses too): the frozen UNet already cast to float16 and the LoRA adapters added after it, as
train_text_to_image_lora.py does; what the PRs add is the cast of the trainable parameters before the optimizer is
built. tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import torch

from cases.fp16_grad_underflow import accumulate, fresh_unet, lora_parameters, what_the_step_leaves


def _train_step(x, unet):
    params = lora_parameters(unet)  # `lora_layers = filter(lambda p: p.requires_grad, unet.parameters())`
    optimizer = torch.optim.AdamW(params, **x.optimizer)
    scaler = torch.amp.GradScaler(x.target.device.type)  # Accelerator(mixed_precision="fp16")
    train_loss = accumulate(x, unet, scaler)
    scaler.unscale_(optimizer)  # accelerator.clip_grad_norm_
    torch.nn.utils.clip_grad_norm_(params, x.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return what_the_step_leaves(unet, optimizer, train_loss)


def pr_6119_upcast_trainable_parameters(x):
    """https://github.com/huggingface/diffusers/pull/6119 (commit 288ceebe, 2023-12-19, for
    https://github.com/huggingface/diffusers/issues/6086), examples/text_to_image/train_text_to_image_lora.py, right
    after `unet.add_adapter(unet_lora_config)`: `if args.mixed_precision == "fp16": for param in unet.parameters():
    # only upcast trainable parameters (LoRA) into fp32 / if param.requires_grad: param.data =
    param.to(torch.float32)`. (https://github.com/huggingface/diffusers/pull/6231 wrote the same loop into the SDXL
    script, over `models = [unet]`.)"""
    unet = fresh_unet(x)
    mixed_precision = "fp16"
    if mixed_precision == "fp16":
        for param in unet.parameters():
            # only upcast trainable parameters (LoRA) into fp32
            if param.requires_grad:
                param.data = param.to(torch.float32)
    return _train_step(x, unet)


def cast_training_params(model, dtype=torch.float32):
    """diffusers.training_utils.cast_training_params as https://github.com/huggingface/diffusers/pull/6553 added it."""
    if not isinstance(model, list):
        model = [model]
    for m in model:
        for param in m.parameters():
            # only upcast trainable parameters into fp32
            if param.requires_grad:
                param.data = param.to(dtype)


def pr_6553_cast_training_params(x):
    """https://github.com/huggingface/diffusers/pull/6553: the scripts call the new helper,
    `if args.mixed_precision == "fp16": models = [unet]; cast_training_params(models, dtype=torch.float32)`."""
    unet = fresh_unet(x)
    mixed_precision = "fp16"
    if mixed_precision == "fp16":
        models = [unet]
        # only upcast trainable parameters (LoRA) into fp32
        cast_training_params(models, dtype=torch.float32)
    return _train_step(x, unet)
