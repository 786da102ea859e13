"""The speed phase's clock belongs to the parent, which never imports the code it times.

A timing child serves blocks of calls (`serve`); the parent (`drive`) asks for each block over a pipe
and times it itself, from sending the request to reading the answer, on its own `perf_counter`. Code in
the child can patch every clock there (time.perf_counter, torch.cuda.Event, the harness's own globals)
and change nothing the parent reads. The parent also reads, from the kernel, the child's CPU time and
page faults around every block, so it sees work that escapes the clock:

    child_s      the child's own figure for each block: cross-checked, never used
    cpu_s        CPU time of the child and its processes during the block: more than its length means
                 more than one core worked (a thread or a process beside the call)
    outside      CPU time while the child should have been waiting for the next request: work deferred
                 past the end of a call (a thread, a signal handler, a process) shows up here

When grading, the parent picks after each candidate block, at random (CHECK_PROBABILITY), whether the
child sends one of that block's outputs back; the grader compares those with the reference in a clean
process (harness/grading/grade.py). The child cannot tell a checked call from any other: the choice is made
after the call has returned, in the parent.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from harness.measure.compare import flatten_tensors, snapshot
from harness.measure.timing import MAX_RETAKES, PairedSamples, sample_pairs
from harness.process.tree import minor_faults, tree_cpu_s

CHECK_PROBABILITY = 0.9  # of a timed candidate block: one of its outputs goes to the judge
_save = torch.save  # bound when the fork server imports this, before any submitted code
_synchronize = torch.cuda.synchronize


@dataclass(frozen=True)
class BlockTiming:
    side: str
    calls: int
    parent_s: float  # the whole block, on the parent's clock
    child_s: float  # the child's own figure for it
    cpu_s: float  # CPU time of the child's processes during the block
    checked: str | None = None  # the file of the output sent to the judge
    checked_step: int | None = None  # how many calls its child had made on its current inputs before that output's call


@dataclass
class TimedProcess:
    samples: PairedSamples
    blocks: list[BlockTiming] = field(default_factory=list)  # the timed ones, retaken pairs included
    outside_cpu_s: float = 0.0  # CPU time while the candidate's child should have been idle, after the warm-up
    disturbed: str | None = None  # another child's scheduling changed while it was timed (renice, policy, affinity)
    model_outside_cpu_s: float = 0.0  # the same for the model solution's child, where it has one of its own (grading)


# -- the child ----------------------------------------------------------------------------------------


def serve(
    connection,
    functions: dict[str, Callable[[Any], Any]],
    inputs: Any,
    device: str,
    fresh_inputs: Callable[[], Any] | None = None,
    *,
    traces: Callable[[], int] | None = None,
    served: dict[str, dict[str, int]] | None = None,
) -> None:
    """Answer the parent's requests until it says stop: run a block, send back or drop its outputs, make fresh inputs.
    With `traces` (a counter of frames the compiler traced) and `served`, each side's calls and the frames traced
    during them add up in `served[side]`: a compiled side traced again on every call is timing its tracer."""
    kept: list[Any] = []
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: a full collection lands on whichever sample happens to trigger it
    try:
        while True:
            request = json.loads(connection.recv_bytes())
            if request["op"] == "run":
                function = functions[request["side"]]
                kept = []
                traced_before = traces() if traces else 0
                seconds = _child_clock(lambda: kept.extend(function(inputs) for _ in range(request["calls"])), device)
                if traces and served is not None:
                    tally = served.setdefault(request["side"], {"calls": 0, "traced": 0})
                    tally["calls"] += request["calls"]
                    tally["traced"] += traces() - traced_before
                connection.send_bytes(json.dumps({"s": seconds}).encode())
            elif request["op"] == "send":
                connection.send_bytes(_as_bytes(kept[request["index"]]))
                kept = []
            elif request["op"] == "drop":
                kept = []
                connection.send_bytes(b"{}")
            elif request["op"] == "fresh_inputs":
                inputs = fresh_inputs()  # the warm-up's stay alive in the caller: no id() or address is reused
                _touch(inputs)
                connection.send_bytes(b"{}")
            else:
                return
    finally:
        if collecting:
            gc.enable()


def _child_clock(run: Callable[[], None], device: str) -> float:
    """The child's own figure for a block, read the way timing code usually reads it (time.perf_counter looked
    up at each call; CUDA events): a canary, never a decider. Code that patches those clocks makes it
    disagree with the parent's."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        _synchronize()
        return start.elapsed_time(end) / 1000
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _touch(inputs: Any) -> None:
    """Read every tensor of fresh inputs once, so that whichever side is timed first does not pay for their first touch."""
    for value in snapshot(inputs).values():
        if isinstance(value, torch.Tensor) and value.numel():
            value.float().sum() if not value.is_floating_point() else value.sum()


def _as_bytes(output: Any) -> bytes:
    try:
        tensors = [tensor.detach() for tensor in flatten_tensors(output)]
    except TypeError:
        return b"E" + f"returned {type(output).__name__}, not tensors".encode()
    buffer = io.BytesIO()
    _save(tensors, buffer)
    return b"T" + buffer.getvalue()


# -- the parent ---------------------------------------------------------------------------------------


