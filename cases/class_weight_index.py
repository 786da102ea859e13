r"""Class-weighted cross entropy looks up a weight for the ignore label 255: PIDNet-S on Cityscapes.

Upstream: https://github.com/open-mmlab/mmsegmentation/issues/3724 (PIDNet-S on Cityscapes),
    https://github.com/open-mmlab/mmsegmentation/issues/3574 and
    https://github.com/open-mmlab/mmsegmentation/issues/3864 (other datasets, same line). The code is
    `cross_entropy` in mmseg/models/losses/cross_entropy_loss.py of mmsegmentation 1.2.2, the newest
    release; no release fixes it. In the 1.2.0 and 1.2.1 wheels the same lookup sits in
    `torch.tensor([...])`, which fails on any batch, 255 or not (ValueError: only one element
    tensors can be converted to Python scalars); 1.1.2 has no class-weighted denominator.

Fidelity: faithful in the code path and the config: the installed mmsegmentation 1.2.2
    `CrossEntropyLoss`, its source run unchanged, built by mmseg's `MODELS` registry from PIDHead's
    `loss_decode[0]` dict of pidnet-s_2xb6-120k_1024x1024-cityscapes.py (19 class weights,
    loss_weight 0.4) and called as PIDHead's `loss_by_feat` calls it: logits (N, 19, H, W) at the
    label's size, `ignore_index=255`, labels carrying Cityscapes' own void label 255 and
    SegDataPreProcessor's padding (`seg_pad_val=255`) below the resized image. Changed:
    `avg_non_ignore=True` (the config leaves the default False; the crash comes before the flag is
    read), batch 2 and a 512x512 crop (the full 1024x1024 crop in the speed phase on CUDA). Synthetic: the logits, the
    class of each pixel and which pixels are void (seeded), and one padding height for the batch.
    mmseg.models' `__init__` imports every model, which needs mmcv's compiled ops (mmcv-lite has
    none), so `upstream()` creates the packages mmseg.models and mmseg.models.losses without running
    their `__init__` and imports the loss module file itself as usual.

Symptom on CUDA: from the threads. Many lines of a device-side assertion (#3724):
        ...\aten\src\ATen\native\cuda\IndexKernel.cu:92: block: [525,0,0], thread: [96,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.
    then, at whichever op synchronises next (in #3574 the boolean index in mmseg's `accuracy`):
        RuntimeError: CUDA error: device-side assert triggered
    Older torch builds word the assertion `index >= -sizes[i] && index < sizes[i] && "index out of
    bounds"` (the log in PR #3457). Here the boolean mask that `avg_non_ignore=True` applies right
    after the lookup was expected to be the first op to synchronise. Seen on an H200 (torch
    2.11.0+cu130, CUDA 13.0, driver 580.159): `IndexKernel.cu:111: operator(): ... Assertion
    `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.`, then
    `torch.AcceleratorError: CUDA error: device-side assert triggered` at the lookup's own line
    (`torch.stack([class_weight[cls] for cls in label])`: moving the stack back to the weights' device
    synchronises); an unrelated op afterwards fails too. Compiled: triton's `index out of bounds: 0 <=
    tl.broadcast_to(tmp42, [XBLOCK, R0_BLOCK]) < 19`.

Symptom on CPU: raised at the lookup itself, in the list comprehension over the batch:
        IndexError: index 255 is out of bounds for dimension 0 with size 19

Cause: the mean's denominator is `torch.stack([class_weight[cls] for cls in label])`, a weight looked
    up for every pixel before `label == ignore_index` is masked out. 255 (void and padding) is no
    class of the 19. The loss itself, `F.cross_entropy(..., ignore_index=255)`, handles 255; only
    this lookup fails.

Fix: where upstream's arguments make its mean exactly PyTorch's weighted mean (`avg_non_ignore=True`,
    class weights, no per-pixel weight, no `avg_factor`, reduction mean: PIDHead's call), take the fused
    `F.cross_entropy(pred, label, weight=w, ignore_index=255)`. Elsewhere keep upstream's own path and
    hand it the denominator it fails to compute, without looking up ignored pixels and without the
    Python loop: append one weight for "ignored" (0 for `avg_non_ignore=True`, 1 for False), send
    ignored pixels to it, sum, and pass that as `avg_factor`, which skips the broken branch. False
    keeps every pixel in the denominator, a labelled one by its class weight and an ignored one (no
    class) by 1: with all weights 1 that is upstream's unweighted `label.numel()`, with nothing
    ignored it equals True. The reference spells the mean out in float64 (log-softmax, gather,
    weighted sums), so the check does not compare the fused call with itself. Thread workarounds: commenting out
    the class-weight branch (#3574, #3724) divides the weighted sum by all pixels: on the yaml's inputs the loss is 0.970 for the reference's 1.362 (0.71x; 28.7% of the pixels are void or padding). Padding with -1 and `ignore_index=-1` (#3864) crashes on Cityscapes, whose own void label
    is 255; with every ignored pixel -1 it gives the right value for True only because
    `class_weight[-1]` wraps to the last class before the mask zeroes it (see the test file).

Speed: one thread, the 512x512 crop, against fused `F.cross_entropy(pred, label, weight=w, ignore_index=255)`
    inside mmseg's own wrapper, budget 1.05x, room for the timing's noise (the fix is that call in that wrapper,
    one `if` apart: 0.994x in one run of tools/cuda_profile_fixes.py --device cpu, medians of 200 interleaved
    calls). Until 2026-11-27 the baseline was the fused call alone: on
    CPU the wrapper adds about 10 us to 17 ms, but on an H200 the fix came out 1.11x of it, and the wrapper, by
    its source, makes a class-weight tensor from a list on every call (a host copy that waits for the GPU) and
    multiplies by `loss_weight`, costs no fix handed to it can avoid. Measured apart on the H200 (2026-11-27): the
    wrapper alone is 1.365x the bare call, the fix 0.963x the wrapper; the speed phase 1.000x [0.995, 1.004].
    Figures below were measured against the fused call alone. Measured on torch 2.13.0 (a 2-core machine loaded by
    other timings): the fix 0.90-1.05x eager, 0.95-1.03x compiled, within the budget or, under load, undecided at
    it ([1.009, 1.095] at worst), never over. Slow controls, correct, each flagged with its interval's low end
    at least 1.3x the budget: the ignored pixels dropped before the loss (`labelled_pixels_only`: a boolean
    index copies every labelled pixel's logits, channels last), 2.0-2.4x eager (low ends 1.57-1.90, four runs) and
    3.3-3.6x compiled (2.26-2.74), on torch 2.4.1 2.2x eager and 2.1-2.3x compiled (low ends 1.77-2.15), on 2.11.0
    2.2x and 3.4-3.5x; the mean written class by class (`weighted_mean_class_by_class`: a boolean index and a
    cross entropy per class), 7.9-9.4x eager, 10.7-15.9x compiled (low ends 5.5 and up), 8.2-9.4x on 2.4.1 and
    9.3-12.1x on 2.11.0. Both keep their extra work where inductor cannot reach it: a boolean index has a size
    only the host knows, so dynamo breaks the graph there (the class loop's frame runs eager whole). No longer
    controls: upstream's unfused path handed the masked denominator (the fix's own path for other arguments),
    1.25-1.37x eager but 0.59-0.62x (torch 2.9.1, 2.11.0) to 1.14x compiled, and the denominator counted with
    `(label == c).sum()` per class, 1.45-1.69x eager and 0.56-1.47x compiled (the matrix's records): inductor fuses
    both, and they were missed or their low ends within 1.3x of the budget. Nor the count through a boolean index
    per class (`label[label == c].numel()`, 2.0-3.9x): one interval's low end at 1.40x (torch 2.4.1 compiled, one
    timing process at 0.45x), and a class loop like the one kept. Three timing processes at least
    (`speed.min_processes`): two give Student's t of 12.7, and a control at 2.3x came out [1.43, 3.67] under
    load; three give 4.3.
"""

