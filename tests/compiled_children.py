"""What test_compiled runs in an isolated child: a module of its own, since a child importing a test module
would import conftest, which probes the devices in a child of its own."""

from harness import compiled as compile_axis


def prepared_in_a_rank_of_a_graded_child(scratch: str):
    import os

    import torch._inductor.config as inductor_config

    os.environ["TMPDIR"] = scratch
    graded = compile_axis.prepare(private=True)  # the graded child, before its launcher starts the ranks
    rank = compile_axis.prepare(private=False)  # a rank: the case's code asks for the shared cache
    headers = getattr(inductor_config, "cpp_cache_precompile_headers", False)
    return graded, rank, headers
