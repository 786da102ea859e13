"""Pytorch-UNet's fixes of target_out_of_bounds, in the order the repository applied them, and the maintainer's
answer to the same error in another thread, each as a submission.

The step is #291's train.py loss as the case writes it (`loss_and_labels`, `resize_as_pil_default`, the case's
torch stand-ins for PIL's resize, which the buggy code uses too; `resize_nearest` stands for PIL's NEAREST). What
changes is `BasicDataset.preprocess` of utils/data_loading.py. Commit d786714 ("Winter cleanup") also rewrote
train.py and utils/dice_score.py; those changes are not part of the masks' fix and are left out: the loss is
#291's. tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import numpy as np
import torch
import torch.nn.functional as F

from cases.target_out_of_bounds import loss_and_labels, resize_as_pil_default


def _resize_nearest(mask, size):
    """`pil_img.resize((newW, newH), resample=Image.NEAREST)`, on the case's uint8 mask."""
    return F.interpolate(mask.unsqueeze(1), size=size, mode="nearest").squeeze(1)


def commit_8f317cb_nearest(x):
    """https://github.com/milesial/Pytorch-UNet/commit/8f317cb13c17ef25a86b25a0c24390e04cd4db82 ("Fix mask resampling in
    some cases", 2021-11-03): `pil_img.resize((newW, newH), resample=Image.NEAREST if is_mask else Image.BICUBIC)`,
    the mask's values still returned as they are (tag v3.0, as https://github.com/milesial/Pytorch-UNet/issues/408
    ran it)."""
    true_masks = _resize_nearest(x.mask_image, x.masks_pred.shape[-2:]).long()
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def commit_d786714_mask_values(x):
    """https://github.com/milesial/Pytorch-UNet/commit/d786714b31783bb754e36d9b0d0bf238b1ba1a16 ("Winter cleanup",
    2022-12-06), the master https://github.com/milesial/Pytorch-UNet/issues/408's maintainer points to ("try the latest
    master version ... this should be fixed"): `mask_values`, the sorted unique values of the dataset's masks (the
    inputs carry it), and `preprocess` resizing with NEAREST (8f317cb) and then, on the host in numpy,
    `mask = np.zeros((newH, newW), dtype=np.int64); for i, v in enumerate(mask_values): mask[img == v] = i`."""
    mask_values = list(sorted(x.mask_values.cpu().numpy().tolist()))
    img = _resize_nearest(x.mask_image, x.masks_pred.shape[-2:]).cpu().numpy()
    mask = np.zeros(img.shape, dtype=np.int64)  # (N, newH, newW): the dataset does one image at a time
    for i, v in enumerate(mask_values):
        mask[img == v] = i
    true_masks = torch.as_tensor(mask.copy()).long().contiguous().to(x.masks_pred.device)
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def issue_258_more_classes(x):
    """The maintainer in https://github.com/milesial/Pytorch-UNet/issues/258 (the CUDA form of the same error, 3
    classes): "If you have 3 classes you should change n_classes to 3 (or 4 if you include background)"; a commenter
    there: "I solved this problem by adding one to args "classes"". One more output, the masks as they were."""
    masks_pred = torch.cat([x.masks_pred, x.masks_pred[:, :1]], dim=1)  # the extra output's values do not matter
    true_masks = resize_as_pil_default(x.mask_image, x.masks_pred.shape[-2:]).long()
    return loss_and_labels(masks_pred, true_masks, x.n_classes + 1)
