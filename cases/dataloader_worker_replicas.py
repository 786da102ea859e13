"""Every DataLoader worker draws the same augmentations: the generators made in the Dataset's `__init__` are copied into each.

Upstream: https://github.com/wolny/pytorch-3dunet/issues/32 ("np.random generates the same random numbers for each
    data batch", 2019-07-02, closed): "I used RandomRotate, RandomContrast and other transformers for data
    augmentation. I found out the angles in RandomRotate and brightness_factors in RandomContrast in each batch are
    the same ... When I set num_workers in configuration files to 0, transformers work just fine." The maintainer:
    "It's by design that workers return the same sequence of random numbers, since the workers share the common
    instance of the `Dataset` which was initialized with a fixed seed ... the angle will change every 4 iterations";
    no fix was made (pytorch3dunet/augment/transforms.py still gives every augmentation `np.random.RandomState(seed)`
    today). The code is pytorch-3dunet at 6e5a24b (2019-07-03, the day after the report): `Transformer` gives each
    augmentation its own `np.random.RandomState(47)`, `HDF5Dataset.__init__` builds the raw and the label transforms,
    and `get_train_loaders` reads it with `DataLoader(..., batch_size=1, shuffle=True, num_workers=num_workers)`.

Fidelity: faithful in the code that fails: pytorch-3dunet's `RandomFlip`, `RandomRotate90`, `RandomRotate`,
    `RandomContrast`, `Normalize`, `ToTensor` and `Transformer` as they were at 6e5a24b (re-typed, the same draws in
    the same order), the train config's transformer lists (resources/train_config_ce.yaml: RandomRotate about the
    (2, 1) axes by up to 15 degrees, mode reflect), its patch [32, 64, 64] and stride [8, 16, 16], the `SliceBuilder`
    and `HDF5Dataset.__getitem__`, and the loader (batch 1, shuffled). Synthetic: the volume (a seeded draw held in
    memory, 48 x 96 x 96, 27 patches, in place of the HDF5 file, which the dataset loads into memory too), two workers
    (the config says 8; CI has two cores), `ElasticDeformation` left out (about 1 s a patch, upstream's comment; it
    draws from its own RandomState like the rest), and what the case observes: each sample also returns a digest of
    the raw and the label augmentations' generator states before its draws (the draws are a function of them).

Symptom on CUDA: the same as on CPU: the workers are CPU processes (the thread trained on a GPU and saw it in the
    augmented batches it looked at).

Symptom on CPU: nothing raises and nothing is printed (torch 2.13.0, run here). Of the 27 patches of an epoch, each
    read once, the 13 that the second worker augments draw exactly the flips, rotations and contrast factors that the
    first worker drew for its own first 13 patches: 13 duplicated draws, against 0 read in one process. The next epoch's
    workers start from the same state again and repeat the same draws.

Cause: the DataLoader forks each worker from the main process, so each starts with a copy of the Dataset and of the
    RandomStates its `__init__` made, in the same state. torch reseeds its own generator, Python's `random` and (since
    1.9, https://github.com/pytorch/pytorch/pull/56488) the global numpy generator in each worker, but cannot know of a
    generator held by the Dataset. (https://github.com/open-mmlab/OpenPCDet/issues/886, checked and not used, is the
    global `np.random`'s case, which that reseeding fixed.)

Fix: torch's documented one (the `worker_init_fn` and `get_worker_info` notes of torch.utils.data): a `worker_init_fn`
    that reseeds the dataset's generators from `torch.utils.data.get_worker_info().seed` (base seed + worker id, a new
    base seed every epoch), every augmentation with the same seed, as `Transformer` does, so that a patch's raw and
    label transforms keep drawing the same flips and rotations. Also correct (tests/fixes/alternatives/): each
    augmentation's RandomState reseeded inside `__getitem__` from torch's per-worker generator the first time a worker
    reads (graded: accepted, 0.967x [0.806, 1.161] against the buggy loader; the starter, the buggy loader as `fix`, is
    rejected by correct: `duplicated_draws` differs). The reference reads every patch in this process from a copy of the
    dataset (`num_workers=0`, the thread's "work just fine"): 27 patches, 0 duplicated draws, 0 labels misaligned. Wrong
    ones: `np.random.seed` in `worker_init_fn` (the advice of https://github.com/sunset1995/HorizonNet/issues/4 and
    https://github.com/xingyizhou/CenterNet/issues/233; https://github.com/Project-MONAI/MONAI/issues/1068 did it for
    transforms that draw from a RandomState of their own, `self.R`: "Notice that the random number repeat every epoch
    and even iterations"): the global generator changes, the Dataset's do not: 13 duplicated draws still; fresh unseeded
    generators per augmentation in `worker_init_fn` (a generic attempt): no duplicates, but raw and label draw apart,
    and all 27 labels are flipped or rotated differently from their images. The family's other face, an IterableDataset
    without sharding read whole by every worker (tfrecord #78, datasets #3423 in the triage logs), is no part of
    pytorch-3dunet's code: the test file shows it on the same 27 patches as a stream (each read twice with 2 workers)
    and its fix, each worker taking every num_workers-th item from its `get_worker_info().id`. Its cost: a seed call per
    RandomState once per worker per epoch, against the buggy loader: 0.834x [0.513, 1.356] eager, 1.081x [0.873, 1.338]
    under compile=inductor (torch 2.13.0, this loaded 2-core CPU; budget 1.5, the ratio's noise is the workers' start
    and the machine's load). The slow control, correct: a new DataLoader (a new worker, a new worker seed) for every
    patch: 5.390x [2.949, 9.854] eager, 5.548x [4.309, 7.142] inductor, its interval's low end 2.0x the budget (2.9x).
    With two workers a loader it cost 4-6 s a call, and at the default 20 s of timing only 2 processes fit: 8.892x
    [0.213, 370.957], undecided (hence `speed.max_s: 60`).

Compiled: nothing to compile (`compiles_itself`): the workers run numpy augmentations; under compile=inductor the same
    loaders run and give the same 13 duplicated draws (torch 2.13.0).
"""

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.ndimage import rotate
from torch.utils.data import DataLoader, Dataset, Subset, get_worker_info