def drive(
    children: dict[str, tuple[Any, int]],
    deadline: float,
    *,
    device: str,
    warmup: int,
    pairs: int,
    min_s: float,
    fresh_inputs: bool = False,
    check_dir: Path | None = None,
    max_retakes: int = MAX_RETAKES,
) -> TimedProcess:
    """The parent's side of `serve`: the samples, timed here; with `check_dir`, outputs kept for the judge.

    `children`: each side's child, (connection, pid); one child may serve several sides (a case's own timing),
    or each side its own (grading: the submission's child times "candidate" alone, children that never
    import it time "baseline" and "pristine"). Sides past the first two are timed beside each pair."""
    driver = _Driver(children, deadline, check_dir)
    try:
        with contextlib.suppress(_Disturbed):
            driver.timed.samples = sample_pairs(
                driver.block,
                device=device,
                warmup=warmup,
                pairs=pairs,
                min_s=min_s,
                before_timing=driver.make_fresh_inputs if fresh_inputs else None,
                others=tuple(children)[2:],
                max_retakes=max_retakes,
            )
    finally:
        for connection in {id(c): c for c, _ in children.values()}.values():
            stop(connection)
    return driver.timed


class _Driver:
    """What `drive` keeps between blocks: the children, their CPU time when last idle, their settings to watch."""

    def __init__(self, children: dict[str, tuple[Any, int]], deadline: float, check_dir: Path | None) -> None:
        self.children, self.deadline, self.check_dir = children, deadline, check_dir
        self.timed = TimedProcess(PairedSamples([], [], 1))
        self.candidate_pid = children["candidate"][1]
        self.idle_since: dict[int, float] = {}  # each child's CPU time when it last had nothing to do
        self.watched = {pid: process_settings(pid) for side, (_, pid) in children.items() if pid != self.candidate_pid}
        self.calls_on_inputs: dict[int, int] = {}  # per child: calls since its inputs were made (a stepwise case's state advances)

    def ask(self, connection, request: dict) -> bytes:
        connection.send_bytes(json.dumps(request).encode())
        if not connection.poll(max(0.0, self.deadline - time.monotonic())):
            raise TimeoutError("the timing child stopped answering")
        return connection.recv_bytes()

    def settle(self, side: str, request: dict) -> bytes:
        connection, pid = self.children[side]
        answer = self.ask(connection, request)
        self.idle_since[pid] = tree_cpu_s(pid)
        return answer

    def block(self, side: str, calls: int, is_timed: bool) -> tuple[float, int]:
        connection, pid = self.children[side]
        before = self.calls_on_inputs.get(pid, 0)
        self.calls_on_inputs[pid] = before + calls
        faults, cpu = minor_faults(pid), tree_cpu_s(pid)
        if is_timed and pid in self.idle_since:
            self._count_deferred(side, pid, max(0.0, cpu - self.idle_since[pid]))
        started = time.perf_counter()
        answer = json.loads(self.ask(connection, {"op": "run", "side": side, "calls": calls}))
        seconds = time.perf_counter() - started
        cpu_s, faulted = tree_cpu_s(pid) - cpu, minor_faults(pid) - faults
        checked = step = None
        if is_timed and side == "candidate" and self.check_dir is not None and secrets.randbelow(1 << 20) < CHECK_PROBABILITY * (1 << 20):
            index = secrets.randbelow(calls)
            checked = _keep(self.settle(side, {"op": "send", "index": index}), self.check_dir, len(self.timed.blocks))
            step = before + index
        else:
            self.settle(side, {"op": "drop"})
        if is_timed:
            self.timed.blocks.append(BlockTiming(side, calls, seconds, float(answer.get("s", 0.0)), cpu_s, checked, step))
            self._watch(side, pid)
        return seconds / calls, faulted

    def _count_deferred(self, side: str, pid: int, deferred: float) -> None:
        if pid == self.candidate_pid:
            self.timed.outside_cpu_s += deferred
        elif side == "baseline":
            self.timed.model_outside_cpu_s += deferred

    def _watch(self, side: str, pid: int) -> None:
        if pid in self.watched and self.timed.disturbed is None:
            now = process_settings(pid)
            if now != self.watched[pid]:
                self.timed.disturbed = f"the {side} child's scheduling changed while it was timed: {_changed(self.watched[pid], now)}"
                raise _Disturbed  # its samples are worth nothing now: stop here

    def make_fresh_inputs(self) -> None:
        first_side = {}
        for side, (_, pid) in self.children.items():
            first_side.setdefault(pid, side)
        for side in first_side.values():  # each child once
            self.settle(side, {"op": "fresh_inputs"})
        self.calls_on_inputs.clear()


class _Disturbed(Exception):
    """Raised inside `drive` when a child's scheduling changed: the process's sampling ends there."""


def stop(connection) -> None:
    """Tell a serving child to return (it may have gone already)."""
    with contextlib.suppress(OSError, EOFError, ValueError):
        connection.send_bytes(json.dumps({"op": "stop"}).encode())


def process_settings(pid: int) -> dict[str, Any]:
    """What another process of the same user could change about how a child is scheduled: each thread's
    nice value and policy, and the CPUs it may run on."""
    threads = {}
    try:
        for task in sorted(os.listdir(f"/proc/{pid}/task")):
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as stat:
                    fields = stat.read().rpartition(b")")[2].split()
                threads[task] = (int(fields[16]), int(fields[38]))  # nice, policy
    except OSError:
        return {}
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        cpus = []
    return {"nice_and_policy": sorted(set(threads.values())), "cpus": cpus}


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    said = []
    if before.get("nice_and_policy") != after.get("nice_and_policy"):
        said.append(f"(nice, policy) of its threads {before.get('nice_and_policy')} -> {after.get('nice_and_policy')}")
    if before.get("cpus") != after.get("cpus"):
        said.append(f"CPUs {before.get('cpus')} -> {after.get('cpus')}")
    return "; ".join(said)


def _keep(answer: bytes, check_dir: Path, index: int) -> str:
    path = check_dir / f"block-{index}.{'pt' if answer[:1] == b'T' else 'txt'}"
    path.write_bytes(answer[1:])
    return str(path)
