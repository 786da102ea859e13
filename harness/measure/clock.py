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
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from harness.measure.compare import flatten_tensors, snapshot
from harness.measure.timing import MAX_RETAKES, PairedSamples, estimate_ratio, sample_pairs
from harness.process.confine import minor_faults, tree_cpu_s

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
    connection, functions: dict[str, Callable[[Any], Any]], inputs: Any, device: str, fresh_inputs: Callable[[], Any] | None = None
) -> None:
    """Answer the parent's requests until it says stop: run a block, send back or drop its outputs, make fresh inputs."""
    kept: list[Any] = []
    collecting = gc.isenabled()
    gc.disable()  # as timeit does: a full collection lands on whichever sample happens to trigger it
    try:
        while True:
            request = json.loads(connection.recv_bytes())
            if request["op"] == "run":
                function = functions[request["side"]]
                kept = []
                seconds = _child_clock(lambda: kept.extend(function(inputs) for _ in range(request["calls"])), device)
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
    timed = TimedProcess(PairedSamples([], [], 1))
    candidate_pid = children["candidate"][1]
    idle_since: dict[int, float] = {}  # each child's CPU time when it last had nothing to do
    watched = {pid: process_settings(pid) for side, (_, pid) in children.items() if pid != candidate_pid}

    def ask(connection, request: dict) -> bytes:
        connection.send_bytes(json.dumps(request).encode())
        if not connection.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError("the timing child stopped answering")
        return connection.recv_bytes()

    def settle(side: str, request: dict) -> bytes:
        connection, pid = children[side]
        answer = ask(connection, request)
        idle_since[pid] = tree_cpu_s(pid)
        return answer

    calls_on_inputs: dict[int, int] = {}  # per child: calls since its inputs were made (a stepwise case's state advances)

    def block(side: str, calls: int, is_timed: bool) -> tuple[float, int]:
        connection, pid = children[side]
        before = calls_on_inputs.get(pid, 0)
        calls_on_inputs[pid] = before + calls
        faults, cpu = minor_faults(pid), tree_cpu_s(pid)
        if is_timed and pid in idle_since:
            deferred = max(0.0, cpu - idle_since[pid])
            if pid == candidate_pid:
                timed.outside_cpu_s += deferred
            elif side == "baseline":
                timed.model_outside_cpu_s += deferred
        started = time.perf_counter()
        answer = json.loads(ask(connection, {"op": "run", "side": side, "calls": calls}))
        seconds = time.perf_counter() - started
        cpu_s, faulted = tree_cpu_s(pid) - cpu, minor_faults(pid) - faults
        checked = step = None
        if is_timed and side == "candidate" and check_dir is not None and secrets.randbelow(1 << 20) < CHECK_PROBABILITY * (1 << 20):
            index = secrets.randbelow(calls)
            checked, step = _keep(settle(side, {"op": "send", "index": index}), check_dir, len(timed.blocks)), before + index
        else:
            settle(side, {"op": "drop"})
        if is_timed:
            timed.blocks.append(BlockTiming(side, calls, seconds, float(answer.get("s", 0.0)), cpu_s, checked, step))
            if pid in watched and timed.disturbed is None:
                now = process_settings(pid)
                if now != watched[pid]:
                    timed.disturbed = f"the {side} child's scheduling changed while it was timed: {_changed(watched[pid], now)}"
                    raise _Disturbed  # its samples are worth nothing now: stop here
        return seconds / calls, faulted

    def make_fresh_inputs() -> None:
        first_side = {}
        for side, (_, pid) in children.items():
            first_side.setdefault(pid, side)
        for side in first_side.values():  # each child once
            settle(side, {"op": "fresh_inputs"})
        calls_on_inputs.clear()

    try:
        with contextlib.suppress(_Disturbed):
            timed.samples = sample_pairs(
                block,
                device=device,
                warmup=warmup,
                pairs=pairs,
                min_s=min_s,
                before_timing=make_fresh_inputs if fresh_inputs else None,
                others=tuple(children)[2:],
                max_retakes=max_retakes,
            )
    finally:
        for connection in {id(c): c for c, _ in children.values()}.values():
            stop(connection)
    return timed


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


# -- what the parent saw, judged ------------------------------------------------------------------------

