r"""Grey mask values used as class targets: Pytorch-UNet's cross entropy gets targets past its 2 classes.

Upstream: https://github.com/milesial/Pytorch-UNet/issues/291 (own data, `n_classes=2`; the
    version, torch and device are not given: the message is CPU's; #291 was filed on 2021-08-24, so the code is
    the repository's master of then, d898497, after the refactor of commit f6185d6, "Summer cleanup",
    2021-08-16, the day the maintainer closed #258 "as this issue is now outdated after the recent code
    refactor"). The maintainer's answer: "check that your
    masks are loaded with class indices and not with raw greyscale value. Greyscale values are from
    0 to 255 while class indices are from 0 to n_classes-1". The repository's own fix came later:
    masks resized with NEAREST (commit 8f317cb, "Fix mask resampling in some cases") and each
    grey value the dataset's masks hold mapped to its index in their sorted list, `mask_values`
    (commit d786714, "Winter cleanup", 2022-12-06). Between the two,
    https://github.com/milesial/Pytorch-UNet/issues/408 ("IndexError: Target 255 is out of bounds.", 2022-12-05)
    shows 8f317cb alone: on "the 3.0 version" (tag v3.0, commit 9a6ee84: NEAREST, no mapping) the reporter finds
    "the true_mask is 0 and 255" (from a label it calls "binary", "only has 01 pixel": why is not in the thread);
    the maintainer: "Hi, can you try the latest master version? Custom dataset
    support was improved." and "Yes, please try the latest master version, this should be fixed". The CUDA log is
    the same repository's https://github.com/milesial/Pytorch-UNet/issues/258 (3 classes; torch and GPU not
    given).

Fidelity: faithful in the code path of #291's train.py and dataset: `BasicDataset.preprocess`
    resizes the mask with PIL's default resample (BICUBIC for a greyscale image since Pillow 7) and
    returns its raw values, train.py casts them to long and computes
    `CrossEntropyLoss()(masks_pred, true_masks) + dice_loss(F.softmax(masks_pred, dim=1).float(),
    F.one_hot(true_masks, n_classes).permute(0, 3, 1, 2).float(), multiclass=True)` with the Dice
    code of that time (its `.item()` and its loop over channels included), except that `dice_coeff` flattens
    with `.reshape(-1)`, which came with commit db72295 ("Switch to reshape in dice coeff", 2021-08-31, after
    #291), where #291's code had `.view(-1)`: at batch 1 the two give the same value (`.view` raises at batch 2,
    torch 2.13.0); `n_classes=2`; the
    repository's defaults, batch 1 and scale 0.5 of Carvana's 1918x1280 (the user's image size is
    not given). Synthetic: the UNet's logits (seeded; the network is not run), the mask (an
    ellipse, grey 255 on 0, as a PNG mask saved from an image editor holds it; what the user's masks
    held is not in the thread beyond the grey value 192), and the resize, done by torch
    (`F.interpolate`, bicubic with antialiasing like PIL's) instead of PIL, so the grey values at
    the edges are of the same kind, not PIL's exact ones.

Symptom on CUDA: from #258; one line per failing thread, then the error:
        /pytorch/aten/src/THCUNN/SpatialClassNLLCriterion.cu:106: cunn_SpatialClassNLLCriterion_updateOutput_kernel: block: [0,0,0], thread: [725,0,0] Assertion `t >= 0 && t < n_classes` failed
        RuntimeError: CUDA error: device-side assert triggered
    Seen on an H200 (torch 2.11.0+cu130, driver 580.159, eager): no assertion line is printed at
    all, and the error surfaces at the next op that waits on the device, `F.one_hot` (which checks
    its input's range on the host), as `torch.AcceleratorError: CUDA error: device-side assert
    triggered`; an unrelated op afterwards fails too. Compiled (inductor), triton's own check
    prints `Assertion `index out of bounds: 0 <= tl.broadcast_to(tmp11, [XBLOCK, R0_BLOCK]) < 2``.

Symptom on CPU: from #291, raised at the loss itself:
        return torch._C._nn.cross_entropy_loss(input, target, weight, _Reduction.get_enum(reduction), ignore_index)
        IndexError: Target 192 is out of bounds
    Which target is named depends on the mask (here a grey value of the resized edge); torch now
    ends the message with a period.

Cause: the mask's grey values are not class indices. A mask saved with 0 and 255 gives targets 0
    and 255, and resizing it with an interpolating filter adds every grey value in between at the
    object's edge. With 2 classes only 0 and 1 are valid targets.

Fix: the repository's own (commits 8f317cb and d786714): resize masks with NEAREST, so no new grey
    value appears, and map each grey value to its index in the sorted list of the values the
    dataset's masks hold (`mask_values`: [0, 255] -> classes 0 and 1), here with a lookup table
    on the device and a range guard that does not sync the host; #408's maintainer points its reporter to this
    master for the same 255 target. Not a silencer: clamping the targets (a generic attempt) leaves the labels
    wrong, and so does the mapping without NEAREST (`mapping_without_nearest`, a generic attempt: the edge's grey
    values, in no list, stay 0). More classes
    (`one_more_class`) is #258's answer, and right for that thread: the maintainer's "If you have 3 classes you should change
    n_classes to 3 (or 4 if you include background)" counts the classes a mask of class indices holds, and a later
    commenter's "I solved this problem by adding one to args "classes"" does the same; here the data has 2 classes
    and the targets are grey values, so a third output leaves 255 and the edge's grey values out of range (it still
    raises), and no class count turns grey values into labels. Resizing with NEAREST alone
    (`nearest_without_mapping`, 8f317cb as #408 ran it) still raises at 255. The reference compares grey values
    with `mask_values` on the full-size mask's every other pixel and spells the loss out in float64. Each step's
    output is the loss and the class map it trained on, the map compared exactly: a fix that thresholds the bicubic
    resize is wrong at the object's edge, yet its loss is within 2.4e-5 relative of the reference's, inside the
    tolerance (issue 36).
"""

