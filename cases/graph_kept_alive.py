"""A validation loop that sums its loss tensors, so every batch's autograd graph stays alive until CUDA runs out.

Upstream: https://github.com/zoogzog/chexnet/issues/19 ("CUDA Memory Error", 2019-05-29), in
    ChexnetTrainer.epochVal of zoogzog/chexnet (DenseNet-121, 14 chest X-ray findings, batch 16, 224x224
    crops), the validation pass `train` runs after every training epoch. The loop wraps its batches in
    `Variable(..., volatile=True)` and sums `losstensorMean += losstensor`. From torch 0.4 on, `volatile`
    "was removed and now has no effect", so each batch's forward records its graph, and the running sum keeps
    all of them, with every activation DenseNet saved for a backward that never comes. The OOM is in
    epochVal; "Have tried editing batch size, still no solution". A second user (dgrechka), a commenter, not a
    maintainer, answers that the code was written for torch 0.3.1 and that `with torch.no_grad():` in place
    of `volatile=True` "solved the issue" for them; no maintainer answers in the part read, #19 is still open,
    and the repository's code was never changed (its last commit is of 2018-01-29). The same loop earlier:
    https://github.com/zoogzog/chexnet/issues/12 (2xTesla K80, batch 16, out of memory "at the end of the
    first epoch"), where another user blames the sum and suggests `losstensorMean += losstensor.data[0]`,
    and where #19's reporter writes the day #19 was filed (2019-05-29): "The problem is still ongoing, any
    suggestions?? Adding [0] or .item() does not work either, even for batch size of 2." So the threads do
    not establish that the running sum alone ran the card out: the graph each batch records is as supported a
    cause. The torch version of either report is not stated; #19's message
    format (`cached`) is that of torch 1.0-1.3. PyTorch's FAQ "My model reports 'cuda runtime error(2): out of
    memory'" explains the family ("Don't accumulate history across your training loop", `total_loss += loss`);
    its own discussion (https://github.com/pytorch/pytorch/pull/5251) notes that where `loss.backward()` runs
    the backward frees the saved tensors and only the graph's nodes stay: the large leak is a graph that no
    backward frees, as here.

Fidelity: faithful in the network (torchvision's DenseNet-121 layout, written out here since torchvision is
    not installed: growth 32, blocks 6-12-24-16, bottleneck 4x, a Linear(1024, 14) and a Sigmoid as chexnet's
    DenseNet121 sets its classifier), the loss (BCELoss, mean), the batch of 16, the 14 labels, `model.eval()`,
    and epochVal's statements: `losstensor = loss(varOutput, varTarget)`, `losstensorMean += losstensor`,
    `lossVal += ...`, `lossValNorm += 1`. One call is one validation batch; the epoch's running sums live in
    the inputs and carry from call to call, as they do in the loop. Synthetic: the crop is 32x32, not 224x224
    (a 224 crop costs ~1.5 s a batch on a 2-core CPU; the graph kept per batch scales with the crop's area,
    about 49x more at 224), the weights are seeded random ones (chexnet starts from ImageNet's), the images are
    seeded noise and the labels seeded draws; the validation set is one batch validated again at every step
    (`sizes.batches: 1`), so that each step's running mean is that batch's loss, the one answer a check of any
    single step can know; no DataParallel, no DataLoader. `lossVal += losstensor.data[0]` is written
    `.item()`: `.data[0]` of a 0-dim tensor raises IndexError from torch 0.5 on, so the code that reached
    #19's OOM had it replaced (how is not shown).

Symptom on CUDA: in epochVal (#19; torch version not stated; the message is one line, the thread wraps it):
        RuntimeError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 1; 11.17 GiB total capacity; 10.68 GiB already allocated; 64.00 KiB free; 188.49 MiB cached)
    The OOM comes after as many batches as the card holds graphs; what is measured is the growth that leads to
    it: on an H200 (torch 2.11.0+cu130, CUDA 13.0, driver 580.159), 40.47 MiB kept a batch by the caching allocator, the fix 0 B.

Symptom on CPU: no error at these sizes: the retained memory grows by one batch's graph per batch (42.4 MiB
    a batch at batch 16 and a 32x32 crop, against ~1 KiB for the fix; the memory phase, torch 2.13.0), until
    the host runs out: the OOM killer ends the process, or an allocation fails with the form torch 2.13.0
    prints (here for a 32 TiB request, not from the thread, which is on CUDA):
        RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 35184372088832 bytes. Error code 12 (Cannot allocate memory)

Cause: `volatile=True` no longer turns autograd off, and the parameters require grad, so every forward builds
    a graph whose nodes keep the activations they would need for a backward. `losstensor` is the graph's root;
    `losstensorMean += losstensor` makes it an input of the running sum, which lives to the end of the epoch,
    so no batch's graph is ever freed. Nothing raises until an allocation fails. Which of the two ran #19's
    card out, the sum keeping every graph or the graph recorded per batch, the threads do not settle: in #12
    the same reporter says `.item()` "does not work either" (Upstream). The case measures the sum's growth;
    the fix removes both.

Fix: dgrechka's (#19), a commenter's, not a maintainer's: run the validation batches under
    `torch.no_grad()`, as the warning for `volatile` says; no graph is recorded and the sum adds plain
    numbers. Detaching the sum alone (`.item()`, `.detach()`) keeps no graph past its batch, but each batch still records one while it runs: `.item()` graded peaks at 39.6-40.2 MiB a batch against the no_grad baseline's 4.0-4.2 MiB (9.7-10.0x, over the 1.5x budget), and its RSS still grew 0.73-0.81 MiB a batch in two grades (over the 0.05 growth budget; why is not established); in #12 #19's reporter says `.item()` did not help.
    Wrong ones: `losstensorMean += losstensor.data[0]` (#12) raises IndexError on every torch from 0.5; a
    smaller batch ("Have tried editing batch size"), written here as the batch validated in two halves, keeps
    the same activations per batch; emptying the caches between batches (`gc.collect()`,
    `torch.cuda.empty_cache()`) frees nothing that is still referenced. Those two are correct in value and are the memory verdict's controls; so would be
    `requires_grad=False` on the Variables (the literal port of `volatile=True`: the weights still require
    grad), not kept as a control since it runs the buggy code's very graph. Validating one image at a time
    under no_grad (the batch size edited down to 1) is correct and flat, but slow: the speed verdict's control.

Compiled: `torch.compile(model)`, as a user compiles the network (compiles_itself). The step is Python
    bookkeeping around the model (`.item()`, counters on an object), which a whole-step compile would guard
    on and recompile for every batch. Under inductor (torch 2.13.0, CPU) the leak is the same, larger: the
    compiled graph saves 48.3 MiB a batch for its backward (eager 42.4), the half batches 57.2; the compiled
    no_grad fix keeps 0 B. Compiling DenseNet-121 costs minutes here (the first reproduce 547 s, the first
    no_grad compile past the 300 s phase limit on a loaded 2-core machine; 41-53 s for reproduce with the
    kernel cache warm), and each new batch size (the controls' 8 and 1) compiles again. The matrix
    (torch 2.3.1-2.15.0) finds two versions apart: on 2.4.1 the compiled no_grad network runs ~3x slower than
    under inference_mode (speed over budget, 3.2x), and on 2.4.1-2.6.0 its peak per batch, 2.7-4.6 MiB
    against the inference_mode baseline's 128 KiB-2.2 MiB, is over the peak budget (1.5x, at least of 1 MiB):
    over it in both 2.6.0 runs and in one of two on 2.4.1. It keeps nothing a batch on every version.
"""

