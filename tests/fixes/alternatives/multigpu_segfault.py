"""A correct fix of multigpu_segfault written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import os

import torch

from cases import multigpu_segfault as ddp_case
from cases._ddp_worker import launch


def _rank_without_the_override(job):
    rank, device = ddp_case.start_rank(job)
    os.environ.pop(ddp_case.PRECISION_ENV, None)  # one source for the precision: the launch's
    model = ddp_case.build_model(job, rank, getattr(torch, job.precision), device)
    return ddp_case.train(job, rank, model, device)


def multigpu_segfault(job):
    """Every rank drops the environment override before it builds its model, so no rank can differ."""
    return ddp_case.every_rank(
        launch(_rank_without_the_override, job, nprocs=job.ranks, max_restarts=job.max_restarts, deadline_s=job.deadline_s)
    )
