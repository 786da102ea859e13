"""What test_memory measures in an isolated child: steps with a known memory pattern (a module of its own, since a
child importing a test module would import conftest, which probes the devices in a child of its own)."""

import ctypes
import mmap

import numpy as np
import torch

from harness.measure import footprint as memory

MIB = 1 << 20


def keeps_one_mib(state):
    state["kept"].append(torch.ones(MIB // 4))  # float32: 1 MiB retained per step


def allocates_and_frees_64_mib(state):
    return torch.ones(64 * MIB // 4).sum()  # 64 MiB during the step, nothing kept


def keeps_one_mib_in_numpy(state):
    state["kept"].append(np.ones(MIB // 8))  # float64


_LIBC = ctypes.CDLL("libc.so.6")  # once: a CDLL made per call is cyclic garbage, freed by a later collection (1.2 MiB at once)
_LIBC.malloc.restype = ctypes.c_void_p


def keeps_one_mib_by_ctypes_malloc(state):
    block = _LIBC.malloc(MIB)
    ctypes.memset(block, 1, MIB)
    state["kept"].append(block)


def keeps_one_mib_in_mmap(state):
    mapped = mmap.mmap(-1, MIB)
    mapped.write(b"\1" * MIB)  # touched: resident
    state["kept"].append(mapped)


def training_step(state):
    """A flat step: a small MLP, Adam, the loss logged as a float."""
    model, optimizer = state["model"], state["optimizer"]
    loss = model(torch.randn(64, 256)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    state["kept"].append(loss.item())


def training_step_keeping_the_graph(state):
    """The graph_kept_alive pattern: the loss tensor (and its graph) kept for logging."""
    model, optimizer = state["model"], state["optimizer"]
    loss = model(torch.randn(64, 256)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
    state["kept"].append(loss)


def _state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    return {"kept": [], "model": model, "optimizer": torch.optim.Adam(model.parameters())}


def measure_in_child(pattern: str, steps: int, warmup: int, *, connection):
    memory.pin_cpu_allocator()
    torch.set_num_threads(1)
    memory.serve_steps(connection, globals()[pattern], _state(), "cpu", steps, warmup)


def measure_on_cuda_in_child(steps: int, *, connection):
    state = {"kept": []}
    memory.serve_steps(connection, lambda s: s["kept"].append(torch.ones(MIB // 4, device="cuda")), state, "cuda", steps, 1)


def _worker(connection, how: str) -> None:
    kept = []
    if how == "maps_a_file":
        import tempfile

        with tempfile.TemporaryFile() as file:  # written now: its pages are in the page cache, mapped by no one yet
            file.write(b"\1" * (64 * MIB))
            file.flush()
            mapped = mmap.mmap(file.fileno(), 64 * MIB, prot=mmap.PROT_READ)
    while connection.recv() == "step":
        if how == "keeps":
            kept.append(bytearray(b"\1" * MIB))  # 1 MiB written in the worker each step
        elif how == "maps_a_file":  # 1 MiB more of a file's pages read through a mapping each step: page cache, not a copy
            start = len(kept) * MIB
            kept.append(sum(mapped[offset] for offset in range(start, start + MIB, mmap.PAGESIZE)))
        connection.send("done")


def _step_in_a_worker(state, how: str):
    if "worker" not in state:  # started in the warm-up, as a DataLoader starts its workers on the first batch
        import multiprocessing

        ours, theirs = multiprocessing.get_context("fork").Pipe()
        state["worker"] = multiprocessing.get_context("fork").Process(target=_worker, args=(theirs, how), daemon=True)
        state["worker"].start()
        state["to_worker"] = ours
    state["to_worker"].send("step")
    state["to_worker"].recv()


def worker_keeps_one_mib(state):
    _step_in_a_worker(state, "keeps")


def worker_keeps_nothing(state):
    _step_in_a_worker(state, "nothing")


def worker_maps_one_mib_of_a_file(state):
    _step_in_a_worker(state, "maps_a_file")