import gc
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from harness import compiled as compile_axis
from harness.cases import Growth
from harness.triage import Sign, TriageSigns

symptoms = {
    "cpu": Growth(at_least=0.5),
    "cuda": Growth(at_least=0.5, oom="CUDA out of memory"),
}

# An out-of-memory line alone is the most common failure there is (a batch too large, a model that does not fit,
# fragmentation): it names no case. The family is told by what surrounds it: a loss summed as a tensor, memory that
# grows step after step, words that put the graph in the cause, autograd left on where nothing is trained.
triage_signs = TriageSigns(
    family="memory that grows step after step until it runs out",
    cause="a loss (or another output) summed as a tensor, which keeps every step's autograd graph alive",
    confirm="a running sum `total += loss` without .item(), or outputs kept in a list without .detach()",
    also="a batch too large for the device, a validation loop without torch.no_grad()",
    signs=(
        Sign(
            "failure",
            r"(?i)\bloss\w*\b[^.?!]{0,80}\b(?:continuous(?:ly)? )?(?:ris\w*|grow\w*|increas\w*|leak\w*)\b[^.?!]{0,12}\b(?:of )?(?:the )?(?:gpu |cuda )?memory\b",
            0.4,
            "memory rising with the way the losses are kept",
        ),
        Sign(
            "failure",
            r"\+= *float\(\w*(?:loss|Loss)\w*(?:\[['\"]?\w+['\"]?\])?\)|(?i:should|must|needs? to) be \w*loss\w*(?:\[['\"]?\w+['\"]?\])?\.item\(\)",
            0.4,
            "the fix shown: the running loss summed as a number (float(loss), loss.item())",
        ),
        Sign(
            "failure",
            r"(?i:CUDA out of memory)|OutOfMemoryError|cuda runtime error \(2\) : out of memory|CUDA error: out of memory|error=2 : out of memory|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
            0.3,
            "an allocation failed: alone, any out-of-memory; which one is told by the lines around it",
        ),
        Sign(
            "failure",
            r"(?i)(?<![:=] )(?<!cuda )\bout of (?:gpu |cuda )?(?:memory|ram)\b|\bran out of (?:ram|memory)|memory (?:explodes?|explosion)|\bgpu will explode|显存(?:溢出|不足)|内存溢出",
            0.2,
            "out of memory in the user's words (not the error line's own words), or memory that explodes",
        ),
        Sign(
            "failure",
            r"(?i)\bkeeps? (?:the )?(?:whole |entire )?(?:computation(?:al)? |autograd )?graphs?\b[^.]{0,40}\b(?:forever|of (?:all|every) (?:the )?(?:previous|past|earlier))\b",
            0.45,
            "the cause in words: a running sum keeps the graph of every earlier step",
        ),
        Sign(
            "context",
            r"\w+ *\+= *(?:\w+\.)*\w*(?:loss|Loss)\w*(?:\[['\"]?\w+['\"]?\])?(?![\w.(\[])",
            0.4,
            "a loss summed as a tensor (`total_loss += loss`, not `loss.item()`): the sum keeps every step's graph",
        ),
        Sign(
            "context",
            r"(?i)memory (?:\w+ ){0,3}(?:increas|grow)|(?:ram|memory) keeps? (?:increas|grow)|slow and steady increase|memory \w+ after (?:some|a few|several) (?:iterations|batches|steps)|显存(?:占用)?\w{0,6}(?:增加|增长|上涨|变大)",
            0.25,
            "memory that grows step after step, not one step too large",
        ),
        Sign(
            "context",
            r"(?i)(?:not|without) (?:the value|\.item\(\)|\.detach\(\))|non-detached|(?:computation(?:al)?|calculation|compution) graph|stor\w* (?:the )?(?:complete |entire |whole )?(?:comput\w* )?graph|holding on to the graph|take items not",
            0.3,
            "the graph named in the cause: values kept with their history instead of numbers",
        ),
        Sign(
            "context",
            r"volatile was removed|volatile=True|with torch\.no_grad\(\)|set_grad_enabled\(False\)",
            0.2,
            "autograd left recording where nothing is trained (`volatile` has no effect since torch 0.4)",
        ),
        Sign(
            "failure",
            r"^memory grows: retained [\d.]+ [KMGT]?i?B/step",
            0.35,
            "the harness's own reproduce record of a growth symptom (this is the case whose buggy code grows)",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:GPU|CUDA|host|CPU|system)? ?(?:memory|RAM|VRAM)(?: usage| consumption| footprint| use| allocated)?\b[^.,;]{0,25}\b(?:keeps? (?:growing|increasing|going up|rising)|grows?|growing|increas(?:es|ing)|goes up|rises|rising|builds? up|leaks?)\b|(?:内存|显存)[^。，]{0,12}(?:增加|增长|上升)",
            0.5,
            "a report in words: memory that grows iteration after iteration",
            family=True,
            near=(
                r"(?i)\b(?:each|every|per|after|over|with|across|during) (?:\w+ ){0,2}(?:iterations?|epochs?|steps?|batch(?:es)?)\b|\bas (?:the )?(?:training|iterations?|epochs?|steps?) (?:goes|go|proceeds?|continues?)\b|\bover time\b|\bgradually\b|\bkeeps? (?:growing|increasing|going up)\b|\bstep (?:after|by) step\b|逐渐|不断|随着",
            ),
        ),
        Sign(
            "failure",
            r"(?i)\bmemory\b|\bRAM\b|\bleak\w*|\bOOM\b|内存|显存",
            0.5,
            "a report in words: memory growing because losses kept with their graphs are accumulated",
            family=True,
            near=(
                r"(?i)\b(?:computation(?:al)? )?graphs?\b|\b(?:autograd |grad(?:ient)? )?history\b|\.item\(\)|\bdetach\w*|计算图",
                r"(?i)\b(?:loss(?:es)?|losses_?\w*|total_loss|running_loss|append\w*|accumulat\w*|sum(?:med|ming)?|added)\b",
            ),
        ),
        Sign(
            "veto",
            r"(?i)(?:\.detach\(\)|\bdetach\w*|\.item\(\))[^.]{0,60}\b(?:to no avail|didn't help|did not help|doesn't help|does not help|no effect|no luck|still (?:leaks?|grows?|increases?))|\b(?:already|tried)\b[^.]{0,80}(?:\.detach\(\)|\bdetach\w*|\.item\(\))",
            0,
            "the report says the losses were already detached (or taken with .item()) and memory still grows: another leak",
        ),
    ),
)

