"""Failures that resemble the cases and belong to none of them: named, with what they are instead, when there is no
verdict."""

from __future__ import annotations

from harness.triage.records import Sign

LOOKALIKES = (
    Sign(
        "lookalike",
        r"Class values must be smaller than num_classes|Class values must be non-negative",
        1,
        "a class index outside [0, num_classes) in F.one_hot, not in the loss (target_out_of_bounds is the loss's): the labels need the same remapping",
    ),
    Sign(
        "lookalike",
        r"multi-target not supported|only batches of spatial targets supported|0D or 1D target tensor expected",
        1,
        "a loss target of the wrong shape (one-hot, or an extra channel dimension), not a class out of range",
    ),
    Sign(
        "lookalike",
        r"tokenization_\w+\.py|piece id is out of range|out of range integral type conversion attempted|sentencepiece",
        1,
        "an index error in a tokenizer (token ids outside its vocabulary), not an out-of-range lookup in a model",
    ),
    Sign(
        "lookalike",
        r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|can't allocate memory|exitcode *: *-9\b|[Ss]ignal 9 \(SIGKILL\)",
        1,
        "out of memory (on the GPU, or a process killed by SIGKILL, as the host's OOM killer does)",
    ),
    Sign(
        "lookalike",
        r"failed \(exitcode: 1\)|exitcode *: *1 \(pid",
        1,
        "a rank that exited with a Python error (exit code 1), not a signal: its own traceback, above the launcher's lines, says why",
    ),
    Sign(
        "lookalike",
        r"Watchdog caught collective operation timeout|NCCL watchdog|ran for \d+ milliseconds before timing out|Some NCCL operations have failed or timed out",
        1,
        "an NCCL timeout: a rank hung in a collective and the watchdog took the process down",
    ),
    Sign(
        "lookalike",
        r"DataLoader worker \(pid|encountered in worker\.|exited unexpectedly with exit code",
        1,
        "a DataLoader worker killed by a signal (a dataset or shared-memory problem), not a rank",
    ),
    Sign(
        "lookalike",
        r"ScatterGatherKernel\.cu|index \d+ is out of bounds for axis",
        1,
        "a gather/scatter or NumPy index out of range, not one of the cases' lookups",
    ),
    Sign(
        "lookalike",
        r"does not support bfloat16|not supported for autocast|In CPU autocast, but the target dtype is not supported",
        1,
        "autocast with a dtype the device lacks, not a device-type error",
    ),
    Sign(
        "lookalike",
        r"User provided device_type of '\w+', but \w+ is not available|autocast only affects CUDA ops, but CUDA is not available",
        1,
        "autocast's warning that it disabled itself (no CUDA here): a warning, not the device-type error",
    ),
    Sign(
        "lookalike",
        r"weight tensor should be defined either for all or no classes",
        1,
        "class weights of the wrong length for the loss, not the ignore label indexing them",
    ),
    Sign(
        "lookalike",
        r"only one element tensors can be converted to Python scalars",
        1,
        "a tensor of several values where Python expected one number (`.item()` on a per-GPU loss, `torch.tensor` of tensors)",
    ),
    Sign(
        "lookalike",
        r"index out of bounds: 0 <= \S*tmp<n>",
        1,
        "the bounds check of torch.compile's generated code with nothing saying which op: the kernel's name (`cpp_fused_...`, `triton_..._fused_...`) or the eager run's error names it",
    ),
    Sign(
        "lookalike",
        r"terminate called recursively|terminate called after throwing an instance of",
        1,
        "a C++ exception that escaped and aborted the process (under torch.compile on CPU, a bounds check inside a parallel kernel): rerun with OMP_NUM_THREADS=1 to get its message and the kernel's name",
    ),
    Sign(
        "lookalike",
        r"Graph break from|Graph break: from user code|hit config\.(?:recompile|cache_size)_limit|FailOnRecompileLimitHit",
        1,
        "a torch.compile warning (a graph break, the recompile limit), not an index error: the failure, if any, is elsewhere in the log",
    ),
    Sign(
        "lookalike",
        r"device-side assert(ion)? triggered",
        1,
        "a device-side assert whose kernel line is missing: rerun with CUDA_LAUNCH_BLOCKING=1 and paste the lines with `Assertion`",
    ),
)