import copy
import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

INSTALL = "pip install 'mmsegmentation==1.2.2' 'mmcv-lite>=2.0.0rc4,<2.2.0' 'mmengine>=0.5,<1.0'"

symptoms = {
    "cpu": Symptom("IndexError", r"index 255 is out of bounds for dimension 0 with size 19"),
    "cuda": Symptom(
        "RuntimeError",
        r"CUDA error|device-side assert",
        output=r"IndexKernel\.cu.*index out of bounds",  # `-sizes[i] <= index && ...` or, in older builds, `index >= -sizes[i] && ...`
    ),
}

compiled_unit = "the loss: mmseg's CrossEntropyLoss with class weights, as the decode head calls it"

# Advanced indexing past a tensor, claimed here only where a loss looks up class weights or an ignore label is the index.
triage_signs = TriageSigns(
    family="an index past a tensor's size in advanced indexing (`weight[target]`)",
    cause="an ignore label (255 or -100) used to index the class weights of a loss",
    confirm="the index in the message is an ignore label (255, -100) and the indexed tensor is a class-weight vector (mmseg's avg_non_ignore, a weighted loss)",
    also="any `tensor[idx]` with an index past its size: boxes, keep-indices, labels against a lookup table",
    needs_context=True,
    signs=(
        Sign(
            "failure",
            r"IndexKernel\.cu.*index out of bounds",
            0.6,
            "CUDA's advanced-indexing kernel (IndexKernel.cu) asserted an index out of bounds",
            family=True,
        ),
        Sign(
            "failure",
            r"index -?\d+ is out of bounds for dimension \d+ with size \d+",
            0.6,
            "the CPU error of advanced indexing past a tensor's size",
            family=True,
        ),
        Sign(
            "failure",
            r"vectorized gather kernel index out of bounds",
            0.45,
            "CUDA's vectorized gather kernel (indexing in newer torch) asserted an index out of bounds",
        ),
        Sign(
            "failure",
            r"index out of bounds: 0 <= \S*tmp<n>",
            0.45,
            "the bounds check of torch.compile's generated code (inductor on CPU or triton) fired; alone it does not say which op",
        ),
        Sign(
            "failure",
            r"only one element tensors can be converted to Python scalars",
            0.45,
            "mmseg 1.2.0/1.2.1's `torch.tensor([class_weight[cls] for cls in label])` fails this way before it can index",
        ),
        Sign(
            "failure",
            r"CUDA error: device-side assert triggered|cudaErrorAssert",
            0.15,
            "an asynchronous CUDA error: the indexing kernel's assert surfaces at a later op (mmseg's accuracy)",
        ),
        Sign(
            "failure",
            r"(?i)\bignore_index\b",
            0.5,
            "a report in words: the class weights indexed with the ignore label (an IndexError or out-of-bounds index beside ignore_index and the weights)",
            family=True,
            near=(r"(?i)\bweights?\b", r"(?i)\bIndexError\b|\bout[- ]of[- ]bounds?\b|\bindex out of range\b"),
        ),
        Sign(
            "context", r"(?i)\bweights?\[ *(?:target|label|gt)s? *\]", 0.4, "the class weights indexed by the target, ignore labels and all"
        ),
        Sign("context", r"class_weight", 0.5, "class weights in play"),
        Sign("context", r"index (?:255|-100) is out of bounds", 0.5, "the index is an ignore label (255 or -100)"),
        Sign(
            "context",
            r"cross_entropy_loss\.py| in (?:weighted_|binary_)?cross_entropy\b|losses/\w+\.py",
            0.35,
            "raised in a cross-entropy loss",
        ),
        Sign("context", r"mmseg\b|mmsegmentation", 0.35, "mmsegmentation in the frames"),
        Sign(
            "context",
            r"accuracy\.py.*\bin accuracy\b|correct\[:, target != ignore_index\]",
            0.3,
            "surfaced in mmseg's accuracy, the first op to sync after the loss",
        ),
        Sign(
            "context",
            r"_fused_\w*?_index_\w*?nll_loss\w*?_stack_",
            0.35,
            "the failing compiled kernel fuses the loss with an index and a stack: the weights gathered per label",
        ),
        Sign(
            "support",
            r"tmp<n>(?:, \[[\w, ]+\]\))? < 19L?\b",
            0.2,
            "the bound is 19, Cityscapes' classes (and so also the bound of an NLL target there; triton may broadcast the index first)",
        ),
        Sign("support", r"ignore_index|avg_non_ignore|seg_pad_val", 0.2, "an ignore label in play"),
        Sign(
            "veto",
            r"t >= 0 && t < n_classes|Target -?\d+ is out of bounds|ClassNLLCriterion|target_val >= zero && target_val <= one",
            0,
            "a loss target out of range (NLL or binary cross-entropy), not an index into the class weights",
        ),
        Sign(
            "veto",
            r"^(?:cpp|triton_\w+?)_fused_(?:_log_softmax_)?nll_loss(?:2d)?_forward_\d+\(",
            0,
            "the compiled kernel that failed holds the NLL loss alone: a target out of range, no index into the class weights",
        ),
        Sign(
            "veto",
            r"ScatterGatherKernel\.cu|weight tensor should be defined either for all or no classes",
            0,
            "a scatter/gather index or a class-weight vector of the wrong length, not the ignore label indexing the weights",
        ),
    ),
)