compiled_unit = (
    "the network, `torch.compile(model)`, as a user compiles a model; the validation loop's bookkeeping (a Python "
    "counter, `.item()`, the running sum on an object) stays eager around it: a whole-step compile guards on the "
    "counter and would recompile at every batch"
)
compiles_itself = True  # make_inputs compiles the network with cfg.compile's backend


# -- DenseNet-121 as torchvision builds it (features, then chexnet's classifier) ----------------------


class DenseLayer(nn.Module):
    def __init__(self, channels_in, growth, bottleneck):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(channels_in)
        self.conv1 = nn.Conv2d(channels_in, bottleneck * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bottleneck * growth)
        self.conv2 = nn.Conv2d(bottleneck * growth, growth, 3, padding=1, bias=False)

    def forward(self, features):
        x = torch.cat(features, 1)
        return self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))


class DenseBlock(nn.ModuleList):
    def forward(self, x):
        features = [x]
        for layer in self:
            features.append(layer(features))
        return torch.cat(features, 1)


def densenet121(classes, growth=32, blocks=(6, 12, 24, 16), bottleneck=4, stem=64):
    layers = [nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    channels = stem
    for i, depth in enumerate(blocks):
        layers.append(DenseBlock(DenseLayer(channels + j * growth, growth, bottleneck) for j in range(depth)))
        channels += depth * growth
        if i < len(blocks) - 1:  # transition: halve the channels and the resolution
            layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
            channels //= 2
    layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, nn.Linear(channels, classes), nn.Sigmoid())  # chexnet's classifier: Linear, Sigmoid


