"""The maintainers' two answers in https://github.com/speechbrain/speechbrain/issues/2340, each as a submission.

Each rank is the case's (`start_rank`, `build_model`, `train`, which the buggy code uses too), launched by the case's
torch elastic agent over gloo; what changes is what SpeechBrain's run options or the model's config.json would
change. tests/test_upstream_fixes.py grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import torch
from torch.nn.parallel import DistributedDataParallel

from cases._ddp_worker import launch
from cases.ddp_unused_parameters import build_model, every_rank, start_rank, train


def _find_unused_parameters_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    return train(job, rank, model, DistributedDataParallel(model, find_unused_parameters=True))


def find_unused_parameters(job):
    """Adel-Moumen in https://github.com/speechbrain/speechbrain/issues/2340: "w2v2 from HF is using a layer dropout
    strategy which causes issues with DDP (and that is why you really need to specify
    `--find_unused_parameters=True`)": SpeechBrain's run option, which Brain hands to
    `DistributedDataParallel(module, find_unused_parameters=True)`."""
    return every_rank(launch(_find_unused_parameters_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s))


def _layerdrop_off_rank(job):
    rank = start_rank(job)
    model = build_model(job)
    every_layer = job._replace(keep=torch.ones_like(job.keep))  # layerdrop 0.0: no layer is ever skipped
    return train(every_layer, rank, model, DistributedDataParallel(model))


def deactivate_layerdrop(job):
    """TParcollet in https://github.com/speechbrain/speechbrain/issues/2340: "deactivate layer_drop in the config.json
    of the HuggingFace model ... this may result (or may not) in degraded downstream performance": `layerdrop: 0.0`,
    every encoder layer run every step, plain DDP."""
    return every_rank(launch(_layerdrop_off_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s))