@functools.cache
def upstream():
    """mmseg/models/losses/cross_entropy_loss.py of the installed mmsegmentation, imported without
    running the `__init__` of mmseg.models and mmseg.models.losses (both stay package objects of
    their real folders, so the module's own imports and mmseg's registry work as in training)."""
    try:
        import mmseg  # asserts the mmcv and mmengine versions it supports
    except (ImportError, AssertionError) as error:
        raise ImportError(f"class_weight_index runs mmsegmentation's own loss: {INSTALL} ({error})") from error
    root = Path(mmseg.__file__).parent
    for name in ("mmseg.models", "mmseg.models.losses"):
        if name not in sys.modules:
            folder = root.joinpath(*name.split(".")[1:])
            spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
            sys.modules[name] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    importlib.import_module("mmengine.model")  # what MODELS.build imports on first use
    return importlib.import_module("mmseg.models.losses.cross_entropy_loss")


def preload():
    """mmseg's loss and mmengine.model (1.0 s with torch loaded, 3.4 s from a cold disk): once in the fork server,
    rather than in every child (harness/preload.py)."""
    upstream()


class Inputs(NamedTuple):
    pred: torch.Tensor  # (N, 19, H, W) logits at the label's size
    label: torch.Tensor  # (N, H, W) long: classes 0..18, void 255, padding seg_pad_val below image_height
    class_weight: torch.Tensor  # (19,)
    loss_weight: float
    ignore_index: int
    image_height: int
    loss: nn.Module  # upstream CrossEntropyLoss built from the config dict


