"""The maintainer's fix of inplace_modified, as the commit wrote it, as a submission.

The step is the case's first iteration of the loop (`fresh_models`, `trained`, which the buggy code uses too).
tests/test_upstream_fixes.py grades it; docs/history/upstream_fixes.md has the verdict.
"""

import torch

from cases.inplace_modified import fresh_models, trained


def commit_f52e199(x):
    """https://github.com/MorvanZhou/PyTorch-Tutorial/commit/f52e199a4f9e73b466d5380fd113273c613d47ca ("update for new
    version of torch", 2020-06-08; https://github.com/MorvanZhou/PyTorch-Tutorial/pull/91, for
    https://github.com/MorvanZhou/PyTorch-Tutorial/issues/89), tutorial-contents/406_GAN.py: G's loss, backward and
    step first, through D as it was; then D on the real paintings and on `G_paintings.detach()`, D's backward (its
    `retain_graph=True` kept) and step. The ideas are drawn `requires_grad=True` there; here a copy of the inputs'
    ideas, so the inputs stay as they were."""
    G, D, opt_G, opt_D = fresh_models(x)
    artist_paintings = x.paintings  # real painting from artist
    G_ideas = x.ideas.detach().clone().requires_grad_(True)  # random ideas
    G_paintings = G(G_ideas)  # fake painting from G (random ideas)
    prob_artist1 = D(G_paintings)  # D try to reduce this prob
    G_loss = torch.mean(torch.log(1.0 - prob_artist1))
    opt_G.zero_grad()
    G_loss.backward()
    opt_G.step()

    prob_artist0 = D(artist_paintings)  # D try to increase this prob
    prob_artist1 = D(G_paintings.detach())  # D try to reduce this prob
    D_loss = -torch.mean(torch.log(prob_artist0) + torch.log(1.0 - prob_artist1))
    opt_D.zero_grad()
    D_loss.backward(retain_graph=True)  # reusing computational graph
    opt_D.step()
    return trained(G, D)
