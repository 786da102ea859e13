"""Submitted fixes of target_out_of_bounds that are wrong where a loss hides it."""

import torch.nn.functional as F


def thresholded_bicubic(x):
    """The bicubic resize kept, its grey values thresholded at the middle: right inside the object and outside it,
    wrong on part of its edge. Its loss is within 2.4e-5 relative of the reference's; its class map is not."""
    resized = F.interpolate(x.mask_image.unsqueeze(1).float(), size=x.masks_pred.shape[-2:], mode="bicubic", antialias=True).squeeze(1)
    true_masks = (resized > 127.5).long()
    probs = F.softmax(x.masks_pred, dim=1)
    one_hot = F.one_hot(true_masks, x.n_classes).permute(0, 3, 1, 2).float()
    overlap = (probs * one_hot).sum(dim=(0, 2, 3))
    sizes = probs.sum(dim=(0, 2, 3)) + one_hot.sum(dim=(0, 2, 3))
    dice = ((2 * overlap + 1e-6) / (sizes + 1e-6)).mean()
    return {"loss": F.cross_entropy(x.masks_pred, true_masks) + 1 - dice, "labels": true_masks}
