"""Run one function in an isolated child process, bounded in time, and report how it ended.

A device-side assert poisons the CUDA context of the whole process, a native
fault kills it, a collective can hang it: so every phase that may do one of
those runs here.

Children are forked from a fork server: a clean process started once, which
imports torch and the cases (fork_server.py's `preload`) but never computes and never touches
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
to the result file: the parent unpickles only plain data (harness/process/outcome.py's `PLAIN_GLOBALS`: no class but
`Failure`, so no `__reduce__` runs code in the parent). Tensors travel as `torch.save` bytes.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, Callable

from harness.process.confine import Limits, confine_child, refused_writes
from harness.process.fork_server import (
    CONTEXT,
    LOST_EXIT_CODE,
    LOST_SERVER_SETTLE_S,
    children_now,
    descendants_now,
    forget_fork_server,
    fork_server_pid,
    helpers,
    process_state,
    server_lost,
    start_child,
)
from harness.process.outcome import ChildResult, Failure, NotPlainData, PlainUnpickler
from harness.process.tree import Reaper, descendants_of

OUTPUT_TAIL_CHARS = 20_000

SCRATCH_PREFIX = "harness-child-"  # then the pid of the process that made the folder, which removes it


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
    _sweep_orphaned_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        paths, work = _scratch(scratch)
        ours, theirs = CONTEXT.Pipe() if talk is not None else (None, None)
        if theirs is not None:
            kwargs = {**kwargs, "connection": theirs}
        keep = (
            set(children_now()) | set(descendants_now()) | helpers()
        )  # a sibling child re-parented here if the server dies is not this child's
        since = _ticks_since_boot()
        child = CONTEXT.Process(target=_child_main, args=(function, args, kwargs, paths, work, confined), daemon=False)
        started = time.perf_counter()
        start_child(child)
        fork_server = fork_server_pid()  # (re)started by start() if it had died
        deadline = time.monotonic() + timeout_s
        talked = _talk(talk, ours, theirs, child.pid, deadline)
        timed_out, broke, lost = _wait(child, max(0.0, deadline - time.monotonic()), confined, fork_server)
        seconds = time.perf_counter() - started
        left_behind = [line for line in reaper.sweep(child.pid, keep | helpers(), since) if not line.startswith(f"pid {child.pid} ")]
        output = _read_tail(paths["output"])
        extras = {
            "talk": talked,
            "left_behind": left_behind,
            "refused_writes": refused_writes(paths["refused"]),
            "confinement": _read_text(paths["confinement"]),
        }
        if broke:  # what was killed for breaking the limit is not "left behind"
            return ChildResult("limit", seconds, output=output, limit=broke, **{**extras, "left_behind": []})
        lost = lost or server_lost(fork_server, settle_s=LOST_SERVER_SETTLE_S if child.exitcode == LOST_EXIT_CODE else 0.0)
        if lost:  # the child's exit status was lost with the server: whatever it wrote, it crashed the harness's server
            if fork_server == fork_server_pid():
                forget_fork_server()
            return ChildResult("exited", seconds, exit_code=None, output=output, lost_server=lost, **extras)
        if timed_out:
            return ChildResult("timeout", seconds, output=output, **extras)
        if child.exitcode < 0:
            return ChildResult("signalled", seconds, signal=_signal_name(-child.exitcode), output=output, **extras)
        return _reported(paths["result"], child.exitcode, seconds, output, extras)


def _scratch(scratch: str) -> tuple[dict[str, str], str]:
    """The files a child writes for the parent, and the folder it works in (the only one a confined child may write)."""
    os.chmod(scratch, 0o700)
    paths = {
        "result": os.path.join(scratch, "result.pickle"),
        "output": os.path.join(scratch, "output.txt"),
        "refused": os.path.join(scratch, "refused.txt"),
        "confinement": os.path.join(scratch, "confinement.txt"),
    }
    work = os.path.join(scratch, "work")
    os.mkdir(work)
    return paths, work


def _talk(talk, ours, theirs, pid: int, deadline: float) -> Any:
    if theirs is None:
        return None
    theirs.close()
    try:
        return talk(ours, pid, deadline)
    except (EOFError, OSError, TimeoutError):
        return None
    finally:
        ours.close()


def _reported(result_path: str, exit_code: int, seconds: float, output: str, extras: dict[str, Any]) -> ChildResult:
    """What a child that ended by itself wrote to its result file: a value, a failure, or nothing readable."""
    try:
        with open(result_path, "rb") as result_file:
            kind, payload = PlainUnpickler(result_file).load()
    except NotPlainData as error:
        return ChildResult("raised", seconds, failure=Failure.from_exception(error), output=output, **extras)
    except (OSError, EOFError, pickle.UnpicklingError):
        return ChildResult("exited", seconds, exit_code=exit_code, output=output, **extras)
    if kind == "returned":
        return ChildResult("returned", seconds, value=payload, output=output, **extras)
    return ChildResult("raised", seconds, failure=payload, output=output, **extras)


_SWEPT_BY: int | None = None


def _sweep_orphaned_scratch() -> None:
    """Once per process: remove the children's scratch folders of harness processes that died without removing them
    (SIGKILL, the OOM killer, a cut SLURM job): the folders of this user whose maker's pid no longer runs."""
    global _SWEPT_BY
    if _SWEPT_BY == os.getpid():
        return
    _SWEPT_BY = os.getpid()
    folder = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(folder) if name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return
    for name in names:
        maker = name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        path = os.path.join(folder, name)
        if maker.isdigit() and process_state(int(maker)) in (None, "Z") and _ours(path):  # gone, or a zombie
            shutil.rmtree(path, ignore_errors=True)


def _ours(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


_REAPER: Reaper | None = None


def _reaper() -> Reaper:
    """This process becomes a child subreaper once, on its first child (a process forked from it starts anew)."""
    global _REAPER
    if _REAPER is None or _REAPER.pid != os.getpid():
        _REAPER = Reaper()
    return _REAPER


def _ticks_since_boot() -> int:
    """Now, on the clock of /proc/<pid>/stat's start times (less a tick, as they are rounded)."""
    try:
        with open("/proc/uptime") as uptime:
            return int(float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK")) - 1
    except (OSError, ValueError):
        return 1 << 62  # no /proc: adopt nothing


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as text:
            return text.read().strip() or None
    except OSError:
        return None


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
            if child.exitcode is None and process_state(fork_server) in ("T", "t"):
                lost = server_lost(fork_server)  # kills it: the sentinel then reads EOF
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
            if fork_server and process_state(fork_server) in ("T", "t"):
                lost = lost or server_lost(fork_server)
        child.join()
    return timed_out, broke, lost


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the group outlives its reaped leader while members remain
    except (ProcessLookupError, PermissionError):
        pass


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
