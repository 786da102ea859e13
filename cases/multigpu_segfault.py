"""Ranks that disagree under torch elastic: one rank dies of a native signal, the launcher takes every rank down.

Upstream: https://github.com/open-mmlab/Amphion/issues/167 (FastSpeech2 trained with `accelerate
    launch`, i.e. torch elastic, on GPUs "1,2,3": every rank died of SIGSEGV; one GPU worked).
    Closed without a root cause or a fix. Related, for the restart bad fix: restarted ranks reading
    the dead attempt's addresses from a shared store, https://github.com/pytorch/pytorch/issues/135712

Fidelity: synthetic, and it can be nothing else: upstream never found why the ranks died. Real:
    torch elastic's agent (`elastic_launch` with the c10d rendezvous of `torchrun --standalone`, its
    monitor loop, its SIGTERM teardown, its ChildFailedError report), DDP over gloo (NCCL on CUDA
    with a GPU per rank, gloo with CUDA tensors on one GPU), FastSpeech2's variance predictor (conv1d,
    ReLU, LayerNorm, twice, then linear; dropout left out so DDP can equal one process) at toy width,
    and the native deaths: gloo's own size check aborting a rank, a real read of address 0.
    Synthetic: how the odd rank (`fault_rank`) comes to differ, chosen by `fault` in the yaml:
        env_precision  its environment asks for float64 (DDP_CASE_PRECISION)   the default
        model_dtype    its model code casts to float64 (a stale checkout on one node)
        model_shape    its model is 8 filter channels wider
        torch_version  it reports another torch version (only the reported string differs)
        segfault       it reads address 0 at step `fault_step`, between forward and backward
        none           every rank agrees
    Ranks are forked by the agent, not exec'd as torchrun does (an interpreter and a torch import per
    rank cost seconds on two cores); each rank's stderr goes to its own file and is echoed after a
    failure, prefixed `[rankN]:` as torchrun's console shows it.

Symptom on CUDA: the upstream report, on every rank:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        exitcode  : -11 (pid: ...)
        traceback : Signal 11 (SIGSEGV) received by PID ...
    Seen on one GPU, an H200 (torch 2.11.0+cu130, CUDA 13.0, driver 580.159): the ranks use gloo over CUDA tensors and fail as
    on the CPU (`[rank0]: Fatal Python error: Aborted`, rank 0 died of SIGABRT). NCCL refuses two ranks on one GPU
    before any collective (`case.backend=nccl`: `ncclInvalidUsage ... Duplicate GPU detected : rank 0 and rank 1
    both on CUDA device 60`), so what a dtype mismatch does under NCCL (no size checks: corruption, a hang the 5 s
    timeout ends, or a fault) still needs a GPU per rank. The CUDA symptom asks what the CPU one asks.

Symptom on CPU: with the default fault, the rank that dies is not the odd one. DDP's start-up
    broadcast of rank 0's float32 weights into rank 1's float64 ones passes silently (gloo checks
    only that the receiver's buffer is large enough; rank 1's weights are now garbage). In the first
    gradient all-reduce rank 1 sends 8-byte elements into rank 0's 4-byte buffer; gloo's check throws
    in rank 0's transport thread and rank 0 aborts, its main thread in `loss.backward()`:
        terminate called after throwing an instance of 'gloo::EnforceNotMet'
          what():  [enforce fail at .../gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 888 vs 444. Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?
        Fatal Python error: Aborted
    Rank 1 then raises `RuntimeError: ... Read error ...: Connection reset by peer`, and the launcher:
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
          exitcode  : -6 (pid: ...)  (SIGABRT)
          traceback : Signal 6 (SIGABRT) received by PID ...
    `segfault` gives the upstream signal (`Fatal Python error: Segmentation fault` in the odd rank's
    log), but which rank the launcher's table blames is a race: the peer, reset at once, exits with
    code 1 and is often found first. Hence the symptom: the launcher's report plus a native fault in
    some rank's log; the record says which rank died of what, and whom the launcher blamed.
    `model_shape` fails in Python (DDP's own shape check, exit code 1): wrong_failure.
    `torch_version` trains without error: not_reproduced.

Cause: unknown upstream. Here: ranks that disagree on what they exchange. A collective trusts every
    rank to bring the same bytes; a rank that brings more kills its peer natively, far from the line
    that made it differ, and the launcher can only say which process died of which signal, and the
    process it names is the victim.

Fix: (1) a setting every rank must share (the precision) comes from the launch, never from a rank's
    own environment; (2) a pre-flight before the first collective: each rank gathers every rank's
    fingerprint (torch, CUDA and driver versions, device name and capability, parameter names,
    shapes and dtypes) with `all_gather_object`, which exchanges sizes first and so survives any
    disagreement, and raises PreflightMismatch naming the odd rank, the field and both values.
    Under env_precision (1) makes the ranks agree and the job ends on the single-process result;
    (2) alone (bad fix `check_only`) names rank 1 and `param dtypes`, and trains nothing. Under
    model_dtype, model_shape and torch_version the fixed job refuses, by design, and the fix phase
    records the refusal: no launcher can train ranks that run different code. Under segfault the
    pre-flight passes and the rank still dies: no check prevents a native fault in rank-local code.
    What holds in every mode is the report and the teardown: the dead rank, its signal and its
    faulthandler stack; every rank reaped a fraction of a second after the fault (the launcher's
    SIGTERM, never a collective timeout); no process left behind; every port released.
    Wrong ones: one rank, upstream's own workaround (#167: "it's fine when use only one gpu!"),
    trains one rank, not the N the job asked for; and three generic attempts, not from the cited
    threads: a longer process-group timeout (the rank dies natively, no timeout is involved),
    torchrun's restarts (`--max-restarts 2`: the same ranks disagree again, on every attempt), and
    the pre-flight alone (`check_only`, above).
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import os
import platform
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cases._ddp_worker import launch
from harness import compiled as compile_axis
from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

FAULTS = ("env_precision", "model_dtype", "model_shape", "torch_version", "segfault", "none")
PRECISION_ENV = "DDP_CASE_PRECISION"  # where buggy ranks read their precision from
WIDER_BY = 8  # model_shape: extra filter channels on the odd rank
LAUNCHER_REPORT = r"exitcode\s*:\s*-?\d+ \(pid: \d+\)"  # torch elastic's failure table
NATIVE_DEATH = r"Fatal Python error: (Segmentation fault|Aborted)"  # faulthandler, in the dying rank's log

symptoms = {
    "cpu": Symptom("ChildFailedError", LAUNCHER_REPORT, output=NATIVE_DEATH),
    "cuda": Symptom("ChildFailedError", LAUNCHER_REPORT, output=NATIVE_DEATH),
}

compiled_unit = "each rank's DDP model, `torch.compile(DistributedDataParallel(model))`, in the ranks; the launcher and the pre-flight's object collectives are orchestration dynamo does not trace, so the pre-flight (the timed fix) runs eager"
compiles_itself = True  # the harness cannot compile a launch: the ranks compile their model from cfg.compile (Job.compile)

# A rank killed by a native signal under a launcher; a hang's watchdog abort and a DataLoader worker's death are not.
triage_signs = TriageSigns(
    family="a rank killed by a native signal (SIGSEGV, SIGABRT)",
    cause="a native crash in one rank of a multi-GPU job",
    confirm="the rank's own log holding `Segmentation fault` or a C++ backtrace; faulthandler names the frame",
    also="a crash in a C extension loaded by one rank, a driver fault",
    signs=(
        Sign(
            "failure",
            r"(?i)\b(?:SIGSEGV|segmentation fault|segfault)\b[^\n]{0,80}\b(?:multi[- ]?gpus?|multiple gpus|\d+ gpus|distributed|ddp|ranks?)\b|\b(?:multi[- ]?gpus?|multiple gpus|\d+ gpus|distributed|ddp)\b[^\n]{0,80}\b(?:SIGSEGV|segmentation fault|segfault)\b",
            0.55,
            "a report in words: a segmentation fault in multi-GPU (distributed) training",
            family=True,
        ),
        Sign(
            "failure",
            r"Signal (?:11|6|7|4|8) \(SIG(?:SEGV|ABRT|BUS|ILL|FPE)\) received by PID",
            0.7,
            "the elastic launcher's table: a rank died of a native signal",
        ),
        Sign(
            "failure",
            r"exitcode *: *-(?:11|6|7|4|8)\b",
            0.6,
            "a rank's exit code is a native signal (-11 SIGSEGV, -6 SIGABRT, -7 SIGBUS, -4 SIGILL, -8 SIGFPE)",
        ),
        Sign(
            "failure",
            r"terminated with signal SIG(?:SEGV|ABRT|BUS|ILL|FPE)|died with <Signals\.SIG(?:SEGV|ABRT|BUS|ILL|FPE)",
            0.5,
            "a spawned rank died of a native signal",
        ),
        Sign(
            "failure",
            r"terminate called after throwing an instance of 'gloo::\w+'",
            0.55,
            "a rank aborted (SIGABRT) by gloo's uncaught C++ exception (EnforceNotMet: this case's own abort on CPU)",
            family=True,
        ),
        Sign(
            "context",
            r"op\.preamble\.length <= op\.nbytes",
            0.4,
            "gloo's size check between two ranks failed: one sent more bytes than the other expected, so the ranks disagree on a tensor's size",
        ),
        Sign(
            "context",
            r"ChildFailedError|torch\.distributed\.elastic|torchrun|accelerate launch|distributed/launch\.py|distributed/run\.py",
            0.3,
            "a multi-process launcher (torch elastic, torchrun, accelerate)",
        ),
        Sign(
            "context",
            r"Sending process \d+ closing signal SIGTERM|Received \d+ death signal, shutting down workers",
            0.2,
            "the launcher tearing down the other ranks after one failed (why it failed is in the exit code, if the log reaches it)",
        ),
        Sign(
            "support",
            r"Fatal Python error: (?:Segmentation fault|Aborted|Bus error)|Segmentation fault \(core dumped\)",
            0.3,
            "a native fault in a process's own log",
        ),
        Sign(
            "veto",
            r"Watchdog caught collective operation timeout|NCCL watchdog|ran for \d+ milliseconds before timing out|Some NCCL operations have failed or timed out",
            0,
            "an NCCL timeout: the rank hung and the watchdog aborted it",
        ),
        Sign("veto", r"DataLoader worker \(pid|encountered in worker\.", 0, "the signal killed a DataLoader worker, not a rank"),
        Sign("veto", r"CUDA out of memory|OutOfMemoryError", 0, "the job ran out of memory"),
    ),
)


def preload():
    """DDP's constructor imports torch._dynamo (1.2 s here): once in the fork server, not in every rank."""
    import torch._dynamo  # noqa: F401


