"""What test_compiled runs in an isolated child: a module of its own, since a child importing a test module
would import conftest, which probes the devices in a child of its own."""

from harness import compiled as compile_axis


def prepared_in_a_rank_of_a_graded_child(scratch: str):
    import os

    import torch._inductor.config as inductor_config

    os.environ["TMPDIR"] = scratch
    graded = compile_axis.prepare(private=True)  # the graded child, before its launcher starts the ranks
    rank = compile_axis.prepare(private=False)  # a rank: the case's code asks for the shared cache
    from torch._inductor import codecache

    headers = getattr(inductor_config, "cpp_cache_precompile_headers", False) and getattr(codecache, "_HEADER_DIR", None)
    return graded, rank, headers


def compiled_at(torch_threads: int, cache: str, kernel_threads: int | None) -> dict:
    """A small function compiled as a phase's child compiles it, with torch at `torch_threads`: the FX cache's counts."""
    import os

    import torch
    from torch._dynamo.utils import counters

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch.set_num_threads(torch_threads)
    cfg = {"compile": "inductor"} if kernel_threads is None else {"compile": "inductor", "kernel_threads": kernel_threads}
    compile_axis.compiled(lambda x: (torch.sin(x) * 2 + x.cumsum(0)).sum(1), cfg)(torch.randn(64, 1000))
    return {key: value for key, value in counters["inductor"].items() if key.startswith("fxgraph_cache")}
