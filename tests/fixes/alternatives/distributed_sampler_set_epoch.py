"""distributed_sampler_set_epoch: an alternative correct fix, written differently from the case's own `fixed`."""

from torch.utils.data.distributed import DistributedSampler

from cases.distributed_sampler_set_epoch import run, tutorial_loader


class EpochAdvancingSampler(DistributedSampler):
    """A DistributedSampler that moves to the next epoch each time an iterator is made of it (the suggestion in
    https://github.com/pytorch/pytorch/issues/11324): the loop needs no call, and every rank, iterating as often as
    the others, stays on the same epoch. The order is drawn before the epoch moves on."""

    def __iter__(self):
        indices = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return indices


def advancing_loader(x, sampler):
    return tutorial_loader(x, EpochAdvancingSampler(x.dataset, num_replicas=sampler.num_replicas, rank=sampler.rank, seed=sampler.seed))


def distributed_sampler_set_epoch(x):
    return run(x, make_loader=advancing_loader)