CLOCK_SLACK_S = 0.002  # per block: the pipe's round trip and a wake-up on a loaded machine
CLOCK_AGREEMENT = 0.9  # the child's clock must account for this share of the parent's, for the candidate's blocks
# (on CPU, of the time the child was on a CPU within each block: a loaded machine keeps a child waiting between
# the request and its own clock's start, and that wait is the parent's alone; a patched clock shows on a quiet one)
EXTRA_CORES = 1.25  # CPU time / wall time of a block past which more than one core worked (CPU timing is single-threaded)
OUTSIDE_SHARE = 0.1  # CPU while the clock was stopped, as a share of the candidate's timed time, past which work escaped it
OUTSIDE_FLOOR_S = 0.02
MODEL_MARGIN = 1.5  # a submission may work beside its calls as much as the model solution did in the same grade, times this
BASELINE_SLOWER = 1.25  # the baseline's time over its pristine copy's, beyond which (the interval's lower end) something reached it
STARVED_SHARE = 0.6  # the baseline's CPU share of its blocks' time, over the candidate's, below which it was kept off the CPU
REPEAT_GAIN = 2.0  # first timed candidate block / later ones, over the baseline's same ratio, past which a cache answered
# (1.7 was seen once from an honest fix; a cache that computes at most twice as long as it answers evades this, and gains less than 2x)


def clock_figures(processes: list[TimedProcess]) -> dict[str, Any]:
    """What the parent measured beside the samples, per timing process, for the record."""
    figures: dict[str, Any] = {"clock": "parent (each block timed from request to answer; the child's own clock cross-checked)"}
    for side in ("candidate", "baseline"):
        blocks = [b for p in processes for b in p.blocks if b.side == side]
        figures[f"{side}_parent_s"] = round(sum(b.parent_s for b in blocks), 6)
        figures[f"{side}_child_s"] = round(sum(b.child_s for b in blocks), 6)
        figures[f"{side}_cpu_s"] = round(sum(b.cpu_s for b in blocks), 6)
    figures["outside_cpu_s"] = round(sum(p.outside_cpu_s for p in processes), 6)
    figures.update(
        baseline_outside_cpu_s=round(sum(p.model_outside_cpu_s for p in processes), 6), baseline_cores=round(_model_cores(processes), 3)
    )
    gains = [g for g in (_repeat_gain(p) for p in processes) if g is not None]
    if gains:
        figures["repeat_gain"] = round(_geometric_mean(gains), 4)
    if all(p.samples.others.get("pristine") for p in processes) and processes:
        figures["baseline_vs_pristine"] = _baseline_vs_pristine(processes)
        figures["cpu_share"] = {side: round(_cpu_share(processes, side), 3) for side in ("candidate", "baseline", "pristine")}
    return figures


def _baseline_vs_pristine(processes: list[TimedProcess]) -> dict[str, Any]:
    """The baseline's time over its pristine copy's (children alike, timed in turn in the same processes)."""
    estimate = estimate_ratio([PairedSamples(p.samples.baseline_s, p.samples.others["pristine"], 1) for p in processes], 0.95)
    return {
        "ratio": round(estimate.ratio, 4),
        "ratio_low": round(estimate.ratio_low, 4),
        "ratio_high": round(estimate.ratio_high, 4),
        "pristine_s": estimate.baseline_s,
    }


