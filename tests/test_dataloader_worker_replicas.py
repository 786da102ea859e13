"""dataloader_worker_replicas beyond the harness phases: which samples repeat which, the next epoch repeating the
first, the global numpy generator reseeded by torch (so the older threads' fix does nothing here), and by how much
each wrong fix is wrong."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, get_worker_info

from cases import dataloader_worker_replicas as case
from harness.cases import CASE_CONFIG_DIR
from tests.fixes.alternatives.dataloader_worker_replicas import dataloader_worker_replicas as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "dataloader_worker_replicas.yaml")


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


def draws_by_worker(x, worker_init_fn=None):
    """Each worker's sequence of draw digests, in the order it read its patches (batches alternate between workers)."""
    loader = DataLoader(x.dataset, batch_size=1, shuffle=True, num_workers=2, worker_init_fn=worker_init_fn, generator=x.generator)
    samples = [int(s["draws"]) for s in loader]
    return samples[0::2], samples[1::2]


def counts(out):
    return {key: value.tolist() for key, value in out.items() if key != "patches"}


def test_the_sizes_give_27_patches_and_each_is_read_once(x):
    assert len(x.dataset) == 27
    for f in (case.buggy, case.fixed, case.reference):
        assert f(x)["patches"].tolist() == list(range(27)), f.__name__


def test_the_second_worker_draws_what_the_first_drew(x):
    first, second = draws_by_worker(x)
    assert len(first) == 14 and len(second) == 13
    assert second == first[:13]  # patch for patch: the same flips, rotations and contrast
    assert counts(case.buggy(x)) == {"duplicated_draws": 13, "misaligned_labels": 0}
    assert counts(case.reference(x)) == {"duplicated_draws": 0, "misaligned_labels": 0}


def test_every_epoch_repeats_the_first_and_the_fix_does_not(x):
    assert draws_by_worker(x) == draws_by_worker(x)
    fixed_first, fixed_second = draws_by_worker(x, case.seed_augmentations), draws_by_worker(x, case.seed_augmentations)
    assert not set(fixed_first[0] + fixed_first[1]) & set(fixed_second[0] + fixed_second[1])


def test_torch_reseeds_the_global_numpy_generator_but_not_the_datasets():
    class Draws(torch.utils.data.Dataset):
        def __init__(self):
            self.rng = np.random.RandomState(47)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return np.random.randint(1 << 30), self.rng.randint(1 << 30), get_worker_info().id

    rows = [tuple(int(v) for v in row) for row in DataLoader(Draws(), batch_size=None, num_workers=2)]
    (global_0, own_0, _), (global_1, own_1, _) = rows[0], rows[1]  # the first sample of worker 0, then of worker 1
    assert global_0 != global_1  # reseeded per worker since torch 1.9 (pytorch #56488)
    assert own_0 == own_1  # the dataset's own RandomState: the same state in both


def test_the_bad_fixes_by_how_much(x):
    assert counts(case.numpy_seed_in_worker_init(x)) == {"duplicated_draws": 13, "misaligned_labels": 0}
    assert counts(case.fresh_generators_in_worker_init(x)) == {"duplicated_draws": 0, "misaligned_labels": 27}


def test_the_fix_the_alternative_and_the_slow_control_are_right(x):
    want = case.reference(x)
    for f in (case.fixed, alternative, case.new_loader_per_patch):
        got = f(x)
        assert got["patches"].tolist() == want["patches"].tolist(), f.__name__
        assert counts(got) == counts(want), f.__name__


class PatchStream(torch.utils.data.IterableDataset):
    """The family's other face (tfrecord #78, datasets #3423 in the triage logs): the patches as a stream, read whole
    by every worker unless each worker takes its own share (`shard`: every num_workers-th patch from its id)."""

    def __init__(self, count, shard):
        self.count, self.shard = count, shard

    def __iter__(self):
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if self.shard and info is not None else (0, 1)
        return iter(range(start, self.count, step))


def test_an_iterable_dataset_is_read_once_per_worker_unless_sharded_by_worker_id(x):
    unsharded = sorted(int(i) for i in DataLoader(PatchStream(len(x.dataset), shard=False), batch_size=None, num_workers=2))
    assert unsharded == sorted(list(range(27)) * 2)  # every patch twice: 27 duplicated samples in an epoch of 54
    sharded = sorted(int(i) for i in DataLoader(PatchStream(len(x.dataset), shard=True), batch_size=None, num_workers=2))
    assert sharded == list(range(27))