from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}  # nothing printed: every patch read, half the draws repeated

triage_signs = TriageSigns(
    family="every DataLoader worker replays the same thing: the same random draws, or an unsharded IterableDataset's whole stream",
    cause="a random generator that the workers inherit in the same state (one made in the Dataset's __init__, or numpy's global one before torch 1.9)",
    confirm="the same augmentation parameters in every num_workers-th sample, and none repeated with num_workers=0",
    also="an IterableDataset read whole by every worker (the same samples, not the same draws: shard by worker id), or a seed fixed inside __getitem__",
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:same|identical|duplicated?|repeated)\b[^.\n]{0,80}\b(?:across|per|in|for|on|by|from) (?:each|every|all|different|multiple|the|several) (?:of the )?(?:data ?loader |dataloader )?workers?\b|\bworkers?\b[^.\n]{0,80}\b(?:same|identical|duplicated?|redundant|equally seeded)\b[^.\n]{0,20}\b(?:random\w*|seeds?|augment\w*|transform\w*|images?|samples?|crops?|numbers?|results|outputs)\b",
            0.5,
            "a report in words: DataLoader workers drawing the same random numbers, augmentations or samples",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\b(?:same|identical)\b[^.]{0,40}\b(?:random (?:numbers?|seeds?|values?|draws?)|augmentations?|randomness|numpy seeds?)\b[^.]{0,80}\b(?:workers?|(?:each|every) (?:data )?batch|threads|processes)\b|\b(?:workers?|threads|processes)\b[^.]{0,60}\b(?:same|identical)\b[^.]{0,20}\b(?:random|numpy|seeds?|augment\w*)",
            0.55,
            "the same random numbers, seeds or augmentations in every DataLoader worker",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\brandom (?:numbers?|values?|draws?) (?:repeats?|(?:is|are) repeated)\b|\baugment\w*\b[^.]{0,40}\bduplicat\w*|\b(?:same|identical) augmentations?\b",
            0.45,
            "random draws or augmentations that repeat (the data duplicated)",
        ),
        Sign(
            "failure",
            r"(?i)\bnum_?work\w* ?(?:=|>) ?\d+[^.]{0,40}\b(?:data|samples?|examples?)\b (?:is|are|gets?) (?:repeated|duplicated)|\b(?:data|samples?|examples?) (?:is |are )?(?:repeated|duplicated) num_?work\w* times",
            0.55,
            "an IterableDataset's data repeated once per worker: every worker reads the whole stream",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\bnum_?work\w*`? *(?:affects?|changes?|multipl\w+)\b[^.]{0,20}\b(?:total )?number of (?:batches|samples|examples)",
            0.55,
            "an epoch whose length grows with num_workers: each worker yields the whole IterableDataset",
            family=True,
        ),
        Sign(
            "failure",
            r"(?i)\b(?:random (?:numbers?|values?|draws?)|augmentations?)\b[^.?]{0,60}\b(?:different|every|each) epochs? +(?:is|are) the same\b|\b(?:same|identical) (?:random (?:numbers?|values?)|augmentations?)\b[^.?]{0,30}\b(?:across|in (?:different|every|each)) epochs?\b",
            0.5,
            "the workers' random draws the same in every epoch: each epoch's workers start from the same state",
        ),
        Sign(
            "failure",
            r"(?i)\b(?:only )?re-?seeds?\b[^.]{0,40}\btorch\b[^.]{0,40}\b(?:not|but not|and not|never)\b[^.]{0,20}\b(?:numpy|np|python'?s? random)\b|\b(?:numpy|np\.random)\b[^.]{0,40}\b(?:is |are )?not (?:re-?)?seeded\b[^.]{0,40}\bworkers?\b",
            0.5,
            "the cause in words: each worker's torch generator is reseeded, numpy's (or Python's) is not",
        ),
        Sign(
            "context",
            r"(?i)\bworker_init_fn\b|\bget_worker_info\b|\bnum_?work\w*\b|\bworkers\b",
            0.2,
            "the DataLoader's worker processes named",
        ),
        Sign(
            "support",
            r"(?i)\bnp\.random\.|\bRandomState\b|\bdefault_rng\b|\bself\.R\.|\brandom\.randint\b|\bIterableDataset\b|streaming=True",
            0.15,
            "a generator the workers inherit (numpy's, a RandomState of the dataset's own), or an iterable dataset",
        ),
        Sign(
            "veto",
            r"(?i)\b(?:non-?|not |can'?t |cannot )?reproduc\w*|\bdeterminis\w+",
            0,
            "runs that differ from each other (reproducibility, determinism across worker counts), not workers that repeat each other",
        ),
    ),
)

compiled_unit = (
    "not applicable: the failure is in the DataLoader's worker processes, which run numpy augmentations; no tensor "
    "program to compile. Under compile=inductor the same loaders run, and the record says so"
)
compiles_itself = True  # nothing in it to compile: the loaders run as they are under every compile mode


# -- pytorch-3dunet at 6e5a24b: augment/transforms.py ------------------------------------------------------


class RandomFlip:
    def __init__(self, random_state, **kwargs):
        self.random_state = random_state
        self.axes = (0, 1, 2)

    def __call__(self, m):
        for axis in self.axes:
            if self.random_state.uniform() > 0.5:
                m = np.flip(m, axis)
        return m


class RandomRotate90:
    def __init__(self, random_state, **kwargs):
        self.random_state = random_state

    def __call__(self, m):
        k = self.random_state.randint(0, 4)  # pick number of rotations at random
        return np.rot90(m, k, (1, 2))


class RandomRotate:
    def __init__(self, random_state, angle_spectrum=10, axes=None, mode="constant", order=0, **kwargs):
        self.random_state = random_state
        self.angle_spectrum = angle_spectrum
        self.axes = axes or [(1, 0), (2, 1), (2, 0)]
        self.mode, self.order = mode, order

    def __call__(self, m):
        axis = self.axes[self.random_state.randint(len(self.axes))]
        angle = self.random_state.randint(-self.angle_spectrum, self.angle_spectrum)
        return rotate(m, angle, axes=axis, reshape=False, order=self.order, mode=self.mode, cval=-1)


class RandomContrast:
    def __init__(self, random_state, factor=0.5, execution_probability=0.1, **kwargs):
        self.random_state = random_state
        self.factor, self.execution_probability = factor, execution_probability

    def __call__(self, m):
        if self.random_state.uniform() < self.execution_probability:
            brightness_factor = self.factor + self.random_state.uniform()
            return np.clip(m * brightness_factor, 0, 1)
        return m


class Normalize:
    def __init__(self, mean, std, eps=1e-4, **kwargs):
        self.mean, self.std, self.eps = mean, std, eps

    def __call__(self, m):
        return (m - self.mean) / (self.std + self.eps)


class ToTensor:
    def __init__(self, expand_dims, dtype=np.float32, **kwargs):
        self.expand_dims, self.dtype = expand_dims, dtype

    def __call__(self, m):
        if self.expand_dims and m.ndim == 3:
            m = np.expand_dims(m, axis=0)
        return torch.from_numpy(m.astype(dtype=self.dtype))


class Compose:  # torchvision.transforms.Compose, as transforms.py imported it
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, m):
        for t in self.transforms:
            m = t(m)
        return m


AUGMENTATIONS = {c.__name__: c for c in (RandomFlip, RandomRotate90, RandomRotate, RandomContrast, Normalize, ToTensor)}
ROTATE = {"name": "RandomRotate", "axes": [(2, 1)], "angle_spectrum": 15, "mode": "reflect"}  # rotate only in ZY
TRAIN_TRANSFORMER = {  # resources/train_config_ce.yaml's `transformer.train`, ElasticDeformation left out
    "raw": [
        {"name": "Normalize"},
        {"name": "RandomFlip"},
        {"name": "RandomRotate90"},
        ROTATE,
        {"name": "RandomContrast"},
        {"name": "ToTensor", "expand_dims": True},
    ],
    "label": [{"name": "RandomFlip"}, {"name": "RandomRotate90"}, ROTATE, {"name": "ToTensor", "expand_dims": False, "dtype": "int64"}],
}


class Transformer:
    def __init__(self, phase_config, mean, std):
        self.phase_config = phase_config
        self.config_base = {"mean": mean, "std": std}
        self.seed = 47

    def raw_transform(self):
        return self._create_transform("raw")

    def label_transform(self):
        return self._create_transform("label")

    def _create_transform(self, name):
        return Compose([self._create_augmentation(c) for c in self.phase_config[name]])

    def _create_augmentation(self, c):
        config = dict(self.config_base)
        config.update(c)
        config["random_state"] = np.random.RandomState(self.seed)
        return AUGMENTATIONS[config["name"]](**config)


# -- datasets/hdf5.py: SliceBuilder and HDF5Dataset, the volume in memory ------------------------------------


def gen_indices(i, k, s):
    for j in range(0, i - k + 1, s):
        yield j
    if j + k < i:
        yield i - k


def build_slices(shape, patch_shape, stride_shape):
    (i_z, i_y, i_x), (k_z, k_y, k_x), (s_z, s_y, s_x) = shape, patch_shape, stride_shape
    return [
        (slice(z, z + k_z), slice(y, y + k_y), slice(x, x + k_x))
        for z in gen_indices(i_z, k_z, s_z)
        for y in gen_indices(i_y, k_y, s_y)
        for x in gen_indices(i_x, k_x, s_x)
    ]


class HDF5Dataset(Dataset):
    """pytorch-3dunet's train dataset: the raw and label volumes in memory, the transforms built in `__init__`."""

    def __init__(self, raw, label, patch_shape, stride_shape, transformer_config):
        self.raws, self.labels = [raw], [label]
        mean, std = raw.mean(keepdims=True), raw.std(keepdims=True)
        self.transformer = Transformer(transformer_config, mean, std)
        self.raw_transform = self.transformer.raw_transform()
        self.label_transform = self.transformer.label_transform()
        self.raw_slices = self.label_slices = build_slices(raw.shape, patch_shape, stride_shape)
        self.patch_count = len(self.raw_slices)

    def __getitem__(self, idx):
        raw_patch_transformed = self.raw_transform(self.raws[0][self.raw_slices[idx]])
        label_patch_transformed = self.label_transform(self.labels[0][self.label_slices[idx]])
        return raw_patch_transformed, label_patch_transformed

    def __len__(self):
        return self.patch_count


def random_states(compose):
    return [t.random_state for t in compose.transforms if hasattr(t, "random_state")]


def state_digest(states) -> int:
    """What the next draws of these generators will be, as one number: a digest of their Mersenne Twister states."""
    h = hashlib.blake2b(digest_size=7)
    for state in states:
        _, key, pos, *_ = state.get_state()
        h.update(key.tobytes() + int(pos).to_bytes(4, "little"))
    return int.from_bytes(h.digest(), "little")


class Observed(Dataset):
    """The dataset as the case reads it: each sample with its patch index and, before its draws, the digest of the raw
    transform's generators and of the label's geometric ones against the raw's (the flips and rotations they share)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, idx):
        raw_states, label_states = random_states(self.dataset.raw_transform), random_states(self.dataset.label_transform)
        draws = state_digest(raw_states)
        aligned = state_digest(raw_states[: len(label_states)]) == state_digest(label_states)
        raw, label = self.dataset[idx]
        return {"raw": raw, "label": label, "patch": idx, "draws": draws, "aligned": aligned}


# -- the epoch ---------------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    dataset: Any  # Observed(HDF5Dataset): built once, as get_train_loaders builds it; the workers fork from it
    generator: torch.Generator  # the loader's: the shuffle and each epoch's worker base seed
    workers: int


def make_inputs(cfg, device):
    rng = np.random.default_rng(cfg.seed)
    shape = (cfg.sizes.depth, cfg.sizes.height, cfg.sizes.width)
    raw = rng.random(shape, dtype=np.float32)
    label = (raw > 0.5).astype(np.int64)  # a stand-in segmentation of the stand-in volume
    patch, stride = tuple(cfg.loader.patch), tuple(cfg.loader.stride)
    dataset = HDF5Dataset(raw, label, patch, stride, TRAIN_TRANSFORMER)
    return Inputs(Observed(dataset), torch.Generator().manual_seed(cfg.seed), cfg.loader.num_workers)


def summary(samples):
    """What an epoch gave: the patches read (sorted: each once), how many samples drew what an earlier sample of the
    epoch drew, and how many labels drew other flips and rotations than their image."""
    draws = [int(s["draws"]) for s in samples]
    return {
        "patches": torch.tensor(sorted(int(s["patch"]) for s in samples)),
        "duplicated_draws": torch.tensor(len(draws) - len(set(draws))),
        "misaligned_labels": torch.tensor(sum(not bool(s["aligned"]) for s in samples)),
    }


def epoch(x, worker_init_fn=None, dataset=None):
    """One epoch as get_train_loaders reads it: batch 1, shuffled, `workers` worker processes started for the epoch."""
    loader = DataLoader(
        dataset or x.dataset, batch_size=1, shuffle=True, num_workers=x.workers, worker_init_fn=worker_init_fn, generator=x.generator
    )
    return summary(list(loader))


def buggy(x):
    """pytorch-3dunet's loader: every worker starts from the RandomStates `__init__` made, in the same state."""
    return epoch(x)


def seed_augmentations(worker_id):
    """In each worker: every augmentation's RandomState (raw and label alike) reseeded with the worker's seed, which
    torch draws anew every epoch (base seed + worker id)."""
    info = get_worker_info()
    seed = info.seed % 2**32
    dataset = info.dataset.dataset  # Observed -> HDF5Dataset
    for compose in (dataset.raw_transform, dataset.label_transform):
        for augmentation in compose.transforms:
            if hasattr(augmentation, "random_state"):
                augmentation.random_state.seed(seed)


def fixed(x):
    return epoch(x, worker_init_fn=seed_augmentations)


def reference(x):
    """Every patch read in this process (num_workers=0, the thread's "work just fine"), from a copy of the dataset so
    that the generators the workers fork from stay as they were: the augmentations draw in one sequence."""
    dataset = copy.deepcopy(x.dataset)
    return summary([dataset[i] for i in range(len(dataset))])


def speed_baseline(x):
    """The buggy loader: the same workers, the same augmentations, no reseeding."""
    return buggy(x)


# -- bad fixes ------------------------------------------------------------------------------------------------------


def seed_global_numpy(worker_id):
    np.random.seed(worker_id)


def numpy_seed_in_worker_init(x):
    """`np.random.seed` in `worker_init_fn` (HorizonNet #4, CenterNet #233; MONAI #1068 found it changes nothing for
    generators of the dataset's own): the global generator is reseeded, the Dataset's RandomStates are not."""
    return epoch(x, worker_init_fn=seed_global_numpy)


def fresh_generators(worker_id):
    dataset = get_worker_info().dataset.dataset
    for compose in (dataset.raw_transform, dataset.label_transform):
        for t in compose.transforms:
            if hasattr(t, "random_state"):
                t.random_state = np.random.RandomState()  # OS entropy, a new one for each augmentation


def fresh_generators_in_worker_init(x):
    """New unseeded RandomStates for every augmentation in `worker_init_fn` (a generic attempt, not from the cited
    threads): the workers no longer repeat each other, and a patch's label no longer draws its image's flips."""
    return epoch(x, worker_init_fn=fresh_generators)


bad_fixes = {"numpy_seed_in_worker_init": numpy_seed_in_worker_init, "fresh_generators_in_worker_init": fresh_generators_in_worker_init}


# -- slow fixes -----------------------------------------------------------------------------------------------------


def new_loader_per_patch(x):
    """Correct and careless: a new DataLoader for every patch (the shuffled order drawn first), so every patch gets a
    new worker and a new worker seed; every patch pays for starting a process (one worker: a patch needs no more)."""
    order = torch.randperm(len(x.dataset), generator=x.generator).tolist()
    samples = []
    for idx in order:
        loader = DataLoader(Subset(x.dataset, [idx]), batch_size=1, num_workers=1, worker_init_fn=seed_subset, generator=x.generator)
        samples += list(loader)
    return summary(samples)


def seed_subset(worker_id):
    info = get_worker_info()
    dataset = info.dataset.dataset.dataset  # Subset -> Observed -> HDF5Dataset
    for state in random_states(dataset.raw_transform) + random_states(dataset.label_transform):
        state.seed(info.seed % 2**32)


slow_fixes = {"new_loader_per_patch": new_loader_per_patch}