def _cpu_share(processes: list[TimedProcess], side: str) -> float:
    shares = sorted(b.cpu_s / b.parent_s for p in processes for b in p.blocks if b.side == side and b.parent_s > 0)
    return shares[len(shares) // 2] if shares else 1.0


def anomaly(processes: list[TimedProcess], device: str, inputs_repeat: bool = True) -> tuple[str, str] | None:
    """(status, message) for the first thing the parent saw that the samples alone would hide, or None; no cache check unless inputs_repeat."""
    for process in processes:
        for b in process.blocks:
            if b.child_s > b.parent_s + CLOCK_SLACK_S:
                return (
                    "clock_tampered",
                    f"the child's clock read {b.child_s * 1e3:.2f} ms for a {b.side} block the parent timed at {b.parent_s * 1e3:.2f} ms: its clock runs ahead",
                )
    candidate = [b for p in processes for b in p.blocks if b.side == "candidate"]
    parent_s, child_s = sum(b.parent_s for b in candidate), sum(b.child_s for b in candidate)
    on_cpu_s = sum(min(b.parent_s, b.cpu_s) for b in candidate) if device == "cpu" else parent_s
    if child_s < CLOCK_AGREEMENT * on_cpu_s - CLOCK_SLACK_S * len(candidate):
        return "clock_tampered", (
            f"the child's clock saw {child_s * 1e3:.1f} ms of the candidate's calls, the parent's {parent_s * 1e3:.1f} ms, "
            f"of which the child was on a CPU {on_cpu_s * 1e3:.1f} ms ({child_s / on_cpu_s:.0%} of that): something in the graded process "
            "changed its clock; the parent's figures decided"
        )
    if device != "cpu":
        return None
    model_cores = _model_cores(processes)
    cores = MODEL_MARGIN * model_cores if model_cores > EXTRA_CORES else EXTRA_CORES  # only where the model itself is past the line
    for b in candidate:
        if b.cpu_s > cores * b.parent_s + CLOCK_SLACK_S:
            allowed = (
                f"the model solution's own blocks used at most {model_cores:.2f} cores"
                if model_cores > EXTRA_CORES
                else "CPU timing is single-threaded"
            )
            return "work_beside_the_clock", (
                f"a candidate block used {b.cpu_s * 1e3:.1f} ms of CPU in {b.parent_s * 1e3:.1f} ms ({b.cpu_s / b.parent_s:.2f} cores), "
                f"while {allowed} (a thread or a process of the submission ran beside the timed call)"
            )
    outside = sum(p.outside_cpu_s for p in processes)
    model_deferred_s = MODEL_MARGIN * _model_outside_per_call(processes) * sum(b.calls for b in candidate)
    if outside > OUTSIDE_FLOOR_S + OUTSIDE_SHARE * parent_s + model_deferred_s:
        beside = f", and the model solution's own deferred work allows {model_deferred_s * 1e3:.0f} ms" if model_deferred_s else ""
        return "work_beside_the_clock", (
            f"the graded process used {outside * 1e3:.0f} ms of CPU while the clock was stopped, against {parent_s * 1e3:.0f} ms "
            f"of timed candidate calls{beside}: work deferred past the end of a call (a thread, a signal handler, a process) escapes the clock"
        )
    gains = [g for g in (_repeat_gain(p) for p in processes) if g is not None]
    if inputs_repeat and len(gains) >= 2 and min(gains) > REPEAT_GAIN:  # a cache shows in every process; noise, in one
        return "faster_on_repeated_inputs", (
            f"in every timing process its first timed call on new inputs took at least {min(gains):.1f}x as long as its later calls on the same inputs, "
            "relative to the model solution's: it answers repeated inputs from a cache (keyed on identity or content), not by computing"
        )
    return baseline_anomaly(processes, device)


def baseline_anomaly(processes: list[TimedProcess], device: str) -> tuple[str, str] | None:
    """Grading only (the baseline in children of its own, beside a pristine copy): the model solution reached from outside."""
    disturbed = next((p.disturbed for p in processes if p.disturbed), None)
    if not disturbed and (not processes or not all(p.samples.others.get("pristine") for p in processes)):
        return None
    if disturbed:
        return (
            "baseline_disturbed",
            f"{disturbed}: another process of the user changed it (the submission's is the only one running code nobody reviewed)",
        )
    if device == "cpu":
        candidate, baseline = _cpu_share(processes, "candidate"), _cpu_share(processes, "baseline")
        if baseline < STARVED_SHARE * candidate:
            return "baseline_disturbed", (
                f"the model solution's child was on a CPU for {baseline:.0%} of its blocks' time, the submission's for {candidate:.0%}: "
                "it was kept off the CPU (stopped, or crowded out) while it was timed"
            )
    slower = _baseline_vs_pristine(processes)
    if slower["ratio_low"] > BASELINE_SLOWER:
        return "baseline_slowed", (
            f"the model solution took {slower['ratio']:.2f}x [{slower['ratio_low']:.2f}, {slower['ratio_high']:.2f}] the time of a pristine copy of itself "
            "timed in turn with it: something reached the baseline, so the ratio is not trusted"
        )
    return None


def _model_cores(processes: list[TimedProcess]) -> float:
    """The most cores a timed block of the model solution kept busy (a DataLoader's workers), where it has children of its own (grading)."""
    shares = [b.cpu_s / b.parent_s for p in processes for b in p.blocks if b.side in ("baseline", "pristine") and b.parent_s > 0]
    return max(shares, default=0.0) if processes and all(p.samples.others.get("pristine") for p in processes) else 0.0


def _model_outside_per_call(processes: list[TimedProcess]) -> float:
    """The model solution's CPU while its child should idle (a DataLoader's prefetch) per call; 0 where it is not past the line itself."""
    blocks = [b for p in processes for b in p.blocks if b.side == "baseline"]
    outside, calls = sum(p.model_outside_cpu_s for p in processes), sum(b.calls for b in blocks)
    return outside / calls if calls and outside > OUTSIDE_FLOOR_S + OUTSIDE_SHARE * sum(b.parent_s for b in blocks) else 0.0


def _repeat_gain(process: TimedProcess) -> float | None:
    """(candidate's first timed block / the median of its later ones) / (the same for the baseline)."""
    sides = {side: [b.parent_s / b.calls for b in process.blocks if b.side == side] for side in ("candidate", "baseline")}
    if any(len(times) < 3 for times in sides.values()):
        return None
    ratio = {side: times[0] / sorted(times[1:])[len(times[1:]) // 2] for side, times in sides.items()}
    return ratio["candidate"] / ratio["baseline"]


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
