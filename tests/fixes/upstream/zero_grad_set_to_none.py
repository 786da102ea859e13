"""Upstream's fix of zero_grad_set_to_none as a submission.

The training is the case's (`train`, which the buggy code uses too); only the server's zero_grad call is upstream's.
Graded by tests/test_upstream_fixes.py; the grades are in docs/history/upstream_fixes.md.
"""

from cases.zero_grad_set_to_none import train


def pr_1172_set_to_none_false(x):
    """https://github.com/pytorch/examples/pull/1172, commit 6fc19c7 ("fix zero_grad default parameter", 2023-07-22,
    read in the repository's history): in `BatchUpdateParameterServer.update_and_fetch_model`
    (distributed/rpc/batch/parameter_server.py) `self.optimizer.zero_grad()` became
    `self.optimizer.zero_grad(set_to_none=False)`; nothing else changed."""
    return train(x, lambda server: server.optimizer.zero_grad(set_to_none=False))
