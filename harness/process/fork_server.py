"""The fork server every isolated child is forked from, started once, and how to tell that a child lost it.

It imports torch and the cases (`preload`) but never computes and never touches CUDA (harness/process/isolate.py
says why). A child may kill or stop it: `server_lost` says so, and the next child starts a new one.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import select
import signal
import time

from harness.process.tree import children_of, descendants_of

# The fork server imports upstream packages that ask torch.cuda.is_available() at import (mmengine does). Asked of
# the CUDA runtime, that marks the server so every child forked from it fails at its first CUDA call ("Cannot
# re-initialize CUDA in forked subprocess"); asked of NVML (torch's own switch), it leaves the server fork-safe.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
CONTEXT = multiprocessing.get_context("forkserver")
_DEFAULT_PRELOAD = ["__main__", "torch"]  # __main__: children resolve functions defined there without re-running it
CONTEXT.set_forkserver_preload(_DEFAULT_PRELOAD)


_preloaded = list(_DEFAULT_PRELOAD)


def preload(modules: list[str]) -> None:
    """Modules the fork server imports once, before its first child (no effect once it runs), added to those asked
    for before: a server started again (a child killed the last one) imports all of them."""
    _preloaded[:] = dict.fromkeys([*_preloaded, *modules])
    CONTEXT.set_forkserver_preload(list(_preloaded))


def start_fork_server(modules: list[str]) -> None:
    """Start the fork server now, preloading `modules`: it imports them while this process goes on with
    its own imports (on two cores, seconds saved before the first child). If this process ends first
    (a usage error, --help), the server is killed rather than left importing."""
    preload(modules)
    multiprocessing.forkserver.ensure_running()
    _SERVERS.add(fork_server_pid())
    atexit.register(_kill_fork_server)


def start_child(child: multiprocessing.process.BaseProcess) -> None:
    """Start `child`; if the fork server died in a way multiprocessing did not notice (killed by a child while its
    socket was still held open, or reaped by the subreaper first: the request reads EOF), start a new server once."""
    try:
        child.start()
    except (EOFError, ConnectionError, ChildProcessError):
        forget_fork_server()
        child.start()
    _SERVERS.add(fork_server_pid())


_SERVERS: set[int] = set()  # every fork server this process started: never a child's leftover, even once dead
LOST_EXIT_CODE = 255  # what multiprocessing says of a child whose server closed the socket without its exit status
LOST_SERVER_SETTLE_S = 3.0  # a server killed closes its sockets one by one as it dies: how long to let it finish


def server_lost(pid: int, settle_s: float = 0.0) -> str | None:
    """How fork server `pid` was lost while a child ran ("killed", "stopped"), or None while it serves. The
    same answer every time: with `settle_s` (the child's exit status was not read: LOST_EXIT_CODE), a server
    seen alive is looked at again until it is a zombie, has closed the pipe from this process (it is dying),
    or `settle_s` has passed. A stopped server is killed here: it could never report a child's exit, and the
    wait for one would hang."""
    deadline = time.monotonic() + settle_s
    while (said := _server_state(pid)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return said


def _server_state(pid: int) -> str | None:
    if not pid:
        return None
    state = process_state(pid)
    if state in (None, "Z", "X"):
        return "killed"
    if state in ("T", "t"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        return "stopped"
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid == pid and server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError, ValueError):
            poller = select.poll()
            poller.register(server._forkserver_alive_fd, select.POLLOUT)
            if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
                return "killed"
    return None


def forget_fork_server() -> None:
    server = multiprocessing.forkserver._forkserver
    with contextlib.suppress(OSError, TypeError):
        os.close(server._forkserver_alive_fd)
    pid = server._forkserver_pid
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    with contextlib.suppress(OSError, TypeError):
        os.unlink(server._forkserver_address)
    server._forkserver_alive_fd = server._forkserver_pid = server._forkserver_address = None


def _kill_fork_server() -> None:
    pid = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)  # None once stopped
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def fork_server_pid() -> int:
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) or 0


def helpers() -> set[int]:
    """multiprocessing's own children of this process (started on the first child): never swept."""
    from multiprocessing import resource_tracker

    return {fork_server_pid(), *_SERVERS, getattr(resource_tracker._resource_tracker, "_pid", None) or 0}


def children_now() -> list[int]:
    return children_of(os.getpid())


def descendants_now() -> list[int]:
    return descendants_of(os.getpid())


def process_state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, D, T, Z...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None
