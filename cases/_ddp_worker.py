"""Launch N ranks with torch elastic, as torchrun does, and account for how every one of them ended.

`launch(rank_fn, job, nprocs=N)` runs `rank_fn(job)` on N ranks under torch elastic's own agent
(`elastic_launch`: the rendezvous, the monitor loop, the teardown and the `ChildFailedError` report
are torchrun's code), with the c10d rendezvous of `torchrun --standalone` on a port chosen at run
time. The ranks are forked by the agent (`start_method="fork"`) instead of exec'd as torchrun does,
so a launch costs a fraction of a second rather than a torch import per rank. Two things differ from
torchrun's defaults, both found here with torch 2.13:
- forked ranks inherit the agent's Python handler for SIGTERM, which cannot run while a rank waits in
  C++ (a collective, a store): such a rank sat out the launcher's SIGTERM until its own timeout.
  Each rank restores the default action first, as an exec'd rank has it.
- with the rendezvous store shared with the ranks (torch's default), ranks restarted after a crash
  failed to connect (gloo: Connection refused, or Connect timeout after 25 s), as with the stale keys
  of pytorch#135712. Each attempt gets its own store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).

When the job fails, the launcher's `ChildFailedError` is raised again with `figures`: which rank the
launcher blamed and with which exit code or signal, what became of every rank (read from its own log:
faulthandler names the native signal and prints the Python stack), the seconds from the fault to
every rank reaped, the processes left behind and whether the rendezvous port was released.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

MONITOR_INTERVAL_S = 0.05  # how often the agent polls its ranks (torchrun: 0.1)
LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # the agent installs handlers for these
# faulthandler's header for each fatal signal it handles
NATIVE_FAULTS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
_FATAL = re.compile(r"^Fatal Python error: (" + "|".join(NATIVE_FAULTS) + r")$", re.MULTILINE)
ECHO_LINES = 40  # lines of each failed launch's rank log echoed to stderr


class LeftBehind(RuntimeError):
    """The job returned, but a process or the rendezvous port outlived it."""


def launch(
    rank_fn: Callable[[Any], Any],
    job: Any,
    *,
    nprocs: int,
    max_restarts: int = 0,
    deadline_s: float = 60.0,
    refusals: tuple[type[Exception], ...] = (),
) -> dict[int, Any]:
    """`rank_fn(job)` on `nprocs` ranks; each rank's return value by global rank.

    A rank that raises one of `refusals` has that error raised again here, with its message; any
    other failure raises the launcher's `ChildFailedError` carrying `figures`. Past `deadline_s` every
    rank is killed (SIGKILL), so no launch outlives it, whatever the collectives do.
    """
    import torch._dynamo  # noqa: F401 - DDP's constructor imports it (1.2 s here): once here, before the ranks fork

    port = free_port()
    log_root = tempfile.mkdtemp(prefix="ddp-ranks-")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=f"ddp-{port}",
        rdzv_backend="c10d",  # the agent hosts the rendezvous TCPStore on `port`
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"timeout": 60},
        max_restarts=max_restarts,
        monitor_interval=MONITOR_INTERVAL_S,
        start_method="fork",
        logs_specs=DefaultLogsSpecs(log_dir=log_root, redirects=Std.ALL),
    )
    before = set(descendants(os.getpid()))
    ports_before = own_listening_ports()
    watchdog = threading.Timer(deadline_s, _kill, args=(before,))
    failure: ChildFailedError | None = None
    try:
        with _launcher_side_effects_undone(), _temporary_files_in(log_root):
            watchdog.start()
            try:
                results = elastic_launch(config, _rank_entry(rank_fn))(job)
            except ChildFailedError as error:
                failure = error.with_traceback(None)  # the agent's frames hold the TCPStore, and so the port
            finally:
                watchdog.cancel()
        reaped_at = time.time()  # elastic_launch returns once the agent has joined every rank
        gc.collect()
        left = [pid for pid in descendants(os.getpid()) if pid not in before]
        ports_left = sorted(own_listening_ports() - ports_before)  # the ranks' stores of each attempt, if still open
        released = not listening(port) and not ports_left
        if failure is None:
            if left or not released:
                raise LeftBehind(f"the job returned, but left processes {left}, port {port} open: {listening(port)}, ports {ports_left}")
            return results
        ranks = read_rank_logs(log_root)
        _echo(ranks)
        figures = _figures(failure, ranks, reaped_at, left, port, released, deadline_s)
        figures["ports_left"] = ports_left
        refusal = _refusal(failure, refusals)
        if refusal is not None:
            refusal.figures = figures
            raise refusal
        failure.figures = figures
        failure.args = (f"{_headline(failure.name, figures)}\n{failure}",)  # a headline, then the launcher's own report
        raise failure
    finally:
        shutil.rmtree(log_root, ignore_errors=True)


def _rank_entry(rank_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def entry(job):
        # Forked from the agent, a rank inherits its Python handlers for SIGTERM and friends: they only
        # run once the rank is back in Python, so a rank waiting in C++ would sit out the launcher's
        # SIGTERM. Exec'd ranks (torchrun) start with the default action: restore it.
        for sig in LAUNCHER_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        # The launcher redirected whatever file sys.stdout/sys.stderr use; where a host swapped them
        # (pytest's capture), native writes to fds 1 and 2 (libstdc++'s terminate message) must follow.
        for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
            if stream.fileno() != fd:
                os.dup2(stream.fileno(), fd)
        faulthandler.enable(all_threads=True)  # a native fault prints this rank's Python stack to its log
        torch.set_num_threads(1)  # N ranks share the cores; forked ranks must not reuse the agent's OpenMP pool
        return rank_fn(job)

    entry.__name__ = entry.__qualname__ = rank_fn.__name__  # the launcher names the job after its entrypoint
    return entry


@contextmanager
def _launcher_side_effects_undone():
    """The agent installs signal handlers and sets environment variables in its own process: undo both."""
    handlers = {sig: signal.getsignal(sig) for sig in LAUNCHER_SIGNALS}
    environment = dict(os.environ)
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # LaunchConfig asks whether CUDA is there: ask NVML, keep fork safe
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # a fresh store for each attempt's ranks (see above)
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(environment)


@contextmanager
def _temporary_files_in(folder: str):
    """torch.multiprocessing gives each rank an error file in the temporary folder (`pytorch-errorfile-*.pickle`) and
    leaves it there for every rank that raised: make them in the launch's own folder, which goes with it."""
    before = tempfile.tempdir
    tempfile.tempdir = folder
    try:
        yield
    finally:
        tempfile.tempdir = before


