"""A correct fix of ddp_unused_parameters written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cases import ddp_unused_parameters as layerdrop_case
from cases._ddp_worker import launch


def _rank_averaging_gradients_itself(job):
    rank = layerdrop_case.start_rank(job)
    model = layerdrop_case.build_model(job)
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=job.lr)
    frames, labels = layerdrop_case.rank_batch(job, rank)
    for step in range(job.steps):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(frames, job.keep[step, rank].tolist()), labels).backward()
        used = torch.tensor([float(p.grad is not None) for p in params], dtype=params[0].dtype)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params] + [used])
        dist.all_reduce(flat)  # one collective a step: every gradient, and how many ranks used each parameter
        grads, users = flat[: -len(params)].split([p.numel() for p in params]), flat[-len(params) :]
        for p, grad, count in zip(params, grads, users.tolist()):
            p.grad = grad.view_as(p) / dist.get_world_size() if count else None  # no rank used it: no gradient, as DDP leaves it
        optimizer.step()
    return {name: p.detach().numpy() for name, p in model.named_parameters()}


def ddp_unused_parameters(job):
    """No DDP: each rank sums every gradient and a used-flag per parameter in one all-reduce, then averages."""
    return layerdrop_case.every_rank(launch(_rank_averaging_gradients_itself, job, nprocs=job.ranks, deadline_s=job.deadline_s))