from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Symptom("IndexError", r"Target \d+ is out of bounds"),
    # No output line: upstream's `t >= 0 && t < n_classes` (SpatialClassNLLCriterion.cu) was printed by old builds;
    # torch 2.11 on an H200 printed no assertion line at all (triage still knows both texts)
    "cuda": Symptom("RuntimeError", r"CUDA error|device-side assert"),
}

# A class target outside [0, C) in the NLL / cross-entropy loss; the class weights indexed by a label are class_weight_index.
triage_signs = TriageSigns(
    family="a class target outside [0, n_classes) in the NLL loss",
    cause="labels past the number of classes (1-based labels, an ignore label not passed as ignore_index)",
    confirm="the target's min and max against the model's number of outputs",
    also="a model head with fewer outputs than the dataset's classes",
    signs=(
        Sign(
            "failure",
            r"\bt >= 0 && t < n_classes|cur_target >= 0 && cur_target < n_classes",
            0.9,
            "the NLL loss kernel's target check failed (Loss.cu / NLLLoss2d.cu, ClassNLLCriterion in old builds): a class target outside [0, n_classes)",
        ),
        Sign("failure", r"\bTarget -?\d+ is out of bounds", 0.9, "the CPU error of a cross-entropy / NLL target outside [0, n_classes)"),
        Sign(
            "failure",
            r"device-side assert triggered at \S*(?:Spatial)?ClassNLLCriterion\.cu",
            0.6,
            "old torch's report of a device-side assert raised in the NLL loss kernel",
        ),
        Sign(
            "failure",
            r"index out of bounds: 0 <= \S*tmp<n>",
            0.3,
            "the bounds check of torch.compile's generated code fired; alone it does not say which op: the kernel's name does",
        ),
        Sign(
            "context",
            r"^(?:cpp|triton_\w+?)_fused_(?!\w*_index_\w*_stack_)\w*?nll_loss(?:2d)?_forward\w*_\d+\(",
            0.5,
            "the compiled kernel that failed computes the NLL loss and looks up nothing else (no index and stack of class weights)",
        ),
        Sign(
            "context",
            r"\bin (?:cross_entropy|nll_loss)\b|_nn\.(?:cross_entropy_loss|nll_loss(?:2d|_nd)?)\(|F\.(?:cross_entropy|nll_loss)\(|CrossEntropyLoss\(",
            0.3,
            "raised in cross entropy / the NLL loss",
        ),
        Sign("support", r"n_classes|num_classes|num_labels|ignore_index", 0.1, "the number of classes or an ignore label in play"),
        Sign(
            "support",
            r"CUDA error: device-side assert triggered",
            0.1,
            "an asynchronous CUDA error, as the loss kernel's assert surfaces later",
        ),
        Sign(
            "veto",
            r"IndexKernel\.cu|index -?\d+ is out of bounds for dimension|_fused_\w*?_index_\w*?nll_loss\w*?_stack_",
            0,
            "an index past the class weights (class_weight_index), not the loss's target check",
        ),
    ),
)

