"""Memory per step: how much a function keeps from one call to the next, and how high it goes in each.

The memory phase (harness/phases/) builds a case's inputs once and calls the function under test on them
`steps` times in an isolated child; each call is one step, state carried in the inputs as in a training loop.
The parent drives the steps (`drive_steps`, the child runs `serve_steps`): before each step the child
reports what it holds, the parent reads the child's resident memory and resets its high-water mark; after
the step the child reports again, and the parent reads the mark. The garbage collector runs as it would in
a training loop, on its own thresholds: the harness never forces a collection between steps, so memory
that only a collection would free (a reference cycle holding tensors, state a fix drops when it sees a
collection) counts as it would in a real run.

Sources, per device:
    cuda  the caching allocator's own counts: `memory_allocated` after each step (retained) and
          `max_memory_allocated` with `reset_peak_memory_stats` before each step (peak): every tensor on
          the device, exactly, without the cache the allocator keeps.
    cpu   two, because torch's CPU allocator keeps no statistics and tracemalloc sees only Python's heap:
          - glibc's `mallinfo2` (arena bytes in use + mmapped bytes), read in the child after each step:
            every malloc, torch's (c10 allocates CPU tensors with posix_memalign), numpy's, ctypes', to the byte;
          - the child's resident set (VmRSS) and its high-water mark (VmHWM), read by the parent from
            /proc/<pid>/status, the mark reset before each step by writing 5 to /proc/<pid>/clear_refs:
            pages actually touched, mmap included, measured from outside the process.
          The child pins glibc to return every block of 64 KiB or more to the system when it is freed
          (M_MMAP_THRESHOLD, fixed, and a low M_TRIM_THRESHOLD), so the resident set falls when a tensor
          is freed and the high-water mark is a step's real peak, not memory glibc kept from before.
          Retained growth is judged in whichever of the two series the fix outgrows its baseline most; the
          peak is the mark.

Processes the child starts (DataLoader workers) are measured where their memory grows: after each step the parent
sums the proportional set size of every descendant of the child (`workers_memory`, /proc/<pid>/smaps_rollup), less
its file-backed part, a series ("workers_pss") judged beside the child's own; the unique set size, the pages a worker
copied, is kept too, and so is the file-backed PSS. That part is left out of the judged series because it is not the
workers' to keep: it is their share of the page cache of the files they map (libtorch, libpython, numpy's
libraries), which every process on the machine that maps the same files shares, so it moves when an unrelated process
starts or exits. On a loaded 2-core machine it wandered by 1-2 MiB within a run (dataloader_worker_killed's flat
fixes and numpy columns, torch 2.13.0), and once jumped 4.4 MiB in one step: a flat fix read 1.0 MiB/step [0.63, 1.37]
against its budget of 0.75, undecided. What a worker copies on write, anonymous memory (and shared memory, tmpfs),
stays in.
The workers are the child's: the isolation layer bounds them in time and kills whatever the child leaves.

Figures are bytes above the level before the first measured step: `retained[i]` after step i, `peak[i]` the
highest during step i. The growth per step is the least-squares slope of `retained` over the steps, with a
Student t interval (level `level`): memory is nearly deterministic, so the interval is usually narrow, and
it says so where a step's allocations vary.
"""

from __future__ import annotations

import ctypes
import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from harness.measure.timing import student_t_quantile, synchronize
from harness.process.tree import descendants_of

MMAP_THRESHOLD = 64 << 10  # blocks this large or larger are mmapped, and unmapped when freed
TRIM_THRESHOLD = 128 << 10  # free memory at the heap's top beyond this goes back to the system
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
METHOD = "least-squares slope of retained bytes over steps, Student t interval"


@dataclass(frozen=True)
class MemorySettings:
    steps: int = 4  # measured steps (calls on one inputs object)
    warmup: int = 1  # steps run before the level is taken: compilation, lazily made state (an optimizer's moments)
    level: float = 0.95  # of the slope's interval


# -- the sources ---------------------------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None


_LIBC = _libc()


def pin_cpu_allocator() -> bool:
    """Make glibc hand every freed block of MMAP_THRESHOLD or more back to the system (see the module doc)."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and _LIBC.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def malloc_in_use() -> int | None:
    """Bytes glibc's malloc has handed out and not had back (all arenas, mmapped blocks included); None off glibc."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def resident(pid: int) -> dict[str, int]:
    """The resident set of process `pid` and its high-water mark, in bytes."""
    found = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    if len(found) < 2:
        raise OSError(f"process {pid} has no resident set (it has exited)")
    return {"rss": found["VmRSS"], "hwm": found["VmHWM"]}


