"""A correct fix of inplace_modified written differently from the case's own `fixed`: a grade must accept it, every time.
It uses only what the buggy code already uses from its case (helpers the model solution alone needs are
tripwired while a submitted fix runs)."""

import torch

from cases import inplace_modified as inplace_case


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
