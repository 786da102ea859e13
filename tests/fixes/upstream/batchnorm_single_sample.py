"""Upstream's fixes of batchnorm_single_sample, in the order scvi-tools applied them, each as a submission.

Each is re-typed from its commit in scverse/scvi-tools and put in the case's terms: the case's VAE, TrainingPlan step
and epoch order (`fresh_model`, `train_loader`, `training_step`, `trained`, `CellsDataset`, which the buggy code
uses too). scvi-tools 1.0.0 (#1975) removed `drop_last` as an int and with it #915's fix; that release is the bug,
not a fix, and is not graded. tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the
verdicts.
"""

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader

from cases.batchnorm_single_sample import CellsDataset, fresh_model, train_loader, trained, training_step


def commit_c0fa60d_skip_small_minibatches(x):
    """https://github.com/scverse/scvi-tools/commit/c0fa60d9e47c39800b2b095c8d2765edb0bd8fb4 ("Fixes #426 * Skip
    minibatches of size < 3", 2019, for https://github.com/scverse/scvi-tools/issues/426): the trainer's loop,
    `if tensors_list[0][0].shape[0] < 3: continue` before the loss."""
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(train_loader(x)):
        if batch["X"].shape[0] < 3:
            continue
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


class DropLastBatchSampler(torch.utils.data.sampler.Sampler):
    """scvi's BatchSampler as PR #915 left it (scvi/dataloaders/_ann_dataloader.py at 9897533f), its shuffle (a
    `torch.randperm` per epoch) replaced by the case's epoch order."""

    def __init__(self, indices, batch_size, order, drop_last=False):
        self.indices = indices
        self.n_obs = len(indices)
        self.batch_size = batch_size
        self.order = order
        if drop_last > batch_size:
            raise ValueError(f"drop_last can't be greater than batch_size. drop_last is {drop_last} but batch_size is {batch_size}.")
        last_batch_len = self.n_obs % self.batch_size
        if (drop_last is True) or (last_batch_len < drop_last):
            drop_last_n = last_batch_len
        elif (drop_last is False) or (last_batch_len >= drop_last):
            drop_last_n = 0
        else:
            raise ValueError("Invalid input for drop_last param. Must be bool or int.")
        self.drop_last_n = drop_last_n

    def __iter__(self):
        idx = list(self.order)
        if self.drop_last_n != 0:
            idx = idx[: -self.drop_last_n]
        return iter([self.indices[idx[i : i + self.batch_size]] for i in range(0, len(idx), self.batch_size)])

    def __len__(self):
        return self.n_obs // self.batch_size if self.drop_last_n != 0 else -(-self.n_obs // self.batch_size)


def pr_915_drop_last_3(x):
    """https://github.com/scverse/scvi-tools/pull/915 (merge 9897533f, scvi-tools 0.10, 2021): the training loader built
    with `drop_last=3` ("do not remove drop_last=3, skips over small minibatches"), scvi's BatchSampler dropping a
    last minibatch shorter than 3 cells; the TrainingPlan's own skip removed in the same PR."""
    model, step_model, optimizer = fresh_model(x)
    sampler = DropLastBatchSampler(np.arange(len(x.train_idx)), x.batch_size, x.epoch_order, drop_last=3)
    loader = DataLoader(CellsDataset(x), sampler=sampler, batch_size=None)
    model.train()
    for step, batch in enumerate(loader):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def pr_2929_datasplitter_drop_last(x):
    """https://github.com/scverse/scvi-tools/pull/2929 (commit ea43179a, scvi-tools 1.2.0, answering
    https://github.com/scverse/scvi-tools/issues/2448): `DataSplitter` pops `drop_last` from its kwargs and builds the
    training AnnDataLoader with it; the user asks for it, `model.train(datasplitter_kwargs={"drop_last": True})`, and
    AnnDataLoader hands it to torch's `BatchSampler(sampler, batch_size, drop_last)`."""
    datasplitter_kwargs = {"drop_last": True}
    drop_last = datasplitter_kwargs.pop("drop_last", False)
    sampler = BatchSampler(x.epoch_order, batch_size=x.batch_size, drop_last=drop_last)
    loader = DataLoader(CellsDataset(x), sampler=sampler, batch_size=None)
    model, step_model, optimizer = fresh_model(x)
    model.train()
    for step, batch in enumerate(loader):
        loss = training_step(step_model, optimizer, batch["X"], x, step)
    return trained(model, loss, x)


def pr_3036_move_to_validation(x):
    """https://github.com/scverse/scvi-tools/pull/3036 (commit b08e5df8, scvi-tools 1.2.2, closing
    https://github.com/scverse/scvi-tools/issues/3035): with `train_size` left unset, `validate_data_split` takes a
    last minibatch of 1-2 cells out of the training set and adds it to the validation set (`n_train -= num_of_cells;
    n_val += num_of_cells`); `DataSplitter.setup` then cuts the same seeded permutation as `indices[:n_val]`,
    `indices[n_val : n_val + n_train]`, so the cell that moves is the training set's first, not the epoch's last.
    The training loader is unchanged (drop_last False); its shuffle is the case's epoch order over the cells that
    remain."""
    n_train = len(x.train_idx)
    num_of_cells = n_train % x.batch_size
    moved = num_of_cells if 0 < num_of_cells < 3 else 0  # train_size unset, drop_last False: #3035's call
    kept = torch.arange(moved, n_train, device=x.train_idx.device)  # positions in the old training set
    moved_x = x._replace(train_idx=x.train_idx[kept], epoch_order=[position - moved for position in x.epoch_order if position >= moved])
    model, step_model, optimizer = fresh_model(moved_x)
    model.train()
    for step, batch in enumerate(train_loader(moved_x)):
        loss = training_step(step_model, optimizer, batch["X"], moved_x, step)
    return trained(model, loss, moved_x)