def workers_memory(pid: int) -> dict[str, int]:
    """The memory of every process `pid` started and its own started (DataLoader workers, ranks), summed: the
    proportional set size less its file-backed part (`pss`: each shared anonymous or shared-memory page divided among
    the processes that map it, so the sum is what they cost together; the whole PSS where the kernel does not report
    Pss_File: kernels older than 5.9), that file-backed part (`pss_file`: their share of the page cache of mapped files, see
    the module doc), and the unique set size (`uss`: pages no other process maps, the copies a worker made of pages it
    shared with its parent), from /proc/<pid>/smaps_rollup (Linux >= 4.14); empty when it started none. A process
    that exits between the listing and the reading is left out."""
    pss = pss_file = uss = workers = 0
    for worker in descendants_of(pid):
        found = {}
        try:
            with open(f"/proc/{worker}/smaps_rollup") as rollup:
                for line in rollup:
                    key, _, value = line.partition(":")
                    if key in ("Pss", "Pss_File", "Private_Clean", "Private_Dirty"):
                        found[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            continue
        if "Pss" in found:
            workers += 1
            pss += found["Pss"] - found.get("Pss_File", 0)
            pss_file += found.get("Pss_File", 0)
            uss += found.get("Private_Clean", 0) + found.get("Private_Dirty", 0)
    return {"workers": workers, "pss": pss, "pss_file": pss_file, "uss": uss} if workers else {}


def reset_peak(pid: int) -> bool:
    """Reset the resident high-water mark of `pid` to its resident set now (Linux >= 4.0); False where refused."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def source_name(device: str) -> str:
    if device == "cuda":
        return "torch.cuda memory_allocated / max_memory_allocated (caching allocator statistics)"
    return "glibc mallinfo2 (in the child) and VmRSS/VmHWM with clear_refs (from the parent), glibc pinned to unmap freed blocks >= 64 KiB"


# -- the child: run the steps when told ------------------------------------------------------------------


def _held(device: str) -> dict[str, int | None]:
    if device == "cuda":
        synchronize(device)
        return {"allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated()}
    return {"in_use": malloc_in_use()}


def serve_steps(connection, function: Callable[[Any], Any], inputs: Any, device: str, steps: int, warmup: int) -> None:
    """In the child: `warmup` steps, then `steps` steps each between a report before and a report after.
    A step that raises ends the conversation; the exception propagates to the caller."""
    for _ in range(warmup):
        function(inputs)
    synchronize(device)
    for step in range(steps):
        connection.send_bytes(json.dumps({"before": step, **_held(device)}).encode())
        connection.recv_bytes()  # the parent has read the resident set and reset its mark
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        output = function(inputs)
        synchronize(device)
        del output  # a training loop drops the step's result; what the step keeps lives in `inputs`
        connection.send_bytes(json.dumps({"after": step, **_held(device)}).encode())
        connection.recv_bytes()  # the parent has read the mark: this process must live until it has
    connection.send_bytes(json.dumps({"end": steps}).encode())


# -- the parent: drive the steps and read the child's memory ---------------------------------------------


def drive_steps(connection, pid: int, deadline: float, device: str) -> dict[str, Any]:
    """The parent's side of `serve_steps`: per step, the child's reports and, on CPU, its resident memory."""
    rows: list[dict[str, Any]] = []
    resettable = True
    while True:
        if not connection.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the memory child stopped answering")
        said = json.loads(connection.recv_bytes())
        if "end" in said:
            return {"rows": rows, "hwm_reset": resettable}
        if "before" in said:
            row = {"before": said, "workers_before": workers_memory(pid)}
            if device == "cpu":
                row["rss_before"] = resident(pid)["rss"]
                resettable = reset_peak(pid) and resettable
            rows.append(row)
            connection.send_bytes(b"go")
        else:
            rows[-1].update(after=said, workers=workers_memory(pid))
            if device == "cpu":
                rows[-1].update(resident(pid))
            connection.send_bytes(b"read")


@dataclass(frozen=True)
class Slope:
    per_step: float  # bytes per step
    low: float
    high: float
    level: float

    def figures(self) -> dict[str, float]:
        return {"slope": self.per_step, "slope_low": self.low, "slope_high": self.high, "level": self.level}


def fit_slope(values: list[float], level: float) -> Slope:
    """The least-squares slope of `values` over their index, and its `level` Student t interval (n >= 3)."""
    n = len(values)
    if n < 3:
        return Slope(float("nan"), -math.inf, math.inf, level)
    xs = range(n)
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(values)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, values)) / sxx
    residual = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in zip(xs, values))
    half = student_t_quantile(0.5 + level / 2, n - 2) * math.sqrt(residual / (n - 2) / sxx)
    return Slope(slope, slope - half, slope + half, level)


@dataclass(frozen=True)
class StepMemory:
    """One function's memory over its steps: bytes above the level before the first measured step."""

    device: str
    retained: list[int]  # after each step: malloc'd bytes (cpu, glibc) or allocated bytes (cuda); else the resident set
    peak: list[int]  # the highest during each step: resident high-water mark (cpu) or max allocated (cuda)
    rss_retained: list[int] | None  # cpu: the resident set after each step
    fits: dict[str, Slope]  # the slope of each retained series: "malloc" and "rss" (cpu), "allocated" (cuda), "workers_pss"
    workers: dict[str, list[int]] | None = None  # the processes it started (DataLoader workers), after each step: count,
    # summed PSS less its file-backed part ("pss", the judged series), the file-backed PSS ("pss_file") and the USS

    @property
    def growth_series(self) -> str:
        """The series that grows fastest (upper bound; malloc's on a tie)."""
        return max(self.fits, key=lambda name: (self.fits[name].high, name == "malloc"))

    @property
    def growth(self) -> Slope:
        return self.fits[self.growth_series]

    @property
    def max_peak(self) -> int:
        return max(self.peak) if self.peak else 0

    def figures(self) -> dict[str, Any]:
        figures = {
            "retained": self.retained,
            "peak": self.peak,
            "max_peak": self.max_peak,
            "growth_series": self.growth_series,
            **self.growth.figures(),
        }
        if self.rss_retained is not None:
            figures["rss_retained"] = self.rss_retained
        if self.workers is not None:
            figures["workers"] = self.workers
        figures["slopes"] = {name: fit.figures() for name, fit in self.fits.items()}
        return figures


def step_memory(talked: dict[str, Any], device: str, level: float) -> StepMemory:
    rows = talked["rows"]
    workers = _workers_series(rows)
    worker_fits = {"workers_pss": fit_slope(workers["pss"], level)} if workers else {}
    if device == "cuda":
        level0 = rows[0]["before"]["allocated"]
        retained = [row["after"]["allocated"] - level0 for row in rows]
        peak = [row["after"]["max_allocated"] - level0 for row in rows]
        return StepMemory(device, retained, peak, None, {"allocated": fit_slope(retained, level), **worker_fits}, workers)
    rss0 = rows[0]["rss_before"]
    peak = [row["hwm"] - rss0 for row in rows]
    rss_retained = [row["rss"] - rss0 for row in rows]
    fits = {"rss": fit_slope(rss_retained, level)}
    retained = rss_retained
    if rows[0]["before"].get("in_use") is not None:
        in_use0 = rows[0]["before"]["in_use"]
        retained = [row["after"]["in_use"] - in_use0 for row in rows]
        fits["malloc"] = fit_slope(retained, level)
    return StepMemory(device, retained, peak, rss_retained, {**fits, **worker_fits}, workers)


def _workers_series(rows: list[dict[str, Any]]) -> dict[str, list[int]] | None:
    """The workers' summed PSS (less its file-backed part), file-backed PSS and USS after each step, above their level
    before the first measured step; None where the function started no process that lived through every step (a
    worker measured after some steps only is no series: its growth cannot be told from its birth)."""
    if not rows[0].get("workers_before") or not all(row.get("workers") for row in rows):
        return None
    first = rows[0]["workers_before"]
    return {
        "count": [row["workers"]["workers"] for row in rows],
        "pss": [row["workers"]["pss"] - first["pss"] for row in rows],
        "pss_file": [row["workers"]["pss_file"] - first["pss_file"] for row in rows],
        "uss": [row["workers"]["uss"] - first["uss"] for row in rows],
    }
