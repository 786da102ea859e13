"""FARM's fix of loss_broadcast, as its commit wrote it, as a submission.

The epoch is the case's FARM Trainer loop (`train_epoch`, which the buggy code uses too); what the PR changes is
`RegressionHead.logits_to_loss`. tests/test_upstream_fixes.py grades it; docs/history/upstream_fixes.md has the
verdict.
"""

from cases.loss_broadcast import train_epoch


def pr_230_no_squeeze(x):
    """https://github.com/deepset-ai/FARM/pull/230 (commit 58a354fe, "Fix shape of logits in regression head",
    FARM 0.4.1, for https://github.com/deepset-ai/FARM/issues/229), farm/modeling/prediction_head.py: the comment
    "Squeeze the logits to obtain a coherent output size" and the squeeze removed,
    `return self.loss_fct(logits, label_ids.float())`."""

    def logits_to_loss(x, logits, label_ids):
        return x.loss_fct(logits, label_ids.float())

    return train_epoch(x, logits_to_loss)