class PreflightMismatch(RuntimeError):
    """Ranks disagree on something a collective depends on; raised before the first collective."""


class VariancePredictor(nn.Module):
    """FastSpeech2's duration/pitch/energy predictor: (conv1d, ReLU, LayerNorm) x 2, then linear; no dropout."""

    def __init__(self, channels, filter_size, kernel):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, filter_size, kernel, padding=kernel // 2)
        self.norm1 = nn.LayerNorm(filter_size)
        self.conv2 = nn.Conv1d(filter_size, filter_size, kernel, padding=kernel // 2)
        self.norm2 = nn.LayerNorm(filter_size)
        self.linear = nn.Linear(filter_size, 1)

    def forward(self, x):  # (B, T, C)
        x = self.norm1(F.relu(self.conv1(x.transpose(1, 2))).transpose(1, 2))  # (B, T, F)
        x = self.norm2(F.relu(self.conv2(x.transpose(1, 2))).transpose(1, 2))
        return self.linear(x).squeeze(-1)  # (B, T)


class Job(NamedTuple):
    ranks: int
    device: str  # "cpu" or "cuda"; every tensor here stays on the CPU until a rank moves it
    precision: str  # the launch's setting, e.g. "float32"
    steps: int
    lr: float
    sizes: tuple  # (channels, filter_size, kernel)
    features: torch.Tensor  # (B, T, C): the full batch, split evenly over the ranks
    targets: torch.Tensor  # (B, T)
    init: dict  # initial parameters, the same on every rank
    fault: str
    fault_rank: int
    fault_step: int
    pg_timeout_s: float  # process-group timeout
    max_restarts: int  # torch elastic restarts of the whole group
    deadline_s: float  # the launch is killed past this
    compile: str = "off"  # torch.compile's backend for each rank's DDP model (compile=...), or off
    backend: str = "auto"  # the process group's: gloo, nccl, or auto (nccl where every rank has a GPU of its own, else gloo)


def make_inputs(cfg, device):
    sizes = cfg.sizes
    if cfg.fault not in FAULTS:
        raise ValueError(f"fault={cfg.fault}: choose one of {', '.join(FAULTS)}")
    if cfg.get("backend", "auto") not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend={cfg.backend}: choose auto, gloo or nccl")
    if sizes.batch % sizes.ranks or not 0 <= cfg.fault_rank < sizes.ranks or not 0 <= cfg.fault_step < sizes.steps:
        got = f"{dict(sizes)}, fault_rank={cfg.fault_rank}, fault_step={cfg.fault_step}"
        raise ValueError(f"need batch % ranks == 0, 0 <= fault_rank < ranks, 0 <= fault_step < steps; got {got}")
    compiled = compile_axis.mode_of(cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        init = {name: p.detach().clone() for name, p in VariancePredictor(sizes.channels, sizes.filter, sizes.kernel).named_parameters()}
    return Job(
        ranks=sizes.ranks,
        device=device,
        precision=cfg.precision,
        steps=sizes.steps,
        lr=cfg.lr,
        sizes=(sizes.channels, sizes.filter, sizes.kernel),
        features=torch.randn(sizes.batch, sizes.frames, sizes.channels, generator=generator),
        targets=torch.randn(sizes.batch, sizes.frames, generator=generator),
        init=init,
        fault=cfg.fault,
        fault_rank=cfg.fault_rank,
        fault_step=cfg.fault_step,
        pg_timeout_s=float(cfg.pg_timeout_s if compiled == "off" else cfg.compiled_pg_timeout_s),
        max_restarts=0,
        deadline_s=float(cfg.deadline_s if compiled == "off" else cfg.compiled_deadline_s),
        compile=compiled,
        backend=cfg.get("backend", "auto"),
    )


# -- in each rank --------------------------------------------------------------------------


def buggy_rank(job):
    rank, device = start_rank(job)
    precision = os.environ.get(PRECISION_ENV, job.precision)  # each rank reads its own environment
    model = build_model(job, rank, getattr(torch, precision), device)
    return train(job, rank, model, device)


def fixed_rank(job):
    rank, device = start_rank(job)
    model = build_model(job, rank, getattr(torch, job.precision), device)  # the launch's precision, on every rank
    preflight(model, device)  # the first collective: any disagreement is named here, before DDP's
    return train(job, rank, model, device)


def check_only_rank(job):
    rank, device = start_rank(job)
    precision = os.environ.get(PRECISION_ENV, job.precision)
    model = build_model(job, rank, getattr(torch, precision), device)
    preflight(model, device)
    return train(job, rank, model, device)


def start_rank(job):
    """Join the process group with a short timeout; give the odd rank this run's difference."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if rank == job.fault_rank and job.fault == "env_precision":
        os.environ[PRECISION_ENV] = "float64"
    if rank == job.fault_rank and job.fault == "torch_version":
        major, minor = torch.__version__.split(".")[:2]
        torch.__version__ = f"{major}.{max(int(minor) - 1, 0)}.0"
    device = torch.device("cpu")
    backend = "gloo"
    if job.device == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl" if torch.cuda.device_count() >= job.ranks else "gloo"  # one GPU: gloo with CUDA tensors
    if job.backend != "auto":
        backend = job.backend  # nccl with two ranks on one GPU: what NCCL does then is a result to record
    dist.init_process_group(backend, timeout=timedelta(seconds=job.pg_timeout_s))
    return rank, device


def build_model(job, rank, dtype, device):
    channels, filter_size, kernel = job.sizes
    odd = rank == job.fault_rank
    if job.fault == "model_shape" and odd:
        model = VariancePredictor(channels, filter_size + WIDER_BY, kernel)
    else:
        model = VariancePredictor(channels, filter_size, kernel)
        model.load_state_dict(job.init)
    model = model.to(device=device, dtype=dtype)
    if job.fault == "model_dtype" and odd:
        model = model.double()
    return model


def train(job, rank, model, device):
    ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=job.lr)
    ddp = compile_axis.under(job.compile, ddp)  # a user compiles the DDP model; dynamo splits its graph at DDP's buckets
    dtype = next(model.parameters()).dtype
    per_rank = len(job.features) // job.ranks
    features = job.features[rank * per_rank : (rank + 1) * per_rank].to(device, dtype)  # (B / N, T, C)
    targets = job.targets[rank * per_rank : (rank + 1) * per_rank].to(device, dtype)
    for step in range(job.steps):
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(features), targets)
        if job.fault == "segfault" and rank == job.fault_rank and step == job.fault_step:
            native_fault()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
    # No destroy_process_group() here: with DDP still alive, its reducer would hold the group's last
    # reference and destroy it later with the GIL held while a gloo thread waits for the GIL (a deadlock
    # seen with torch 2.13). The rank's process ends with os._exit, so nothing is left to clean up.
    return {name: p.detach().cpu().numpy() for name, p in model.named_parameters()}


def native_fault():
    """A real SIGSEGV: read address 0 from native code (synthetic: upstream's fault site is unknown)."""
    ctypes.string_at(0)


# -- the pre-flight ------------------------------------------------------------------------


def preflight(model, device):
    """Gather every rank's fingerprint; raise PreflightMismatch on every rank if they differ, else return them."""
    mine = fingerprint(model, device)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)  # sizes first, then padded bytes: safe whatever the ranks hold
    problems = disagreements(every)
    if problems:
        raise PreflightMismatch("; ".join(problems))
    return every


def fingerprint(model, device):
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": _nvidia_driver() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else platform.machine(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(device))) if cuda else torch.backends.cpu.get_cpu_capability(),
        "param shapes": tuple((name, tuple(p.shape)) for name, p in model.named_parameters()),
        "param dtypes": tuple((name, str(p.dtype).removeprefix("torch.")) for name, p in model.named_parameters()),
    }


def disagreements(every):
    """For each field the ranks differ on: which rank is odd (the minority; a tie goes to rank 0's side)."""
    problems = []
    for field in every[0]:
        values = [fp[field] for fp in every]
        counts = Counter(map(repr, values))
        usual = max(values, key=lambda value: (counts[repr(value)], -values.index(value)))
        agreeing = [rank for rank, value in enumerate(values) if value == usual]
        for rank, value in enumerate(values):
            if value != usual:
                where = f"rank {agreeing[0]} has" if len(agreeing) == 1 else f"ranks {', '.join(map(str, agreeing))} have"
                problems.append(f"rank {rank} differs on {field}: {_difference(value, usual)} where {where} {_difference(usual, value)}")
    return problems


def _difference(value, other):
    """For parameter lists, only the first entry that differs; otherwise the value itself."""
    if isinstance(value, tuple) and isinstance(other, tuple) and value and isinstance(value[0], tuple):
        if len(value) != len(other):
            return f"{len(value)} parameters"
        return next(f"{name} {detail}" for (name, detail), theirs in zip(value, other) if (name, detail) != theirs)
    return repr(value)


def _nvidia_driver():
    """The kernel driver's version, from /proc (no subprocess, no NVML)."""
    try:
        return Path("/proc/driver/nvidia/version").read_text().split("Kernel Module")[1].split()[0]
    except (OSError, IndexError):
        return None


# -- the three sides -----------------------------------------------------------------------


def buggy(job):
    return every_rank(launch(buggy_rank, job, nprocs=job.ranks, max_restarts=job.max_restarts, deadline_s=job.deadline_s))


def fixed(job):
    refused = (PreflightMismatch,)  # raised again here, by name, when the ranks refuse
    return every_rank(launch(fixed_rank, job, nprocs=job.ranks, max_restarts=job.max_restarts, deadline_s=job.deadline_s, refusals=refused))


def reference(job):
    """One process, the full batch, the launch's precision: every one of the N ranks must end with these."""
    channels, filter_size, kernel = job.sizes
    dtype = getattr(torch, job.precision)
    model = VariancePredictor(channels, filter_size, kernel)
    model.load_state_dict(job.init)
    model = model.to(device=job.device, dtype=dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=job.lr)
    features, targets = job.features.to(job.device, dtype), job.targets.to(job.device, dtype)
    for _ in range(job.steps):
        optimizer.zero_grad()
        F.mse_loss(model(features), targets).backward()
        optimizer.step()
    return {name: p.detach().cpu().expand(job.ranks, *p.shape) for name, p in model.named_parameters()}


def every_rank(results):
    """{name: (N, *shape)}: each parameter as every rank ended with it, by rank."""
    names = results[0].keys()
    return {name: torch.stack([torch.from_numpy(results[rank][name]) for rank in sorted(results)]) for name in names}


# -- bad fixes -----------------------------------------------------------------------------


def longer_timeout(job):
    """ "Raise the timeout" (InitProcessGroupKwargs(timeout=...); a generic attempt, not from the cited threads): the
    rank dies natively, no timeout is involved."""
    return buggy(job._replace(pg_timeout_s=1800.0))


def restart_ranks(job):
    """torchrun --max-restarts 2 (a generic attempt, not from the cited threads): the same ranks disagree again,
    three times.

    (With the rendezvous store shared between attempts, torch's default, the restarted ranks failed
    otherwise here: they could not connect to each other, cf. pytorch#135712. The launcher gives each
    attempt its own store, so that every attempt meets the disagreement itself.)
    """
    return buggy(job._replace(max_restarts=2))


def single_rank(job):
    """Upstream's workaround, one GPU (https://github.com/open-mmlab/Amphion/issues/167: "it's fine when use only one
    gpu!"): it trains, but one rank, not the N the job asked for."""
    return buggy(job._replace(ranks=1, fault_rank=-1))


def check_only(job):
    """The pre-flight without one source for the precision (half of the fix, a generic attempt): it names rank 1 and
    the field, and trains nothing."""
    return every_rank(launch(check_only_rank, job, nprocs=job.ranks, deadline_s=job.deadline_s, refusals=(PreflightMismatch,)))


bad_fixes = {"longer_timeout": longer_timeout, "restart_ranks": restart_ranks, "single_rank": single_rank, "check_only": check_only}


# -- speed ---------------------------------------------------------------------------------
# The harness times functions called in one process, so both run on a 1-rank gloo group there: the
# pre-flight's all_gather_object and DDP's all-reduce go through gloo, but no bytes cross a socket.

_speed_state = {}


def speed_candidate(job):
    """The pre-flight: fingerprint, all_gather_object, compare. It runs once per launch."""
    model, _, _, _ = _one_rank(job)
    return fingerprint_codes(preflight(model, torch.device(job.device)))


def speed_reference(job):
    """What the pre-flight of a 1-rank group must gather: this rank's fingerprint, computed directly."""
    model, _, _, _ = _one_rank(job)
    return fingerprint_codes([fingerprint(model, torch.device(job.device))])


def fingerprint_codes(every):
    """The gathered fingerprints as one tensor (the harness compares tensors): a stable hash per rank."""
    return torch.tensor([int.from_bytes(hashlib.sha256(repr(sorted(fp.items())).encode()).digest()[:7], "big") for fp in every])


def speed_baseline(job):
    """One DDP training step of the same model on the same group."""
    _, ddp, optimizer, (features, targets) = _one_rank(job)
    optimizer.zero_grad()
    F.mse_loss(ddp(features), targets).backward()
    optimizer.step()


def _one_rank(job):
    if id(job) not in _speed_state:
        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        channels, filter_size, kernel = job.sizes
        dtype = getattr(torch, job.precision)
        model = VariancePredictor(channels, filter_size, kernel)
        model.load_state_dict(job.init)
        model = model.to(device=job.device, dtype=dtype)
        ddp = DistributedDataParallel(model)
        data = (job.features.to(job.device, dtype), job.targets.to(job.device, dtype))
        _speed_state[id(job)] = (model, compile_axis.under(job.compile, ddp), torch.optim.SGD(ddp.parameters(), lr=job.lr), data)
    return _speed_state[id(job)]


# -- slow fixes: a pre-flight that is right, but costs more than the budget allows ---------


def preflight_with_trial_step(job):
    """Run one throw-away training step on a copy of the model first, "to see that every rank can train", then gather."""
    model, _, _, (features, targets) = _one_rank(job)
    trial = DistributedDataParallel(copy.deepcopy(model))
    F.mse_loss(trial(features), targets).backward()
    return fingerprint_codes(preflight(model, torch.device(job.device)))


slow_fixes = {"preflight_with_trial_step": preflight_with_trial_step}
