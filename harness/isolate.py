"""Run one function in a forked child, bounded in time, and report how it ended.

A device-side assert poisons the CUDA context of the whole process, a native
fault kills it, a collective can hang it: so every phase that may do one of
those runs here. The parent has imported torch but never touched CUDA, which
makes `fork` both cheap (no interpreter start, no re-import) and safe (the
child initialises CUDA itself).

The child gets its own process group (so grandchildren die with it), writes
stdout and stderr to a file (CUDA prints device assertions there, faulthandler
prints the Python stack of a native crash there) and sends its result back as a
pickle. Whatever happens to the child, the parent gets a `ChildResult`.
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

OUTPUT_TAIL_CHARS = 20_000
_POLL_START_S = 0.0005
_POLL_MAX_S = 0.02


@dataclass(frozen=True)
class Failure:
    """An exception raised in the child, described in plain data so it survives pickling."""

    types: tuple[str, ...]  # the exception's class then its bases, e.g. ("AcceleratorError", "RuntimeError", ...)
    message: str
    where: str  # innermost frame: "file.py:123 in function"
    traceback: str
    figures: dict[str, Any] = field(default_factory=dict)  # an exception's own `figures` dict, if it carries one

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
        )

    @property
    def headline(self) -> str:
        first_line = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.types[0]}: {first_line}"


@dataclass
class ChildResult:
    status: Literal["returned", "raised", "signalled", "exited", "timeout"]
    seconds: float
    value: Any = None
    failure: Failure | None = None
    signal: str | None = None  # e.g. "SIGSEGV" when status == "signalled"
    exit_code: int | None = None  # when status == "exited" (the child left without a result)
    output: str = field(default="", repr=False)  # tail of the child's stdout and stderr

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
        return f"exited with code {self.exit_code} without a result"


def run_isolated(function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> ChildResult:
    """Call `function(*args, **kwargs)` in a forked child; never raises for what the child does."""
    with tempfile.TemporaryDirectory(prefix="harness-child-") as scratch:
        result_path = os.path.join(scratch, "result.pickle")
        output_path = os.path.join(scratch, "output.txt")
        sys.stdout.flush()
        sys.stderr.flush()
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child_main(function, args, kwargs, result_path, output_path)
        try:
            os.setpgid(pid, pid)  # also done by the child: whichever runs first wins the race
        except OSError:
            pass
        status = _wait(pid, timeout_s)
        seconds = time.perf_counter() - started
        output = _read_tail(output_path)
        if status is None:
            return ChildResult("timeout", seconds, output=output)
        if os.WIFSIGNALED(status):
            return ChildResult("signalled", seconds, signal=_signal_name(os.WTERMSIG(status)), output=output)
        try:
            with open(result_path, "rb") as result_file:
                kind, payload = pickle.load(result_file)
        except (OSError, EOFError, pickle.UnpicklingError):
            return ChildResult("exited", seconds, exit_code=os.WEXITSTATUS(status), output=output)
        if kind == "returned":
            return ChildResult("returned", seconds, value=payload, output=output)
        return ChildResult("raised", seconds, failure=payload, output=output)


def _child_main(function, args, kwargs, result_path: str, output_path: str) -> None:
    exit_code = 0
    try:
        os.setpgid(0, 0)
        output_fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")  # also under pytest's capture
        sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
        faulthandler.enable(file=2, all_threads=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            outcome = ("returned", function(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - the child reports everything, the parent decides
            outcome = ("raised", Failure.from_exception(error))
        try:
            payload = pickle.dumps(outcome)
        except Exception as error:  # noqa: BLE001
            payload = pickle.dumps(("raised", Failure.from_exception(error)))
        with open(result_path, "wb") as result_file:
            result_file.write(payload)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        exit_code = 70
    finally:
        os._exit(exit_code)


def _wait(pid: int, timeout_s: float) -> int | None:
    """The child's wait status, or None after killing its process group at the deadline."""
    deadline = time.monotonic() + timeout_s
    poll_s = _POLL_START_S
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                _kill_group(pid)  # grandchildren the child left behind
                return status
            if time.monotonic() >= deadline:
                _kill_group(pid, child_unreaped=True)
                os.waitpid(pid, 0)
                return None
            time.sleep(poll_s)
            poll_s = min(poll_s * 2, _POLL_MAX_S)
    except BaseException:
        _kill_group(pid, child_unreaped=True)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        raise


def _kill_group(pid: int, *, child_unreaped: bool = False) -> None:
    kills = (os.killpg, os.kill) if child_unreaped else (os.killpg,)  # never signal a reaped pid: it may be reused
    for kill in kills:
        try:
            kill(pid, signal.SIGKILL)
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