def make_inputs(cfg, device):
    config = OmegaConf.to_container(cfg.loss)
    if not config["avg_non_ignore"]:
        raise ValueError("the reference is F.cross_entropy's mean, i.e. avg_non_ignore=True; False is tested in tests/")
    sizes = cfg.sizes
    if sizes.image_height > sizes.height:
        raise ValueError(f"image_height {sizes.image_height} is taller than the crop ({sizes.height})")
    generator = torch.Generator().manual_seed(cfg.seed)
    classes = len(config["class_weight"])
    label = torch.randint(0, classes, (sizes.batch, sizes.height, sizes.width), generator=generator)
    label[torch.rand(label.shape, generator=generator) < cfg.void_fraction] = 255  # Cityscapes' void label
    label[:, sizes.image_height :] = cfg.seg_pad_val
    pred = torch.randn(sizes.batch, classes, sizes.height, sizes.width, generator=generator)
    return Inputs(
        pred=pred.to(device),
        label=label.to(device),
        class_weight=torch.tensor(config["class_weight"], device=device),
        loss_weight=config["loss_weight"],
        ignore_index=cfg.ignore_index,
        image_height=sizes.image_height,
        loss=build_loss(config),
    )


def build_loss(config, criterion=None):
    """The mm way: a config dict through mmseg's MODELS registry; `criterion` replaces its `cross_entropy`."""
    loss = upstream().MODELS.build(dict(config))
    if criterion is not None:
        loss.cls_criterion = criterion
    return loss