# -- what the ranks left -------------------------------------------------------------------


def read_rank_logs(log_root: str) -> dict[int, dict[str, Any]]:
    """How each rank of the last attempt ended, from its stderr log and its elastic error file."""
    attempts = sorted(Path(log_root).glob("*/attempt_*"), key=lambda path: int(path.name.split("_")[1]))
    if not attempts:
        return {}
    ranks = {}
    for rank_dir in sorted((p for p in attempts[-1].iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)):
        stderr = rank_dir / "stderr.log"
        error_file = rank_dir / "error.json"
        text = stderr.read_text(errors="replace") if stderr.exists() else ""
        fatal = _FATAL.search(text)
        rank: dict[str, Any] = {"log": text, "ended_at": stderr.stat().st_mtime if stderr.exists() else None}
        if fatal:
            rank["outcome"] = NATIVE_FAULTS[fatal.group(1)]
            rank["stack"] = _readable(text[fatal.start() :])
            native = [line.strip() for line in text[: fatal.start()].splitlines() if "what():" in line]
            if native:
                rank["native_error"] = native[-1].removeprefix("what():").strip()
        elif (error := _recorded_error(error_file)) is not None:
            rank["outcome"] = "raised"
            rank["error"] = error
            rank["ended_at"] = error_file.stat().st_mtime
        else:  # no error file, or one the launcher's SIGTERM cut short while the rank wrote it
            rank["outcome"] = "stopped by the launcher"
        ranks[int(rank_dir.name)] = rank
    return ranks


def _recorded_error(error_file: Path) -> str | None:
    """The first line of the error a rank recorded in its elastic error file; None if there is none to read."""
    try:
        message = json.loads(error_file.read_text())["message"]
        lines = (message["message"] if isinstance(message, dict) else str(message)).strip().splitlines()
    except (OSError, ValueError, KeyError, TypeError):  # missing, empty or cut short (seen on torch 2.4.1)
        return None
    return lines[0] if lines else ""


