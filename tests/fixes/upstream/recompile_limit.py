"""The maintainer's two options for recompile_limit, as kijai committed them to ComfyUI-MochiWrapper (no PR), and the
limit auto-round merged for the same warning, each as a submission.

The session, the block and the step are the case's (`compiled_block`, `denoise`, `next_prompt`, which the buggy code
uses too); `compiled_block` compiles the block once per session as `torch.compile(block, **options)` with the
run's backend, as the wrapper's compile node does (`fullgraph` False, its default). tests/test_upstream_fixes.py
grades them; docs/history/upstream_fixes.md has the verdicts.
"""

import torch
import torch._dynamo

from cases.recompile_limit import compiled_block, denoise, next_prompt


def commit_f6020f71_dynamic(x):
    """https://github.com/kijai/ComfyUI-MochiWrapper/commit/f6020f71e07537e6ec6c3e7743b21e8f38a604a0 ("dynamic compile",
    2024-11-05, for https://github.com/kijai/ComfyUI-MochiWrapper/issues/44): the compile node's new `dynamic`
    option (default False) passed through, `torch.compile(block, fullgraph=compile_args["fullgraph"],
    dynamic=compile_args["dynamic"], backend=compile_args["backend"])`; here set, `dynamic=True`."""
    compile_args = {"fullgraph": False, "dynamic": True}
    block = compiled_block(x, "f6020f71", fullgraph=compile_args["fullgraph"], dynamic=compile_args["dynamic"])
    return denoise(block, next_prompt(x))


def commit_d3287d61_cache_size_limit(x):
    """https://github.com/kijai/ComfyUI-MochiWrapper/commit/d3287d61b7d94603481ce8109794c57786b3e7ca ("Allow settin
    dynamo_cache_size_limit", 2024-11-06): the compile node's `dynamo_cache_size_limit` option, default 64, set
    process-wide before compiling, `torch._dynamo.config.cache_size_limit = compile_args["dynamo_cache_size_limit"]`;
    `dynamic` left at its default, False."""
    compile_args = {"fullgraph": False, "dynamic": False, "dynamo_cache_size_limit": 64}
    torch._dynamo.config.cache_size_limit = compile_args["dynamo_cache_size_limit"]
    block = compiled_block(x, "d3287d61", fullgraph=compile_args["fullgraph"], dynamic=compile_args["dynamic"])
    return denoise(block, next_prompt(x))


def auto_round_pr_1786_limit_16(x):
    """https://github.com/intel/auto-round/pull/1786, for https://github.com/intel/auto-round/issues/1679 (the same
    warning from one compiled function over changing shapes): the maintainers raised dynamo's limit to 16 rather than
    compile with `dynamic=True`; put in the wrapper's terms, the limit 16 and `dynamic=False`."""
    torch._dynamo.config.cache_size_limit = 16
    block = compiled_block(x, "auto_round_16", fullgraph=False, dynamic=False)
    return denoise(block, next_prompt(x))