def buggy(x):
    return x.loss(x.pred, x.label, ignore_index=x.ignore_index)  # as PIDHead.loss_by_feat calls loss_decode[0]


def fixed(x):
    loss = copy.copy(x.loss)  # the inputs carry upstream's loss only: the fix is not handed to whoever grades against it
    loss.cls_criterion = fixed_cross_entropy
    return loss(x.pred, x.label, ignore_index=x.ignore_index)


def fixed_cross_entropy(
    pred, label, weight=None, class_weight=None, reduction="mean", avg_factor=None, ignore_index=-100, avg_non_ignore=False
):
    """Upstream's `cross_entropy`, fused where its arguments allow, else handed the denominator it fails to compute."""
    if class_weight is not None and avg_non_ignore and weight is None and avg_factor is None and reduction == "mean":
        return F.cross_entropy(pred, label, weight=class_weight, ignore_index=ignore_index)  # exactly PyTorch's weighted mean
    if avg_factor is None and reduction == "mean" and class_weight is not None:
        avg_factor = class_weighted_count(label, class_weight, ignore_index, avg_non_ignore)
    return upstream().cross_entropy(pred, label, weight, class_weight, reduction, avg_factor, ignore_index, avg_non_ignore)


def class_weighted_count(label, class_weight, ignore_index, avg_non_ignore):
    """Sum over pixels of their class weight; an ignored pixel counts 0 (avg_non_ignore) or 1."""
    weights = F.pad(class_weight, (0, 1), value=0.0 if avg_non_ignore else 1.0)  # (C + 1,): the last is "ignored"
    return weights[torch.where(label == ignore_index, len(class_weight), label)].sum()


def reference(x):
    """Computed in float64, returned in the loss's own dtype."""
    return (x.loss_weight * weighted_mean_nll(x.pred, x.label, x.class_weight, x.ignore_index, avg_non_ignore=True)).to(x.pred.dtype)


def weighted_mean_nll(pred, label, class_weight, ignore_index, avg_non_ignore):
    """The class-weighted mean spelled out in float64: sum of w[y] * -log softmax(pred)[y] over labelled
    pixels, divided by the sum of w[y] over them, plus 1 per ignored pixel unless `avg_non_ignore`."""
    log_probs = torch.log_softmax(pred.double(), dim=1)  # (N, C, H, W)
    labelled = label != ignore_index
    target = torch.where(labelled, label, 0)
    nll = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N, H, W)
    weights = class_weight.double()[target] * labelled
    denominator = weights.sum() if avg_non_ignore else weights.sum() + (~labelled).sum()
    return (weights * nll).sum() / denominator


