"""Confine a child that runs submitted code, and leave nothing of it behind.

In the child, before the submitted file is imported (`confine_child`):
    writes     Landlock (Linux >= 5.13, no privileges needed) lets the process and everything it starts
               write only beneath its scratch directory, the grade's kernel folder (`Limits.kernels`,
               where what it compiles is cached) and /dev: not the project, not the installed
               packages, not the record directory. An audit hook refuses and logs Python-level writes
               elsewhere as well, so a refused write is named in the record, and still refuses them
               where Landlock is missing (then code that writes through ctypes is not stopped, and the
               grader's byte-for-byte check of the sources after grading is what catches it).
    limits     rlimits: data memory, CPU seconds, open files, file size, processes (for a user other
               than root; root ignores that rlimit, so the parent counts processes itself), no core files.

In the parent: harness/process/tree.py's `Reaper` kills whatever the child left behind.
"""

from __future__ import annotations

import ctypes
import multiprocessing.process
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass, field

from harness.compiled import PRIVATE_KERNELS
from harness.process.tree import descendants_of, process_name

PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # same on x86-64 and arm64
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
# Landlock's write rights: remove, make (char, dir, reg, sock, fifo, block, sym), write, then refer (ABI 2) and truncate (ABI 3).
# Reads and device ioctls (CUDA drives the GPU by ioctl) are not handled, so they stay allowed.
WRITE_FILE, REMOVE_AND_MAKE, REFER, TRUNCATE = 1 << 1, sum(1 << bit for bit in range(4, 13)), 1 << 13, 1 << 14
# ABI 6 scopes signals: a confined process may signal only processes of its own Landlock domain (itself, its children),
# never the harness, its fork server or the model solution's children, which are outside it.
SCOPE_SIGNAL, SIGNALS_SCOPED_FROM_ABI = 1 << 1, 6
WRITABLE_BESIDE_SCRATCH = ("/dev",)  # /dev/null, /dev/shm, and the GPU's device files, opened read-write
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 16 << 30  # RLIMIT_DATA: heap and private mappings, per process
    cpu_s: int = 900  # RLIMIT_CPU, per process: SIGXCPU past it
    open_files: int = 4096
    file_bytes: int = 4 << 30
    processes: int = 256  # processes a grade may have at once (rlimit for a user other than root; counted by the parent for root)
    kernels: str | None = (
        None  # the grade's kernel cache for the submission's compiled code, shared by its confined children alone (writable beside scratch)
    )
    gpu: bool = False  # open the CUDA device (driver and primary context) before the confinement, as a sandbox opens its devices


@dataclass
class Confinement:
    """What the child could be held to, as it reports it (plain data)."""

    writes: str  # "landlock ABI <n>; signals scoped" or "audit hook only (<why Landlock is missing>)"
    limits: dict = field(default_factory=dict)


def confine_child(scratch: str, limits: Limits, refused_log: str) -> Confinement:
    """Hold this process (and whatever it starts) to writing beneath `scratch`, within `limits`."""
    scratch = os.path.realpath(scratch)
    if limits.gpu:
        _open_the_gpu()
    os.environ["TMPDIR"] = scratch
    tempfile.tempdir = scratch
    kernels = os.path.realpath(limits.kernels) if limits.kernels else tempfile.mkdtemp(prefix="inductor-", dir=scratch)
    os.environ[PRIVATE_KERNELS], os.environ["TORCHINDUCTOR_CACHE_DIR"] = (
        "1",
        kernels,
    )  # what it compiles, and the ranks it starts, stay in the grade
    sys.dont_write_bytecode = True  # a .pyc beside the submitted file would be a refused write
    # multiprocessing keeps the folder for its sockets (a DataLoader worker hands a tensor's storage over through the
    # resource sharer's) from the first time it made one, in the fork server: beneath /tmp, unwritable now. Forget it,
    # so the next is made beneath TMPDIR, the scratch directory.
    multiprocessing.process.current_process()._config.pop("tempdir", None)
    writable = (scratch, kernels)
    sys.addaudithook(_write_guard(writable, refused_log))
    writes = _landlock(writable)
    return Confinement(writes, _set_limits(limits))


def _open_the_gpu() -> None:
    """CUDA's first call maps the driver's and the context's memory and opens its device files; under the data
    rlimit and Landlock it fails as `cudaGetDeviceCount()` raising "Unexpected error" (an H200, torch 2.11, 2026-11-27),
    so every graded fix failed on CUDA. Opened here, the submission's own calls find the context made."""
    import torch

    if torch.cuda.is_available():
        torch.empty(1, device="cuda")


def _set_limits(limits: Limits) -> dict:
    wanted = {
        "RLIMIT_DATA": limits.memory_bytes,
        "RLIMIT_CPU": limits.cpu_s,
        "RLIMIT_NOFILE": limits.open_files,
        "RLIMIT_FSIZE": limits.file_bytes,
        "RLIMIT_CORE": 0,
    }
    if os.geteuid() != 0:
        wanted["RLIMIT_NPROC"] = _processes_of_this_user() + limits.processes
    applied = {}
    for name, value in wanted.items():
        kind = getattr(resource, name)
        _, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        try:
            resource.setrlimit(kind, (value, value))
            applied[name] = value
        except (ValueError, OSError):
            pass
    return applied


def _processes_of_this_user() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                count += 1
        except OSError:
            pass
    return count