# -- the validation epoch's state, carried from batch to batch -------------------------------------


@dataclass
class Epoch:
    """epochVal's running sums: `losstensorMean` (a tensor), `lossVal` (a float), `lossValNorm` (batches seen)."""

    losstensorMean: object = 0
    lossVal: float = 0.0
    lossValNorm: int = 0


@dataclass
class Validation:
    model: nn.Module  # eager, eval mode: the reference reads its weights
    network: nn.Module  # what the loop calls: `model`, or it compiled (cfg.compile)
    images: torch.Tensor  # (batches, 16, 3, crop, crop): normalised crops
    labels: torch.Tensor  # (batches, 16, 14): 0/1 findings
    epoch: Epoch

    def next_batch(self):
        i = self.epoch.lossValNorm % len(self.images)
        return self.images[i], self.labels[i]


def make_inputs(cfg, device):
    generator = torch.Generator().manual_seed(cfg.seed)
    sizes = cfg.sizes
    torch.manual_seed(cfg.seed)  # the layers' default init draws from the global generator
    model = densenet121(sizes.classes).to(device).eval()
    images = torch.randn(sizes.batches, sizes.batch, 3, sizes.crop, sizes.crop, generator=generator)
    labels = (torch.rand(sizes.batches, sizes.batch, sizes.classes, generator=generator) < cfg.positive_rate).float()
    network = compile_axis.compiled(model, cfg)
    return Validation(model, network, images.to(device), labels.to(device), Epoch())


