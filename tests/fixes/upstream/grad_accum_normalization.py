"""Upstream's fixes of grad_accum_normalization as submissions, in the order upstream applied them.

The model, the micro-batches and the loss are the case's (`causal_lm_loss`, `accumulate`, `training_outputs`); only
the normalisation is upstream's. transformers' fix is re-typed from the case's reading of #34191 (the Trainer's
`num_items_in_batch` and `ForCausalLMLoss`, quoted in cases/grad_accum_normalization.py): the repository's snapshot is
too large to bring here, so its diff was not read. torchtune's are re-typed from its commits 23c8829a (#1875) and
2fa6a54a (#1917), read in its history (recipes/full_finetune_single_device.py). Graded by
tests/test_upstream_fixes.py; the grades are in docs/history/upstream_fixes.md.
"""

import torch

from cases.grad_accum_normalization import IGNORE_INDEX, accumulate, causal_lm_loss
from harness.measure.compare import training_outputs


def transformers_pr_34191_num_items_in_batch(x):
    """https://github.com/huggingface/transformers/pull/34191 (transformers 4.46; finished by #34283): the Trainer
    counts `num_items_in_batch = sum([(batch["labels"].ne(-100)).sum() for batch in batch_samples])` over the window
    before its first forward, the causal LM's loss is `cross_entropy(..., reduction="sum") / num_items_in_batch`, and
    the loss is no longer divided by the accumulation steps."""
    num_items_in_batch = sum([(labels.ne(IGNORE_INDEX)).sum() for _, labels in x.micro_batches])
    return accumulate(x, lambda logits, labels: causal_lm_loss(logits, labels, num_items_in_batch=num_items_in_batch))


def torchtune_pr_1875_one_backward_per_window(x):
    """https://github.com/meta-pytorch/torchtune/pull/1875 (commit 23c8829a, "Normalize CE loss by total number of
    (non-padding) tokens", 2024-10-25): `current_num_tokens = (batch["labels"] != ignore_index).sum()` added to
    `num_tokens`; `running_loss += self._loss_step(batch) * current_num_tokens` (the mean loss times its count, no
    backward yet); at the step `loss = running_loss / num_tokens; loss.backward()`, and `loss` is logged. torchtune's
    `_loss_step` shifts the labels after they are counted, as here (every prompt's first label is -100)."""
    x.model.zero_grad(set_to_none=True)
    running_loss, num_tokens = 0, 0
    for input_ids, labels in x.micro_batches:
        current_num_tokens = (labels != IGNORE_INDEX).sum()
        num_tokens += current_num_tokens
        running_loss += causal_lm_loss(x.model(input_ids), labels) * current_num_tokens
    loss = running_loss / num_tokens
    loss.backward()
    return training_outputs(x.model, loss.detach())


def torchtune_pr_1917_backward_each_batch(x):
    """https://github.com/meta-pytorch/torchtune/pull/1917 (commit 2fa6a54a, "Restore backward after each batch for
    grad accum", 2024-10-31): `current_loss = self._loss_step(batch) * current_num_tokens`, `running_loss +=
    current_loss`, `current_loss.backward()` each batch; at the step `training.scale_grads(self._model, 1 /
    num_tokens)` (each gradient multiplied by it) before the optimizer; logged `running_loss / num_tokens`."""
    x.model.zero_grad(set_to_none=True)
    running_loss, num_tokens = 0, 0
    for input_ids, labels in x.micro_batches:
        current_num_tokens = (labels != IGNORE_INDEX).sum()
        num_tokens += current_num_tokens
        current_loss = causal_lm_loss(x.model(input_ids), labels) * current_num_tokens
        running_loss += current_loss.detach()
        current_loss.backward()
    with torch.no_grad():
        for p in x.model.parameters():
            if p.grad is not None:
                p.grad *= 1 / num_tokens
    return training_outputs(x.model, running_loss / num_tokens)
