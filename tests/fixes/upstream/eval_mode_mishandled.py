"""Upstream's fix of eval_mode_mishandled as a submission.

The inference is the case's (`loaded`, `next_token_probs`, `handed_back`, which the buggy code uses too); only the line
that puts the model in evaluation mode is upstream's. Graded by tests/test_upstream_fixes.py; its full grade is in
docs/history/upstream_fixes.md.
"""

from cases.eval_mode_mishandled import handed_back, loaded, next_token_probs


def torchtune_pr_1049_model_eval(x):
    """https://github.com/meta-pytorch/torchtune/pull/1049 ("Put model in eval mode for evaluation", for
    https://github.com/meta-pytorch/torchtune/issues/1047), its changelog "Adds `model.eval()`": the model set up, then
    put in evaluation mode before the evaluation runs, and left there (torchtune's eval recipe ends after it)."""
    model = loaded(x)
    model.eval()
    return handed_back(model, next_token_probs(model, x))