def _readable(log: str) -> str:
    """A rank's log without what fork copied from the agent: stack frames below the rank's entry point."""
    kept, in_agent = [], False
    for line in log.splitlines():
        if line.startswith("Extension modules"):
            continue
        if line.startswith("  File "):
            if in_agent:
                continue
            in_agent = f"{Path(__file__).name}" in line and line.endswith(" in entry")
        else:
            in_agent = False
        kept.append(line)
    return "\n".join(kept).strip()


def _echo(ranks: dict[int, dict[str, Any]]) -> None:
    """Print the ranks' logs as torchrun's console would, prefixed by rank."""
    for rank, info in ranks.items():
        for line in _readable(info["log"]).splitlines()[-ECHO_LINES:]:
            print(f"[rank{rank}]: {line}", file=sys.stderr)
    sys.stderr.flush()


def _figures(failure, ranks, reaped_at, left, port, released, deadline_s) -> dict[str, Any]:
    blamed, first = failure.get_first_failure()
    native = {rank: info for rank, info in ranks.items() if info["outcome"] in NATIVE_FAULTS.values()}
    died = native or {rank: info for rank, info in ranks.items() if info["outcome"] == "raised"} or {blamed: {}}
    fault_at = min((info["ended_at"] for info in died.values() if info.get("ended_at")), default=None)
    figures: dict[str, Any] = {
        "blamed_rank": blamed,  # the launcher's "root cause": the first failure it observed
        "exitcode": first.exitcode,
        "signal": first.signal_name() if first.exitcode < 0 else None,
        "native_fault_ranks": {str(rank): info["outcome"] for rank, info in native.items()},
        "rank_outcomes": {str(rank): _outcome(info, first if rank == blamed else None) for rank, info in ranks.items()},
        "teardown_s": round(reaped_at - fault_at, 3) if fault_at else None,  # last write of the dying rank -> every rank reaped
        "processes_left": len(left),
        "port": port,
        "port_released": released,
        "deadline_hit": first.exitcode == -signal.SIGKILL,
        "deadline_s": deadline_s,
    }
    stacked = next((info for info in native.values() if info.get("stack")), None)
    if stacked:
        figures["stack"] = stacked["stack"]
        if stacked.get("native_error"):
            figures["native_error"] = stacked["native_error"]
    return figures


def _headline(name: str, figures: dict[str, Any]) -> str:
    blamed = f"rank {figures['blamed_rank']} (exitcode {figures['exitcode']})"
    if not figures["native_fault_ranks"]:
        return f"{name} failed: {blamed}"
    rank, sig = next(iter(figures["native_fault_ranks"].items()))
    if int(rank) == figures["blamed_rank"]:
        return f"{name} failed: rank {rank} died of {sig}"
    return f"{name} failed: rank {rank} died of {sig}; the launcher blamed {blamed}"


def _outcome(info: dict[str, Any], failure=None) -> str:
    if info["outcome"] == "stopped by the launcher" and failure is not None:  # the blamed rank left no trace itself
        return f"killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exited with code {failure.exitcode}"
    if info["outcome"] == "raised":
        return "raised " + info["error"][:300]
    if info.get("native_error"):
        return f"{info['outcome']} ({info['native_error'][:300]})"
    return info["outcome"]


def _refusal(failure: ChildFailedError, refusals: tuple[type[Exception], ...]) -> Exception | None:
    """The refusal a rank raised, rebuilt in the caller: every rank that checks raises the same one."""
    for failed in failure.failures.values():
        message = failed.message["message"] if isinstance(failed.message, dict) else str(failed.message)
        for refusal in refusals:
            prefix = refusal.__name__ + ": "
            if message.startswith(prefix):
                return refusal(message.removeprefix(prefix).strip())
    return None


# -- processes and ports -------------------------------------------------------------------


def free_port() -> int:
    """A port nobody listens on now (bind port 0); the launcher's store binds it next."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listening(port: int) -> bool:
    """Whether any socket on this host listens on `port`."""
    return any(listening_port == port for listening_port, _ in _listening_sockets())


def own_listening_ports() -> set[int]:
    """The ports this process listens on (sockets among its open file descriptors)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return {port for port, inode in _listening_sockets() if inode in inodes}


def _listening_sockets() -> list[tuple[int, str]]:
    """(port, socket inode) of every listening TCP socket on this host (Linux: /proc/net/tcp and tcp6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                found.append((int(fields[1].rsplit(":", 1)[1], 16), fields[9]))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), zombies included."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill(spared: set[int]) -> None:
    for pid in descendants(os.getpid()):
        if pid not in spared:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
