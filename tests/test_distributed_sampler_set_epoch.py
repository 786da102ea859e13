"""distributed_sampler_set_epoch beyond the harness phases: each rank's order per epoch, the ranks' slices of one
permutation, what the sampler's seed and epoch decide, and by how much each wrong fix is wrong."""

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data.distributed import DistributedSampler

from cases import distributed_sampler_set_epoch as case
from harness.cases import CASE_CONFIG_DIR
from tests.fixes.alternatives.distributed_sampler_set_epoch import distributed_sampler_set_epoch as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "distributed_sampler_set_epoch.yaml")


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


def counts(out):
    return {key: value.tolist() for key, value in out.items() if key != "order"}


def test_the_tutorials_sizes_give_32_ranks_of_1875_samples_in_19_batches(x):
    assert (len(x.dataset), x.world_size, x.batch_size, x.epochs) == (60000, 32, 100, 2)
    sampler = DistributedSampler(x.dataset, num_replicas=x.world_size, rank=0)
    assert len(sampler) == 1875 and len(case.tutorial_loader(x, sampler)) == 19  # 18 batches of 100, one of 75


def test_without_set_epoch_every_rank_reads_epoch_1s_order_again(x, want):
    got = case.buggy(x)
    assert tuple(got["order"].shape) == (2, 32, 1875)
    assert torch.equal(got["order"][1], got["order"][0])  # every rank: the same indices, in the same order
    assert counts(got) == {"repeated_orders": [32], "distinct_samples": [60000, 60000]}  # each epoch still covers all
    assert torch.equal(got["order"][0], want["order"][0])  # epoch 1 is right: only the later epochs go wrong
    assert counts(want) == {"repeated_orders": [0], "distinct_samples": [60000, 60000]}


def test_the_ranks_slice_one_permutation_and_the_epoch_changes_it(x, want):
    for epoch in range(2):
        assert sorted(want["order"][epoch].flatten().tolist()) == list(range(60000))
    sampler = DistributedSampler(x.dataset, num_replicas=32, rank=5)
    sampler.set_epoch(1)
    assert list(sampler) == want["order"][1, 5].tolist()
    assert list(DistributedSampler(x.dataset, num_replicas=32, rank=5, seed=1)) == list(sampler)  # seed + epoch


def test_the_bad_fixes_by_how_much(x, want):
    assert counts(case.set_epoch_zero(x)) == {"repeated_orders": [32], "distinct_samples": [60000, 60000]}
    per_rank = case.set_epoch_per_rank(x)
    assert per_rank["repeated_orders"].tolist() == [0]
    assert all(0.6 < n / 60000 < 0.66 for n in per_rank["distinct_samples"].tolist())  # about 1 - 1/e of the samples
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        case.shuffle_in_loader(x)
    shuffled = case.shuffle_dataset_fixed_seed(x)
    assert counts(shuffled) == {"repeated_orders": [32], "distinct_samples": [60000, 60000]}
    assert not torch.equal(shuffled["order"][0], want["order"][0])


def test_the_fix_the_alternative_and_the_slow_control_are_right(x, want):
    for f in (case.fixed, alternative, case.set_epoch_one_sample_batches):
        got = f(x)
        assert torch.equal(got["order"], want["order"]), f.__name__
        assert counts(got) == counts(want), f.__name__