compiled_unit = "the training step's targets and loss: the mask's resize and conversion, then cross entropy plus Dice"


class Inputs(NamedTuple):
    masks_pred: torch.Tensor  # (N, n_classes, h, w) float32 logits: the UNet's output (synthetic)
    mask_image: torch.Tensor  # (N, H, W) uint8 grey mask as stored: 0 background, 255 object
    class_mask_image: torch.Tensor  # (N, H, W) uint8: the same mask stored as class indices (what Carvana's GIFs hold)
    mask_values: torch.Tensor  # (K,) uint8: the grey values the dataset's masks hold, sorted
    n_classes: int


def make_inputs(cfg, device):
    sizes = cfg.sizes
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = torch.arange(sizes.height, dtype=torch.float32).view(-1, 1)
    columns = torch.arange(sizes.width, dtype=torch.float32).view(1, -1)
    masks = []
    for _ in range(sizes.batch):  # one seeded ellipse per image, the object
        centre_y, centre_x, radius_y, radius_x = (torch.rand(4, generator=generator) * 0.3 + 0.35).tolist()
        inside = ((rows / sizes.height - centre_y) / (radius_y * 0.8)) ** 2 + (
            (columns / sizes.width - centre_x) / (radius_x * 0.8)
        ) ** 2 < 1
        masks.append(inside)
    inside = torch.stack(masks)  # (N, H, W) bool
    mask_values = torch.tensor(cfg.mask_values, dtype=torch.uint8)
    height, width = scaled_size(sizes.height, sizes.width, cfg.img_scale)
    return Inputs(
        masks_pred=torch.randn(sizes.batch, cfg.n_classes, height, width, generator=generator).to(device),
        mask_image=mask_values[inside.long()].to(device),
        class_mask_image=inside.to(torch.uint8).to(device),
        mask_values=mask_values.to(device),
        n_classes=cfg.n_classes,
    )


def scaled_size(height, width, scale):
    return int(scale * height), int(scale * width)  # BasicDataset.preprocess: newW, newH = int(scale * w), int(scale * h)


# -- Pytorch-UNet as of #291 ----------------------------------------------------------------


def dice_coeff(input, target, reduce_batch_first=False, epsilon=1e-6):
    """utils/dice_score.py as of commit db72295 (2021-08-31): #291's code, of f6185d6, had `.view(-1)` where this has
    `.reshape(-1)`; at batch 1 both give the same value."""
    assert input.size() == target.size()
    if input.dim() == 2 and reduce_batch_first:
        raise ValueError(f"Dice: asked to reduce batch but got tensor without batch dimension (shape {input.shape})")
    if input.dim() == 2 or reduce_batch_first:
        inter = torch.dot(input.reshape(-1), target.reshape(-1))
        sets_sum = torch.sum(input) + torch.sum(target)
        if sets_sum.item() == 0:
            sets_sum = 2 * inter
        return (2 * inter + epsilon) / (sets_sum + epsilon)
    dice = 0
    for i in range(input.shape[0]):
        dice += dice_coeff(input[i, ...], target[i, ...])
    return dice / input.shape[0]


