"""A correct fix of fp16_grad_underflow written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch

from cases import fp16_grad_underflow as fp16_case


def fp16_grad_underflow(x):
    """The adapter modules themselves cast to float32 (`module.float()` on every lora_A and lora_B, where the case's
    fix swaps each trainable parameter's data), then the scaled step as upstream runs it."""
    unet = fp16_case.fresh_unet(x)
    for name, module in unet.named_modules():
        if name.rpartition(".")[2] in ("lora_A", "lora_B"):
            module.float()
    trainable = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, **x.optimizer)
    scaler = torch.amp.GradScaler(x.target.device.type, init_scale=2.0**16)
    train_loss = fp16_case.accumulate(x, unet, scaler)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(trainable, x.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return fp16_case.what_the_step_leaves(unet, optimizer, train_loss)