# Which arguments of each audited call name a path it writes, and which one is that path's dir_fd.
AUDITED_WRITES = {
    "os.remove": [(0, 1)],
    "os.rmdir": [(0, 1)],
    "os.mkdir": [(0, 2)],
    "os.rename": [(0, 2), (1, 3)],
    "os.truncate": [(0, None)],
    "os.symlink": [(1, 2)],
    "os.link": [(1, 3)],
    "os.chmod": [(0, 2)],
    "os.chown": [(0, 3)],
    "shutil.rmtree": [(0, 1)],
}


def _write_guard(writable: tuple[str, ...], refused_log: str):
    scratch = writable[0]
    confined_root = os.getpid()  # the confined child: it and every process it starts are the submission's own
    allowed = (*(root + os.sep for root in writable), *(root + os.sep for root in WRITABLE_BESIDE_SCRATCH))
    log_fd = os.open(refused_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def full_path(path, dir_fd) -> str | None:
        if isinstance(path, int) or path is None:
            return None  # an already open file descriptor
        path = os.fsdecode(path)
        if not os.path.isabs(path) and isinstance(dir_fd, int):
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return os.path.realpath(path)

    def guard(event: str, args: tuple) -> None:
        if event in ("os.kill", "os.killpg"):
            target = _outside_own_processes(confined_root, event, *args[:2])
            if target is not None:
                os.write(log_fd, f"kill {target}\n".encode(errors="replace"))
                raise PermissionError(f"grading: sending {target} is refused (a submission may signal only itself and its own children)")
            return
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & WRITE_FLAGS)
            targets = [full_path(path, None)] if writing else []
        elif event in AUDITED_WRITES:
            targets = [
                full_path(args[at], args[fd] if fd is not None and fd < len(args) else None)
                for at, fd in AUDITED_WRITES[event]
                if at < len(args)
            ]
        else:
            return
        for target in targets:
            if target is not None and not (target + os.sep).startswith(allowed):
                os.write(log_fd, f"{event} {target}\n".encode(errors="replace"))
                raise PermissionError(f"grading: writing {target} is refused (a submission may write only beneath {scratch})")

    return guard


def audit_parity() -> None:
    """The write guard's cost without its refusals, for the model solution's timing children in a grade: under the
    guard every audited event (each `id()`, each `copy.deepcopy`) costs the submission a Python call through the same
    tests, and must cost the model solution the same, or a correct submission is timed slower than the model by the
    hook alone (inplace_modified's `fixed`, graded against itself: 1.16-1.17x, rejected against its 1.15x budget)."""

    def guard(event: str, args: tuple) -> None:
        if event in ("os.kill", "os.killpg") or event == "open" or event in AUDITED_WRITES:
            return

    sys.addaudithook(guard)


def _outside_own_processes(confined_root: int, event: str, target: int, signal_number: int) -> str | None:
    """How a signal to a process (group) outside the submission's own reads ("SIGKILL to pid 12 (python)"), or None
    for its own: the confined child and everything it started (a worker may signal the rank that started it), and the
    child's process group. Landlock (ABI 6) draws the same line below Python: the confined child's domain."""
    own_group = os.getpgrp()
    if event == "os.killpg" or target < 0:
        group = abs(target) if target else own_group
        return None if group == own_group else f"{_signal_name(signal_number)} to process group {group}"
    if target in (0, os.getpid(), confined_root) or target in descendants_of(confined_root):
        return None
    return f"{_signal_name(signal_number)} to pid {target} ({process_name(target)})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def refused_writes(refused_log: str) -> list[str]:
    """What the child's guard refused, read by the parent from the child's scratch directory: each write outside its
    scratch directory ("open <path>") and each signal to a process outside its own ("kill SIGKILL to pid ...")."""
    try:
        with open(refused_log, encoding="utf-8", errors="replace") as log:
            return list(dict.fromkeys(line.strip() for line in log if line.strip()))[:20]
    except OSError:
        return []


def _landlock(writable: tuple[str, ...]) -> str:
    if not sys.platform.startswith("linux"):
        return f"audit hook only (Landlock is Linux's; this is {sys.platform})"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return f"audit hook only (Landlock unavailable: {os.strerror(ctypes.get_errno())})"
    handled = WRITE_FILE | REMOVE_AND_MAKE | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)
    signals_scoped = abi >= SIGNALS_SCOPED_FROM_ABI
    attr = _RulesetAttr(handled, 0, SCOPE_SIGNAL if signals_scoped else 0)
    size = ctypes.sizeof(attr) if signals_scoped else ctypes.sizeof(ctypes.c_uint64)  # an older kernel knows the first field alone
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"audit hook only (Landlock refused a ruleset: {os.strerror(ctypes.get_errno())})"
    try:
        for root in (*writable, *WRITABLE_BESIDE_SCRATCH):
            _allow_beneath(libc, ruleset, root, handled)
        if (
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0
        ):
            return f"audit hook only (Landlock could not restrict this process: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return f"landlock ABI {abi}" + ("; signals scoped" if signals_scoped else "; signals not scoped (Landlock ABI < 6)")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _allow_beneath(libc, ruleset: int, root: str, access: int) -> None:
    fd = os.open(root, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(access, fd)
        if (
            libc.syscall(
                SYS_LANDLOCK_ADD_RULE,
                ctypes.c_int(ruleset),
                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {root}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