def multiclass_dice_coeff(input, target, reduce_batch_first=False, epsilon=1e-6):
    assert input.size() == target.size()
    dice = 0
    for channel in range(input.shape[1]):
        dice += dice_coeff(input[:, channel, ...], target[:, channel, ...], reduce_batch_first, epsilon)
    return dice / input.shape[1]


def dice_loss(input, target, multiclass=False):
    assert input.size() == target.size()
    fn = multiclass_dice_coeff if multiclass else dice_coeff
    return 1 - fn(input, target, reduce_batch_first=True)


def training_loss(masks_pred, true_masks, n_classes):
    """train.py's loss: cross entropy, then Dice on the softmax against the one-hot targets."""
    return F.cross_entropy(masks_pred, true_masks) + dice_loss(
        F.softmax(masks_pred, dim=1).float(), F.one_hot(true_masks, n_classes).permute(0, 3, 1, 2).float(), multiclass=True
    )


def loss_and_labels(masks_pred, true_masks, n_classes):
    """What the step computes: train.py's loss, and the class map it trained on. The map is compared exactly: a wrong
    class at the object's edge moves the loss by only 2.4e-5 relative, inside its tolerance."""
    return {"loss": training_loss(masks_pred, true_masks, n_classes), "labels": true_masks}


def resize_as_pil_default(mask, size):
    """`pil_img.resize((newW, newH))`: a greyscale image resampled BICUBIC (antialiased), rounded back to uint8."""
    resized = F.interpolate(mask.unsqueeze(1).float(), size=size, mode="bicubic", antialias=True, align_corners=False)
    return resized.round().clamp(0, 255).to(torch.uint8).squeeze(1)


def resize_nearest(mask, size):
    """`pil_img.resize((newW, newH), resample=Image.NEAREST)`: no new grey value appears."""
    return F.interpolate(mask.unsqueeze(1), size=size, mode="nearest").squeeze(1)


def buggy(x):
    true_masks = resize_as_pil_default(x.mask_image, x.masks_pred.shape[-2:]).long()  # grey values as targets
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def fixed(x):
    true_masks = class_indices(resize_nearest(x.mask_image, x.masks_pred.shape[-2:]), x.mask_values)
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def class_indices(mask, mask_values):
    """Each grey value's index in `mask_values`, read from a 256-entry table on the device; a value the list lacks
    fails here, without a host sync (on CUDA a device-side assert)."""
    table = torch.full((256,), -1, dtype=torch.long, device=mask.device)
    table[mask_values.long()] = torch.arange(len(mask_values), device=mask.device)
    classes = table.index_select(0, mask.reshape(-1).long()).view(mask.shape)
    torch._assert_async(classes.min() >= 0, "a mask holds a grey value outside mask_values")
    return classes


def reference(x):
    """Every other pixel of the full-size mask compared with the grey values; the loss in float64."""
    targets = (x.mask_image[:, ::2, ::2].unsqueeze(-1) == x.mask_values).long().argmax(-1)  # scale 0.5
    if targets.shape != x.masks_pred.shape[:1] + x.masks_pred.shape[2:]:
        raise ValueError("the reference takes every other pixel: it needs img_scale 0.5 and even sizes")
    log_probs = torch.log_softmax(x.masks_pred.double(), dim=1)
    cross_entropy = -log_probs.gather(1, targets.unsqueeze(1)).mean()
    probs = log_probs.exp()  # (N, C, h, w)
    dice = []
    for c in range(x.n_classes):
        is_c = (targets == c).double()
        overlap = (probs[:, c] * is_c).sum()
        dice.append((2 * overlap + 1e-6) / (probs[:, c].sum() + is_c.sum() + 1e-6))
    return {"loss": (cross_entropy + 1 - sum(dice) / x.n_classes).to(x.masks_pred.dtype), "labels": targets}


def speed_baseline(x):
    """The same step on masks already stored as class indices: the loss on valid labels, nothing to convert."""
    true_masks = resize_nearest(x.class_mask_image, x.masks_pred.shape[-2:]).long()
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


