"""The parent's side of a child: nothing outlives it (`Reaper`), and what /proc says of a process tree.

In the parent (`Reaper`): it becomes a child subreaper, so a process the child detached (setsid, a double
fork) is re-parented to it rather than to init; after each child it kills whatever the child left, in
the child's process group or adopted, and says how many.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


class Reaper:
    """Kills what a child left behind: its process group, and processes it detached, which this process
    adopts as a child subreaper (Linux). `sweep` returns a line per process killed."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.subreaper = False
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            self.subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

    def sweep(self, child_pid: int, keep: set[int], since_ticks: int) -> list[str]:
        killed: list[str] = []
        try:
            os.killpg(child_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for _ in range(50):  # killing a process re-parents its own children here: go on until none is left
            adopted = [pid for pid in children_of(self.pid) if pid not in keep and start_ticks(pid) >= since_ticks]
            if not adopted:
                break
            for pid in adopted:
                for descendant in [pid, *descendants_of(pid)]:
                    line = describe_process(descendant)
                    try:
                        os.kill(descendant, signal.SIGKILL)
                        killed.append(line)
                    except (ProcessLookupError, PermissionError):
                        pass
            for pid in adopted:
                _reap(pid)
            time.sleep(0.01)
        return list(dict.fromkeys(killed))


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
        except OSError:
            pass
    return found


def descendants_of(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for child in children_of(todo.pop()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def start_ticks(pid: int) -> int:
    """When a process started, in clock ticks since boot (/proc/<pid>/stat field 22); 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def describe_process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        session = os.getsid(pid)
    except OSError:
        return f"pid {pid}"
    if not command:  # a zombie, or a process caught inside execve: its name is all there is
        command = f"[{process_name(pid)}]"
    return f"pid {pid} (session {session}): {command[:120]}"


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip() or "?"
    except OSError:
        return "?"


def process_cpu_s(pid: int) -> float | None:
    """The CPU time of a process, all its threads, in seconds (its CPU clock; ns resolution on Linux)."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def reaped_children_cpu_s(pid: int) -> float:
    """CPU seconds of a process's children that have ended and been waited for, theirs included (`cutime` and
    `cstime` of /proc/<pid>/stat, in clock ticks)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its living descendants, and of the descendants that ended and were waited for: a
    DataLoader's workers of one pass live and die inside a timed block, and their work is the block's too. A
    descendant counted living at one reading and reaped by the next moves, whole, into its parent's count."""
    return sum((process_cpu_s(p) or 0.0) + reaped_children_cpu_s(p) for p in [pid, *descendants_of(pid)])


def minor_faults(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rpartition(b")")[2].split()[7])
    except (OSError, IndexError, ValueError):
        return 0
