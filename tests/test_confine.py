"""Confinement of a child that runs submitted code, and the parent's sweep of what it leaves behind."""

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from harness.process.confine import Limits
from harness.process.isolate import run_isolated


def write_to(path):
    with open(path, "w") as target:
        target.write("planted")


def write_with_libc(path):
    """As a C extension would: no Python audit event, only Landlock can refuse it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT, 0o644)
    if fd < 0:
        raise PermissionError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    os.close(fd)


def write_in_scratch():
    path = os.path.join(os.environ["TMPDIR"], "mine.txt")
    write_to(path)
    return open(path).read()


def leave_a_detached_process(command):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp(command[0], command)
        os._exit(0)
    os.wait()
    deadline = time.monotonic() + 10
    while not running(" ".join(command)) and time.monotonic() < deadline:  # returned before its exec, it would be killed mid-exec, nameless
        time.sleep(0.01)


def running(command):
    return [
        line
        for line in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
        if line.strip() == command
    ]


def test_a_confined_child_writes_only_beneath_its_scratch_directory(tmp_path):
    outside = tmp_path / "outside.txt"
    refused = run_isolated(write_to, str(outside), timeout_s=60, confined=Limits())
    assert refused.status == "raised" and "PermissionError" in refused.failure.types, refused.summary
    assert not outside.exists() and refused.refused_writes == [f"open {outside}"]
    allowed = run_isolated(write_in_scratch, timeout_s=60, confined=Limits())
    assert allowed.status == "returned" and allowed.value == "planted" and not allowed.refused_writes


def test_landlock_refuses_a_write_the_audit_hook_cannot_see(tmp_path):
    outside = tmp_path / "outside.txt"
    result = run_isolated(write_with_libc, str(outside), timeout_s=60, confined=Limits())
    if "landlock" not in (result.confinement or ""):
        pytest.skip(f"no Landlock here: {result.confinement}")
    assert result.status == "raised" and not outside.exists(), result.summary


def test_an_unconfined_child_is_not_held(tmp_path):
    result = run_isolated(write_to, str(tmp_path / "fine.txt"), timeout_s=60)
    assert result.status == "returned" and (tmp_path / "fine.txt").exists() and result.confinement is None


def test_the_confinement_and_limits_are_reported():
    result = run_isolated(os.getpid, timeout_s=60, confined=Limits(memory_bytes=8 << 30, open_files=512))
    assert result.confinement.startswith("writes: ") and "data 8589934592" in result.confinement and "nofile 512" in result.confinement


def test_a_detached_double_forked_process_does_not_outlive_its_child():
    command = ["sleep", "6062"]
    result = run_isolated(leave_a_detached_process, command, timeout_s=60, confined=Limits())
    assert result.status == "returned"
    assert any("sleep 6062" in line for line in result.left_behind), result.left_behind
    time.sleep(0.1)
    assert not running("sleep 6062")


def test_too_many_processes_are_killed_by_the_parent():
    result = run_isolated(_fork_many, 80, timeout_s=60, confined=Limits(processes=32))
    assert result.status == "limit" and "more than 32 processes" in result.summary, result.summary
    assert not result.left_behind  # killed for the limit, not left behind


def _fork_many(count):
    for _ in range(count):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    time.sleep(30)


def kernel_folder_then_write(path):
    from harness import compiled as compile_axis

    folder = compile_axis.prepare(private=False)  # what a case's code asks for: the harness's cache
    write_with_libc(os.path.join(folder, "kernel.so"))
    write_with_libc(path)


def kernel_folder():
    from harness import compiled as compile_axis

    return compile_axis.prepare(private=False), os.environ.get("TMPDIR")


def test_a_confined_child_compiles_into_its_grade_s_kernel_folder_and_nowhere_else(tmp_path):
    from harness import compiled as compile_axis

    kernels, outside = tmp_path / "grade-kernels", tmp_path / "harness-cache.so"
    kernels.mkdir()
    result = run_isolated(kernel_folder_then_write, str(outside), timeout_s=60, confined=Limits(kernels=str(kernels)))
    assert (kernels / "kernel.so").exists(), result.summary + result.output  # shared by the grade's confined children
    if "landlock" in (result.confinement or ""):
        assert result.status == "raised" and not outside.exists(), result.summary  # the harness's own cache stays out of reach
    folder, scratch = run_isolated(kernel_folder, timeout_s=60, confined=Limits()).value
    assert folder.startswith(scratch + os.sep)  # no grade folder given: a folder of its own
    assert run_isolated(kernel_folder, timeout_s=60).value[0] == str(
        compile_axis.cache_dir(private=False)
    )  # unconfined: the harness's cache


def signal_own_then_outside():
    """A process the confined child started signals the child (its own: allowed), then the child probes its parent,
    the fork server, with signal 0 (outside its own: refused)."""
    got = []
    signal.signal(signal.SIGUSR1, lambda *_: got.append("usr1"))
    worker = os.fork()
    if worker == 0:
        try:
            os.kill(os.getppid(), signal.SIGUSR1)
            os._exit(0)
        except PermissionError:
            os._exit(1)
    _, status = os.waitpid(worker, 0)
    time.sleep(0.05)
    try:
        os.kill(os.getppid(), 0)
        outside = "sent"
    except PermissionError:
        outside = "refused"
    return os.waitstatus_to_exitcode(status), got, outside


def test_a_confined_child_signals_its_own_processes_and_nothing_else():
    result = run_isolated(signal_own_then_outside, timeout_s=60, confined=Limits())
    assert result.status == "returned" and result.value == (0, ["usr1"], "refused"), (result.summary, result.value)
    assert len(result.refused_writes) == 1 and result.refused_writes[0].startswith("kill signal 0 to pid "), (
        result.refused_writes
    )  # the probe, logged for the integrity check


def test_the_model_solutions_audit_hook_runs_the_guards_tests_and_refuses_nothing(tmp_path):
    """A grade's model solution carries `audit_parity`: a hook through which every audited event passes, as the
    submission's write guard, and which lets a write anywhere and a signal to any process through."""
    script = (
        "import os, signal, subprocess, sys\n"
        "from harness.process.confine import audit_parity\n"
        "seen = []\n"
        "audit_parity()\n"
        "sys.addaudithook(lambda event, args: seen.append(event) if event == 'open' else None)\n"
        f"open({str(tmp_path / 'written')!r}, 'w').write('x')\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "os.kill(child.pid, signal.SIGKILL)\n"
        "child.wait()\n"
        "print(len(seen))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "written").read_text() == "x" and int(done.stdout) >= 1


def _allocate_on_the_gpu():
    import torch

    return float(torch.ones(1 << 20, device="cuda").sum())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none is present")
def test_a_confined_child_reaches_the_gpu_it_was_given():
    """Landlock alone breaks CUDA's first call (`cudaGetDeviceCount()`, error 304, an H200 on 2026-11-27:
    tools/cuda_confine_probe.py); a grade on CUDA opens the device before the confinement."""
    result = run_isolated(_allocate_on_the_gpu, timeout_s=120, confined=Limits(gpu=True))
    assert result.status == "returned" and result.value == float(1 << 20), result


def test_a_gpu_grade_on_a_machine_without_one_confines_as_before(tmp_path):
    outside = tmp_path / "outside.txt"
    refused = run_isolated(write_to, str(outside), timeout_s=60, confined=Limits(gpu=True))
    assert refused.status == "raised" and not outside.exists(), refused
