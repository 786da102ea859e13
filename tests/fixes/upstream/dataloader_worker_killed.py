"""Upstream's fix of dataloader_worker_killed, and the quick fix its PR names, each as a submission.

https://github.com/tier4/autoware-ml/pull/78 (merged 2026-07-24): `MultiViewDetection3DDataset` keeps its annotations
in a `SerializedSampleList` (each sample pickled into one bytes buffer, int64 offsets, a fresh `pickle.loads` per
read) instead of a `list[dict]`. Its diff is not in the stored snapshot of tier4/autoware-ml (04952df, the PR's
parent); the class is re-typed from the PR's description. The epoch, loader and items are the case's
(`read_batches`, `frame_tensors`, which the buggy code uses too). tests/test_upstream_fixes.py grades them;
docs/history/upstream_fixes.md has the verdicts.
"""

import pickle

import numpy as np
from torch.utils.data import Dataset

from cases.dataloader_worker_killed import ListDataset, frame_tensors, read_batches


class SerializedSampleList:
    """autoware-ml PR #78's container: one `bytes` buffer of pickled samples and their `np.int64` end offsets."""

    def __init__(self, samples):
        serialized = [pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL) for sample in samples]
        self._addr = np.cumsum(np.asarray([len(blob) for blob in serialized], dtype=np.int64))
        self._data = b"".join(serialized)

    def __len__(self):
        return len(self._addr)

    def __getitem__(self, index):
        start = 0 if index == 0 else int(self._addr[index - 1])
        return pickle.loads(memoryview(self._data)[start : int(self._addr[index])])


class MultiViewDetection3DDataset(Dataset):
    """The dataset after PR #78: `self.data_infos` a SerializedSampleList, `get_data_info(index)` unchanged."""

    def __init__(self, infos, max_instances):
        self.data_infos = SerializedSampleList(infos)
        self.max_instances = max_instances

    def __len__(self):
        return len(self.data_infos)

    def get_data_info(self, index):
        return self.data_infos[index]

    def __getitem__(self, index):
        return frame_tensors(self.get_data_info(index), self.max_instances)


def pr_78_serialized_sample_list(x):
    """https://github.com/tier4/autoware-ml/pull/78: the annotations in a fork-shared serialized buffer, so that a
    worker's reads write no reference count into the parent's pages."""
    return read_batches(x, "pr_78", MultiViewDetection3DDataset)


def pr_78_quick_fix_fewer_workers(x):
    """https://github.com/tier4/autoware-ml/pull/78's description: "A quick fix would be decreasing the number of
    workers" (not what it merged): the `list[dict]` dataset with one worker instead of two."""
    return read_batches(x, "pr_78_one_worker", ListDataset, workers=1)