def running_means(epoch):
    """What epochVal returns at the end of the epoch, taken after this batch: (losstensorMean, outLoss)."""
    mean = epoch.losstensorMean / epoch.lossValNorm
    return mean, torch.tensor(epoch.lossVal / epoch.lossValNorm, dtype=torch.float64)


loss = nn.BCELoss()  # chexnet: torch.nn.BCELoss(size_average=True), the mean


def buggy(x):
    input, target = x.next_batch()
    varOutput = x.network(input)  # volatile=True no longer turns autograd off: this records the graph
    losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += losstensor  # the running sum keeps every batch's graph
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


def fixed(x):
    input, target = x.next_batch()
    with torch.no_grad():
        varOutput = x.network(input)
        losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += losstensor
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


def reference(x):
    """What one batch of a fresh epoch returns (the correct phase validates one): the first batch's mean binary
    cross-entropy by its formula, -(y log p + (1 - y) log(1 - p)) over the batch and the 14 findings, in float64
    on a float64 copy of the network, without autograd."""
    with torch.no_grad():
        p = _float64_copy(x.model)(x.images[0].double())
        labels = x.labels[0].double()
        mean = -(labels * torch.log(p) + (1 - labels) * torch.log1p(-p)).mean()
    return mean.float(), mean


def _float64_copy(model):
    copy = densenet121(model[-2].out_features)
    copy.load_state_dict(model.state_dict())
    return copy.to(next(model.parameters()).device).double().eval()


def speed_baseline(x):
    """The intended batch at its least work: inference mode, the loss summed as a detached tensor."""
    input, target = x.next_batch()
    with torch.inference_mode():
        losstensor = loss(x.network(input), target)
    x.epoch.losstensorMean += losstensor
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


# -- bad fixes: plausible, from the threads, each wrong ---------------------------------------


def index_the_loss(x):
    """`losstensorMean += losstensor.data[0]`, a user's suggestion in https://github.com/zoogzog/chexnet/issues/12: a
    0-dim tensor has no index 0 (IndexError from torch 0.5)."""
    input, target = x.next_batch()
    varOutput = x.network(input)
    losstensor = loss(varOutput, target)
    x.epoch.losstensorMean += losstensor.data[0]
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


bad_fixes = {"index_the_loss": index_the_loss}


# -- memory fixes: correct in value, but every batch's graph still kept (the memory verdict's controls) ---


def smaller_batches(x):
    """#19's "editing batch size": the batch validated in two halves; both halves' graphs are still summed."""
    input, target = x.next_batch()
    half = len(input) // 2
    for part in (slice(0, half), slice(half, None)):
        losstensor = loss(x.network(input[part]), target[part])
        x.epoch.losstensorMean += losstensor / 2
        x.epoch.lossVal += losstensor.item() / 2
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


def empty_the_caches(x):
    """`gc.collect()` and `torch.cuda.empty_cache()` after every batch: the graphs are referenced, so nothing is freed."""
    output = buggy(x)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return output


memory_fixes = {
    "smaller_batches": smaller_batches,
    "empty_the_caches": empty_the_caches,
}


# -- slow fixes: correct, slower than the budget allows ---------------------------------------


def one_image_at_a_time(x):
    """The fix, with the batch size "edited" down to 1 (#19, #12: "even for batch size of 2"): flat, and slow."""
    input, target = x.next_batch()
    with torch.no_grad():
        losses = [loss(x.network(image[None]), labels[None]) for image, labels in zip(input, target)]
        losstensor = torch.stack(losses).mean()  # each image has all 14 findings: the mean of means is the batch's
    x.epoch.losstensorMean += losstensor
    x.epoch.lossVal += losstensor.item()
    x.epoch.lossValNorm += 1
    return running_means(x.epoch)


slow_fixes = {"one_image_at_a_time": one_image_at_a_time}
