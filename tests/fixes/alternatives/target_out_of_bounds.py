"""A correct fix of target_out_of_bounds written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch
import torch.nn.functional as F


def target_out_of_bounds(x):
    """Nearest resize by striding (scale 0.5), then the class of each grey value by comparing with every known value."""
    step_y = x.mask_image.shape[-2] // x.masks_pred.shape[-2]
    step_x = x.mask_image.shape[-1] // x.masks_pred.shape[-1]
    resized = x.mask_image[:, ::step_y, ::step_x]
    matches = resized.unsqueeze(-1) == x.mask_values  # (N, h, w, K)
    torch._assert_async(matches.any(-1).all(), "a mask value outside mask_values")
    true_masks = matches.to(torch.uint8).argmax(-1)
    probs = F.softmax(x.masks_pred, dim=1)
    one_hot = F.one_hot(true_masks, x.n_classes).permute(0, 3, 1, 2).float()
    overlap = (probs * one_hot).sum(dim=(0, 2, 3))
    sizes = probs.sum(dim=(0, 2, 3)) + one_hot.sum(dim=(0, 2, 3))
    dice = ((2 * overlap + 1e-6) / (sizes + 1e-6)).mean()
    return {"loss": F.cross_entropy(x.masks_pred, true_masks) + 1 - dice, "labels": true_masks}
