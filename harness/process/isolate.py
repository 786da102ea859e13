"""Run one function in an isolated child process, bounded in time, and report how it ended.

A device-side assert poisons the CUDA context of the whole process, a native
fault kills it, a collective can hang it: so every phase that may do one of
those runs here.

Children are forked from a fork server: a clean process started once, which
imports torch and the cases (`preload`) but never computes and never touches
CUDA. Forking from it is cheap (no interpreter start, no re-import) and safe:
the child initialises CUDA itself, and it inherits no OpenMP thread pool (a
child forked from a process that has used one hangs in its first parallel op).
So the caller may have done anything, CUDA and parallel CPU work included.
The function and its arguments travel to the child by pickle: pass module-level
functions and plain data.

The child gets its own process group (so grandchildren die with it), writes
stdout and stderr to a file (CUDA prints device assertions there, faulthandler
prints the Python stack of a native crash there) and sends its result back as a
pickle. Whatever happens to the child, the caller gets a `ChildResult`.

The child may run code nobody reviewed (a fix submitted for grading), which could write any pickle
to the result file: the parent unpickles only plain data (`PLAIN_GLOBALS`: no class but `Failure`,
so no `__reduce__` runs code in the parent). Tensors travel as `torch.save` bytes.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from harness.process.confine import Limits, Reaper, children_of, confine_child, descendants_of, refused_writes

OUTPUT_TAIL_CHARS = 20_000
PLAIN_GLOBALS = {
    ("harness.process.isolate", "Failure"),
    ("builtins", "complex"),
    ("torch.torch_version", "TorchVersion"),
}  # TorchVersion: a str  # besides None, bool, int, float, complex, str, bytes, tuple, list, dict, set


@dataclass(frozen=True)
class Failure:
    """An exception raised in the child, described in plain data so it survives pickling."""

    types: tuple[str, ...]  # the exception's class then its bases, e.g. ("AcceleratorError", "RuntimeError", ...)
    message: str
    where: str  # innermost frame: "file.py:123 in function"
    traceback: str
    figures: dict[str, Any] = field(default_factory=dict)  # an exception's own `figures` dict, if it carries one
    modules: tuple[str, ...] = ()  # the module of each of `types`: tells the compiler's own errors apart (harness/compiled.py)

    @classmethod
    def from_exception(cls, error: BaseException) -> Failure:
        frames = traceback.extract_tb(error.__traceback__)
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
        return cls(
            types=tuple(t.__name__ for t in type(error).__mro__ if t is not object),
            message=str(error),
            where=where,
            traceback="".join(traceback.format_exception(error)),
            figures=_plain(getattr(error, "figures", None)),
            modules=tuple(t.__module__ for t in type(error).__mro__ if t is not object),
        )

    @property
    def headline(self) -> str:
        """The class and the first line of the message that says something (not a blank or a row of '=')."""
        first_line = next((line.strip() for line in self.message.splitlines() if any(c.isalnum() for c in line)), "")
        return f"{self.types[0]}: {first_line}"


@dataclass
class ChildResult:
    status: Literal["returned", "raised", "signalled", "exited", "timeout", "limit"]
    seconds: float
    value: Any = None
    failure: Failure | None = None
    signal: str | None = None  # e.g. "SIGSEGV" when status == "signalled"
    exit_code: int | None = None  # when status == "exited" (the child left without a result)
    output: str = field(default="", repr=False)  # tail of the child's stdout and stderr
    talk: Any = None  # what the parent's side of a conversation with the child returned (`run_isolated(talk=...)`)
    left_behind: list[str] = field(default_factory=list)  # processes the child left running, killed after it
    refused_writes: list[str] = field(
        default_factory=list
    )  # what a confined child was refused: writes outside its scratch directory, signals to processes not its own
    confinement: str | None = None  # how a confined child was held ("landlock ABI 7; limits ..."), as it reported
    limit: str | None = None  # the limit a confined child broke, when status == "limit"
    lost_server: str | None = None  # "killed" or "stopped": what the child did to its parent, the fork server

    @property
    def summary(self) -> str:
        if self.status == "returned":
            return "returned"
        if self.status == "raised":
            return f"raised {self.failure.headline}"
        if self.status == "signalled":
            return f"killed by {self.signal}"
        if self.status == "timeout":
            return f"timed out after {self.seconds:.1f} s"
        if self.status == "limit":
            return f"killed: {self.limit}"
        if self.lost_server:
            return f"{self.lost_server} its parent process, the harness's fork server"
        return f"exited with code {self.exit_code} without a result"


# The fork server imports upstream packages that ask torch.cuda.is_available() at import (mmengine does). Asked of
# the CUDA runtime, that marks the server so every child forked from it fails at its first CUDA call ("Cannot
# re-initialize CUDA in forked subprocess"); asked of NVML (torch's own switch), it leaves the server fork-safe.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
_FORK_SERVER = multiprocessing.get_context("forkserver")
_DEFAULT_PRELOAD = ["__main__", "torch"]  # __main__: children resolve functions defined there without re-running it
_FORK_SERVER.set_forkserver_preload(_DEFAULT_PRELOAD)


_preloaded = list(_DEFAULT_PRELOAD)


def preload(modules: list[str]) -> None:
    """Modules the fork server imports once, before its first child (no effect once it runs), added to those asked
    for before: a server started again (a child killed the last one) imports all of them."""
    _preloaded[:] = dict.fromkeys([*_preloaded, *modules])
    _FORK_SERVER.set_forkserver_preload(list(_preloaded))


def start_fork_server(modules: list[str]) -> None:
    """Start the fork server now, preloading `modules`: it imports them while this process goes on with
    its own imports (on two cores, seconds saved before the first child). If this process ends first
    (a usage error, --help), the server is killed rather than left importing."""
    preload(modules)
    multiprocessing.forkserver.ensure_running()
    _SERVERS.add(_fork_server_pid())
    atexit.register(_kill_fork_server)


def _start(child: multiprocessing.process.BaseProcess) -> None:
    """Start `child`; if the fork server died in a way multiprocessing did not notice (killed by a child while its
    socket was still held open, or reaped by the subreaper first: the request reads EOF), start a new server once."""
    try:
        child.start()
    except (EOFError, ConnectionError, ChildProcessError):
        _forget_fork_server()
        child.start()
    _SERVERS.add(_fork_server_pid())


_SERVERS: set[int] = set()  # every fork server this process started: never a child's leftover, even once dead
LOST_EXIT_CODE = 255  # what multiprocessing says of a child whose server closed the socket without its exit status
LOST_SERVER_SETTLE_S = 3.0  # a server killed closes its sockets one by one as it dies: how long to let it finish


def _server_lost(pid: int, settle_s: float = 0.0) -> str | None:
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
    state = _state(pid)
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


def _forget_fork_server() -> None:
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


def run_isolated(
    function: Callable[..., Any],
    *args: Any,
    timeout_s: float,
    confined: Limits | None = None,
    talk: Callable[[Any, int, float], Any] | None = None,
    **kwargs: Any,
) -> ChildResult:
    """Call `function(*args, **kwargs)` in a child forked from the fork server; never raises for what the child does.

    confined: the child runs submitted code: it is held to writing beneath its scratch directory and to
        these limits (harness/process/confine.py) before `function` runs, and the parent counts its processes.
    talk: the parent's side of a conversation: `talk(connection, child_pid, deadline)` runs here while the
        child runs, the child's end of the pipe is passed to `function` as the keyword `connection`;
        what `talk` returns is `ChildResult.talk`. A child that stops answering is killed at the deadline.
    """
    _use_a_stdlib_start_method()
    reaper = _reaper()
    with tempfile.TemporaryDirectory(prefix="harness-child-") as scratch:
        os.chmod(scratch, 0o700)
        result_path = os.path.join(scratch, "result.pickle")
        output_path = os.path.join(scratch, "output.txt")
        paths = {
            "result": result_path,
            "output": output_path,
            "refused": os.path.join(scratch, "refused.txt"),
            "confinement": os.path.join(scratch, "confinement.txt"),
        }
        work = os.path.join(scratch, "work")
        os.mkdir(work)
        ours, theirs = _FORK_SERVER.Pipe() if talk is not None else (None, None)
        if theirs is not None:
            kwargs = {**kwargs, "connection": theirs}
        keep = (
            set(_children_now()) | set(_descendants_now()) | _helpers()
        )  # a sibling child re-parented here if the server dies is not this child's
        since = _ticks_since_boot()
        child = _FORK_SERVER.Process(target=_child_main, args=(function, args, kwargs, paths, work, confined), daemon=False)
        started = time.perf_counter()
        _start(child)
        fork_server = _fork_server_pid()  # (re)started by start() if it had died
        deadline = time.monotonic() + timeout_s
        talked = None
        if theirs is not None:
            theirs.close()
            try:
                talked = talk(ours, child.pid, deadline)
            except (EOFError, OSError, TimeoutError):
                talked = None
            finally:
                ours.close()
        timed_out, broke, lost = _wait(child, max(0.0, deadline - time.monotonic()), confined, fork_server)
        seconds = time.perf_counter() - started
        left_behind = [line for line in reaper.sweep(child.pid, keep | _helpers(), since) if not line.startswith(f"pid {child.pid} ")]
        output = _read_tail(output_path)
        extras = {
            "talk": talked,
            "left_behind": left_behind,
            "refused_writes": refused_writes(paths["refused"]),
            "confinement": _read_text(paths["confinement"]),
        }
        if broke:  # what was killed for breaking the limit is not "left behind"
            return ChildResult("limit", seconds, output=output, limit=broke, **{**extras, "left_behind": []})
        lost = lost or _server_lost(fork_server, settle_s=LOST_SERVER_SETTLE_S if child.exitcode == LOST_EXIT_CODE else 0.0)
        if lost:  # the child's exit status was lost with the server: whatever it wrote, it crashed the harness's server
            if fork_server == _fork_server_pid():
                _forget_fork_server()
            return ChildResult("exited", seconds, exit_code=None, output=output, lost_server=lost, **extras)
        if timed_out:
            return ChildResult("timeout", seconds, output=output, **extras)
        if child.exitcode < 0:
            return ChildResult("signalled", seconds, signal=_signal_name(-child.exitcode), output=output, **extras)
        try:
            with open(result_path, "rb") as result_file:
                kind, payload = _PlainUnpickler(result_file).load()
        except NotPlainData as error:
            return ChildResult("raised", seconds, failure=Failure.from_exception(error), output=output, **extras)
        except (OSError, EOFError, pickle.UnpicklingError):
            return ChildResult("exited", seconds, exit_code=child.exitcode, output=output, **extras)
        if kind == "returned":
            return ChildResult("returned", seconds, value=payload, output=output, **extras)
        return ChildResult("raised", seconds, failure=payload, output=output, **extras)


_REAPER: Reaper | None = None


def _reaper() -> Reaper:
    """This process becomes a child subreaper once, on its first child (a process forked from it starts anew)."""
    global _REAPER
    if _REAPER is None or _REAPER.pid != os.getpid():
        _REAPER = Reaper()
    return _REAPER


def _fork_server_pid() -> int:
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None) or 0


def _ticks_since_boot() -> int:
    """Now, on the clock of /proc/<pid>/stat's start times (less a tick, as they are rounded)."""
    try:
        with open("/proc/uptime") as uptime:
            return int(float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK")) - 1
    except (OSError, ValueError):
        return 1 << 62  # no /proc: adopt nothing


def _helpers() -> set[int]:
    """multiprocessing's own children of this process (started on the first child): never swept."""
    from multiprocessing import resource_tracker

    return {_fork_server_pid(), *_SERVERS, getattr(resource_tracker._resource_tracker, "_pid", None) or 0}


def _children_now() -> list[int]:
    return children_of(os.getpid())


def _descendants_now() -> list[int]:
    return descendants_of(os.getpid())


def _state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, D, T, Z...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as text:
            return text.read().strip() or None
    except OSError:
        return None


class NotPlainData(pickle.UnpicklingError):
    """A child's result named a class or function: refused unread."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in PLAIN_GLOBALS:
            return super().find_class(module, name)
        raise NotPlainData(f"the child's result holds {module}.{name}, not plain data (return plain values; tensors as torch.save bytes)")


def _use_a_stdlib_start_method() -> None:
    """joblib's loky workers make "loky" the default start method; the fork server's children inherit
    that name and, without joblib imported, cannot set it: name the stdlib default instead."""
    if multiprocessing.get_start_method(allow_none=True) not in (None, *multiprocessing.get_all_start_methods()):
        multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)


def _users_start_method() -> None:
    """A child of the fork server inherits "forkserver" as its default start method (multiprocessing's preparation
    data names it); a user's process has the platform's default (fork on Linux before Python 3.14). Case code that
    starts processes with the default (a DataLoader's workers) starts them as a user's process would: forked
    workers share the parent's pages copy-on-write, where forkserver's would each unpickle a copy."""
    multiprocessing.set_start_method(None, force=True)


def _child_main(function, args, kwargs, paths: dict[str, str], work: str, confined: Limits | None) -> None:
    exit_code = 0
    try:
        os.setpgid(0, 0)
        _users_start_method()
        output_fd = os.open(paths["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
        faulthandler.enable(file=2, all_threads=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        result_fd = os.open(paths["result"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # opened before any confinement
        if confined is not None:
            confinement_fd = os.open(paths["confinement"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            held = confine_child(work, confined, paths["refused"])
            with open(confinement_fd, "w") as confinement:
                confinement.write(
                    f"writes: {held.writes}; limits: "
                    + ", ".join(f"{name.removeprefix('RLIMIT_').lower()} {value}" for name, value in held.limits.items())
                )
        try:
            outcome = ("returned", function(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - the child reports everything, the parent decides
            outcome = ("raised", Failure.from_exception(error))
        try:
            payload = pickle.dumps(outcome)
        except Exception as error:  # noqa: BLE001
            payload = pickle.dumps(("raised", Failure.from_exception(error)))
        with open(result_fd, "wb") as result_file:
            result_file.write(payload)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        exit_code = 70
    finally:
        os._exit(exit_code)


def _wait(child, timeout_s: float, confined: Limits | None, fork_server: int = 0) -> tuple[bool, str | None, str | None]:
    """Wait for the child; at the deadline, or past a confined child's process limit, kill its process
    group. (timed out, the limit it broke, what happened to the fork server if it was lost: a stopped
    server is killed at once, as it could never report the child's exit)."""
    broke = lost = None
    try:
        deadline = time.monotonic() + timeout_s
        while child.exitcode is None and time.monotonic() < deadline:
            child.join(min(0.2, max(0.0, deadline - time.monotonic())))
            if child.exitcode is None and confined is not None and len(descendants_of(child.pid)) >= confined.processes:
                broke = f"more than {confined.processes} processes at once"
                break
            if child.exitcode is None and _state(fork_server) in ("T", "t"):
                lost = _server_lost(fork_server)  # kills it: the sentinel then reads EOF
                child.join(5)
                break
        timed_out = child.exitcode is None and broke is None and lost is None
    except BaseException:
        timed_out = True
        raise
    finally:
        _kill_group(child.pid)  # the grandchildren it left behind; at the deadline the child too
        if child.exitcode is None:
            child.kill()  # in case it had not yet made its own group
            if fork_server and _state(fork_server) in ("T", "t"):
                lost = lost or _server_lost(fork_server)
        child.join()
    return timed_out, broke, lost


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the group outlives its reaped leader while members remain
    except (ProcessLookupError, PermissionError):
        pass


def _plain(figures: Any) -> dict[str, Any]:
    """Keep only what pickles and serialises as JSON: an exception may carry anything."""
    if not isinstance(figures, dict):
        return {}
    try:
        return json.loads(json.dumps(figures, default=str))
    except (TypeError, ValueError):
        return {}


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_tail(path: str) -> str:
    try:
        with open(path, "rb") as output_file:
            output_file.seek(0, os.SEEK_END)
            size = output_file.tell()
            output_file.seek(max(0, size - OUTPUT_TAIL_CHARS))
            return output_file.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
