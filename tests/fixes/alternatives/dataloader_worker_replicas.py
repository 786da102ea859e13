"""dataloader_worker_replicas: an alternative correct fix, written differently from the case's own `fixed`."""

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from cases.dataloader_worker_replicas import epoch


class ReseededPerProcess(Dataset):
    """The dataset reseeds its own generators the first time it is read in a new process, from `torch.initial_seed()`
    (in a worker: the base seed torch draws every epoch plus the worker id), one SeedSequence for the sample's raw and
    label augmentations alike; no worker_init_fn."""

    def __init__(self, observed):
        self.observed, self.pid = observed, os.getpid()

    def __len__(self):
        return len(self.observed)

    def __getitem__(self, idx):
        if os.getpid() != self.pid:
            self.pid = os.getpid()
            seed = int(np.random.SeedSequence(torch.initial_seed()).generate_state(1)[0])
            dataset = self.observed.dataset
            for compose in (dataset.raw_transform, dataset.label_transform):
                for augmentation in compose.transforms:
                    if hasattr(augmentation, "random_state"):
                        augmentation.random_state.seed(seed)
        return self.observed[idx]


def dataloader_worker_replicas(x):
    return epoch(x, dataset=ReseededPerProcess(x.dataset))