# -- bad fixes: plausible, and wrong --------------------------------------------------------


def clamp_targets(x):
    """Squeeze the grey values into [0, n_classes) with a clamp (a generic attempt, not from the cited threads): every
    grey edge value and 255 become class 1."""
    true_masks = resize_as_pil_default(x.mask_image, x.masks_pred.shape[-2:]).long().clamp(0, x.n_classes - 1)
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def one_more_class(x):
    """The answer in https://github.com/milesial/Pytorch-UNet/issues/258, a head with n_classes + 1 outputs: right
    where the masks hold class indices and a class (the background) went uncounted, which is what #258's maintainer
    answered; here the targets are grey values, 255 is still past 3 classes, and it still raises."""
    masks_pred = torch.cat([x.masks_pred, x.masks_pred[:, :1]], dim=1)  # the extra output's values do not matter
    true_masks = resize_as_pil_default(x.mask_image, x.masks_pred.shape[-2:]).long()
    return loss_and_labels(masks_pred, true_masks, x.n_classes + 1)


def nearest_without_mapping(x):
    """Commit 8f317cb alone (tag v3.0, as https://github.com/milesial/Pytorch-UNet/issues/408 ran it: "the true_mask
    is 0 and 255"): no grey edge any more, but 255 is still a target."""
    true_masks = resize_nearest(x.mask_image, x.masks_pred.shape[-2:]).long()
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


def mapping_without_nearest(x):
    """Commit d786714's mapping on a mask resized with the default filter (a generic attempt, half of the fix, not
    from the cited threads): edge values not in mask_values stay 0."""
    resized = resize_as_pil_default(x.mask_image, x.masks_pred.shape[-2:])
    true_masks = torch.zeros(resized.shape, dtype=torch.long, device=resized.device)
    for i, value in enumerate(x.mask_values.tolist()):
        true_masks[resized == value] = i
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


bad_fixes = {
    "clamp_targets": clamp_targets,
    "one_more_class": one_more_class,
    "nearest_without_mapping": nearest_without_mapping,
    "mapping_without_nearest": mapping_without_nearest,
}


# -- slow fixes: correct targets, slower than the budget allows ----------------------------


def remap_pixel_by_pixel(x):
    """The grey values as a Python list, each looked up in a dict, back to a tensor."""
    resized = resize_nearest(x.mask_image, x.masks_pred.shape[-2:])
    true_masks = remap_in_python(resized, x.mask_values)
    return loss_and_labels(x.masks_pred, true_masks, x.n_classes)


@torch.compiler.disable  # a user's Python loop stays Python: dynamo would unroll it over every pixel (past 300 s)
def remap_in_python(resized, mask_values):
    index_of = {value: i for i, value in enumerate(mask_values.tolist())}
    classes = [index_of[value] for value in resized.flatten().tolist()]
    return torch.tensor(classes, device=resized.device).view(resized.shape)


def mask_values_per_batch_on_the_host(x):
    """Pytorch-UNet's scan of the masks (`unique_mask_values`, np.unique of the full-size mask), run for every batch
    on the host to validate it, then its mapping loop."""
    found = np.unique(x.mask_image.cpu().numpy())
    mask_values = x.mask_values.cpu().numpy()
    if not np.isin(found, mask_values).all():
        raise ValueError(f"masks hold grey values {sorted(set(found.tolist()) - set(mask_values.tolist()))} outside mask_values")
    resized = resize_nearest(x.mask_image, x.masks_pred.shape[-2:]).cpu().numpy()
    true_masks = np.zeros(resized.shape, dtype=np.int64)
    for i, value in enumerate(mask_values):
        true_masks[resized == value] = i
    return loss_and_labels(x.masks_pred, torch.from_numpy(true_masks).to(x.masks_pred.device), x.n_classes)


slow_fixes = {"remap_pixel_by_pixel": remap_pixel_by_pixel, "mask_values_per_batch_on_the_host": mask_values_per_batch_on_the_host}