def speed_baseline(x):
    """PyTorch's fused weighted mean inside mmseg's own `CrossEntropyLoss.forward`: the least a fix handed to that
    wrapper can cost. The wrapper is upstream's, not the fix's: it makes its class-weight tensor from a list on
    every call (`cls_score.new_tensor(self.class_weight)`: on CUDA a copy from pageable host memory, which waits
    for the GPU) and multiplies by `loss_weight`. On an H200 the fix, which is that fused call in the wrapper, took
    1.11x the fused call alone (results/cuda_evidence/2026-11-25); side by side (tools/cuda_profile_fixes.py,
    2026-11-27) the wrapper alone is 1.365x that call, one host copy and one stream sync a call."""
    loss = copy.copy(x.loss)
    loss.cls_criterion = fused_weighted_mean
    return loss(x.pred, x.label, ignore_index=x.ignore_index)


def fused_weighted_mean(pred, label, weight=None, class_weight=None, ignore_index=-100, **_):  # mmseg's criterion signature; PIDHead's call
    return F.cross_entropy(pred, label, weight=class_weight, ignore_index=ignore_index)


def upstream_without_void(x):
    """Upstream's own loss on the same batch with every ignored pixel relabelled: the code that worked before."""
    return x.loss(x.pred, torch.where(x.label == x.ignore_index, 0, x.label), ignore_index=x.ignore_index)


def cross_entropy_branch_commented_out(
    pred, label, weight=None, class_weight=None, reduction="mean", avg_factor=None, ignore_index=-100, avg_non_ignore=False
):
    """Upstream's `cross_entropy` as #3724 ran it: the class-weight `else:` commented out, so avg_factor stays None."""
    loss = F.cross_entropy(pred, label, weight=class_weight, reduction="none", ignore_index=ignore_index)
    return upstream().weight_reduce_loss(loss, weight=weight, reduction=reduction, avg_factor=avg_factor)


def comment_out_class_weight_branch(x):
    """The class-weight branch commented out, as in https://github.com/open-mmlab/mmsegmentation/issues/3574 and
    https://github.com/open-mmlab/mmsegmentation/issues/3724: the weighted sum divided by the number of pixels,
    ignored ones included, unweighted."""
    loss = copy.copy(x.loss)
    loss.cls_criterion = cross_entropy_branch_commented_out
    return loss(x.pred, x.label, ignore_index=x.ignore_index)


def pad_with_minus_one(x):
    """`seg_pad_val=-1` and `ignore_index=-1`, as in https://github.com/open-mmlab/mmsegmentation/issues/3864;
    Cityscapes' own void pixels stay 255."""
    label = x.label.clone()
    label[:, x.image_height :] = -1
    return x.loss(x.pred, label, ignore_index=-1)


bad_fixes = {"comment_out_class_weight_branch": comment_out_class_weight_branch, "pad_with_minus_one": pad_with_minus_one}


# -- slow fixes: correct, but slower than the budget allows ---------------------------------


def labelled_pixels_only(x):
    """Drop the ignored pixels before the loss, so that nothing looks 255 up: the logits of every labelled pixel
    copied out channels last (a boolean index, whose size only the host knows), then the plain weighted mean."""
    labelled = x.label != x.ignore_index
    logits = x.pred.permute(0, 2, 3, 1)[labelled]  # (labelled pixels, C)
    return x.loss_weight * F.cross_entropy(logits, x.label[labelled], weight=x.class_weight)


def weighted_mean_class_by_class(x):
    """The weighted mean as its definition reads, one class at a time: each class's pixels selected by a boolean
    index, their summed loss times the class weight, over the weighted count; 255 belongs to no class."""
    logits = x.pred.permute(0, 2, 3, 1)
    total = denominator = 0
    for c in range(len(x.class_weight)):
        selected = x.label == c
        total = total + x.class_weight[c] * F.cross_entropy(logits[selected], x.label[selected], reduction="sum")
        denominator = denominator + x.class_weight[c] * selected.sum()
    return x.loss_weight * total / denominator


slow_fixes = {"labelled_pixels_only": labelled_pixels_only, "weighted_mean_class_by_class": weighted_mean_class_by_class}
