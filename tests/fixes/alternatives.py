"""Correct fixes written differently from each case's own `fixed`: a grade must accept them, every time.

Each uses only what the buggy code already uses from its case (helpers the model solution alone needs
are tripwired while a submitted fix runs).
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cases import autocast_device as autocast_case, backward_twice as twice_case, codebook_oob as codebook_case, ddp_unused_parameters as layerdrop_case
from cases import graph_kept_alive as graph_case, inplace_modified as inplace_case, multigpu_segfault as ddp_case
from cases._ddp_worker import launch


def embedding_oob(x):
    """searchsorted for the bins, index_select for the rows."""
    bins = torch.searchsorted(x.bin_edges, x.features.contiguous())
    emotion = x.table_by_bins.index_select(0, bins.reshape(-1)).reshape(*bins.shape, -1)  # (B, T, D)
    return F.conv1d(emotion.transpose(1, 2), x.conv_weight, padding=1)


def class_weight_index(x):
    """PyTorch's own weighted mean, written from its documentation."""
    return x.loss_weight * F.cross_entropy(x.pred, x.label, weight=x.class_weight, ignore_index=x.ignore_index)


def codebook_oob(x):
    """Special ids masked to -inf before the argmax (the last layer keeps end-of-audio), not sliced away."""
    masked = x.logits.clone()
    masked[:, :, codebook_case.AUDIO_VOCAB :] = float("-inf")
    masked[:, -1, codebook_case.AUDIO_VOCAB : codebook_case.EOA + 1] = x.logits[:, -1, codebook_case.AUDIO_VOCAB : codebook_case.EOA + 1]
    codes = masked.argmax(-1)
    return codebook_case.decode(x, codes[: codebook_case.stream_length(codes)])


def autocast_device(x):
    """The device type as the text before the colon, not through torch.device."""
    return autocast_case.train(x, lambda brain: setattr(brain, "device_type", brain.device.partition(":")[0]))


def _rank_without_the_override(job):
    rank, device = ddp_case.start_rank(job)
    os.environ.pop(ddp_case.PRECISION_ENV, None)  # one source for the precision: the launch's
    model = ddp_case.build_model(job, rank, getattr(torch, job.precision), device)
    return ddp_case.train(job, rank, model, device)


def multigpu_segfault(job):
    """Every rank drops the environment override before it builds its model, so no rank can differ."""
    return ddp_case.every_rank(launch(_rank_without_the_override, job, nprocs=job.ranks, max_restarts=job.max_restarts, deadline_s=job.deadline_s))


def inplace_modified(x):
    """One forward; each loss's gradient by torch.autograd.grad for its own network's parameters, handed to
    `.grad`; then both optimizers step, after every gradient is taken."""
    G, D, opt_G, opt_D = inplace_case.fresh_models(x)
    fake = G(x.ideas)
    real_score, fake_score = D(x.paintings), D(fake)
    d_loss = -(torch.log(real_score) + torch.log(1 - fake_score)).mean()
    g_loss = torch.log(1 - fake_score).mean()
    d_params, g_params = list(D.parameters()), list(G.parameters())
    d_grads = torch.autograd.grad(d_loss, d_params, retain_graph=True)
    g_grads = torch.autograd.grad(g_loss, g_params)
    for parameter, grad in zip(d_params + g_params, d_grads + g_grads):
        parameter.grad = grad
    opt_D.step()
    opt_G.step()
    return inplace_case.trained(G, D)


def target_out_of_bounds(x):
    """Nearest resize by striding (scale 0.5), then the class of each grey value by comparing with every known value."""
    step_y = x.mask_image.shape[-2] // x.masks_pred.shape[-2]
    step_x = x.mask_image.shape[-1] // x.masks_pred.shape[-1]
    resized = x.mask_image[:, ::step_y, ::step_x]
    matches = resized.unsqueeze(-1) == x.mask_values  # (N, h, w, K)
    torch._assert_async(matches.any(-1).all(), "a mask value outside mask_values")
    true_masks = matches.to(torch.uint8).argmax(-1)
    probs = F.softmax(x.masks_pred, dim=1)
    one_hot = F.one_hot(true_masks, x.n_classes).permute(0, 3, 1, 2).float()
    overlap = (probs * one_hot).sum(dim=(0, 2, 3))
    sizes = probs.sum(dim=(0, 2, 3)) + one_hot.sum(dim=(0, 2, 3))
    dice = ((2 * overlap + 1e-6) / (sizes + 1e-6)).mean()
    return F.cross_entropy(x.masks_pred, true_masks) + 1 - dice


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


def backward_twice(x):
    """pytorch/examples' word_language_model placement: the carried state repackaged (detached) before each window's
    forward, rather than after the forward that made it."""
    predictions = []
    for _ in range(x.windows_per_call):
        inputs, target = twice_case.next_window(x)
        repackaged = None if x.h_state is None else x.h_state.detach()
        prediction, x.h_state = x.model(inputs, repackaged)
        loss = torch.nn.functional.mse_loss(prediction, target)
        x.optimizer.zero_grad()
        loss.backward()
        x.optimizer.step()
        predictions.append(prediction)
    return twice_case.trained(x, predictions)


@torch.inference_mode()
def graph_kept_alive(x):
    """The whole batch in inference mode (a decorator, not a no_grad block); the loss by the functional form, summed
    into a fresh tensor rather than in place."""
    images, labels = x.next_batch()
    batch_loss = F.binary_cross_entropy(x.network(images), labels)
    epoch = x.epoch
    epoch.losstensorMean = batch_loss + epoch.losstensorMean
    epoch.lossVal += float(batch_loss)
    epoch.lossValNorm += 1
    return graph_case.running_means(epoch)
