import ctypes
import gc
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from harness.process.isolate import run_isolated


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _add(a, b):
    return a + b


def _raise_index_error():
    [][1]


def _segfault():
    ctypes.string_at(0)


def _sleep_forever():
    time.sleep(600)


def _print_both():
    print("to stdout")
    print("to stderr", file=sys.stderr)
    os.write(1, b"raw fd write\n")
    return "done"


def _exit_without_result():
    os._exit(3)


def _unpicklable():
    return lambda: None


def _parallel_work():
    x = torch.randn(1000, 1000)
    return float((x @ x).sum() + torch.randn(4_000_000).sum())


def _leave_grandchild(pid_path, then_hang):
    process = subprocess.Popen(["sleep", "600"])
    with open(pid_path, "w") as pid_file:
        pid_file.write(str(process.pid))
    if then_hang:
        time.sleep(600)


def test_returns_the_value():
    result = run_isolated(_add, 2, b=3, timeout_s=30)
    assert (result.status, result.value) == ("returned", 5)


def test_an_exception_is_described_with_its_bases():
    result = run_isolated(_raise_index_error, timeout_s=30)
    assert result.status == "raised"
    assert result.failure.types[:2] == ("IndexError", "LookupError")
    assert result.failure.message == "list index out of range"
    assert "_raise_index_error" in result.failure.where
    assert result.failure.headline == "IndexError: list index out of range"


def test_a_native_crash_is_named_and_its_python_stack_kept():
    result = run_isolated(_segfault, timeout_s=30)
    assert result.status == "signalled"
    assert result.signal == "SIGSEGV"
    assert "Segmentation fault" in result.output
    assert "_segfault" in result.output  # faulthandler's stack of the crashing thread


def test_a_hung_child_is_killed_at_the_deadline():
    started = time.perf_counter()
    result = run_isolated(_sleep_forever, timeout_s=0.5)
    assert result.status == "timeout"
    assert time.perf_counter() - started < 10


def test_stdout_and_stderr_are_captured():
    result = run_isolated(_print_both, timeout_s=30)
    assert result.value == "done"
    for text in ("to stdout", "to stderr", "raw fd write"):
        assert text in result.output


def test_a_child_leaving_without_a_result_is_reported():
    result = run_isolated(_exit_without_result, timeout_s=30)
    assert (result.status, result.exit_code) == ("exited", 3)


def test_an_unpicklable_result_becomes_a_failure():
    result = run_isolated(_unpicklable, timeout_s=30)
    assert result.status == "raised"
    assert "pickle" in result.failure.message.lower()


@pytest.mark.parametrize("then_hang", [False, True], ids=["child returns", "child times out"])
def test_grandchildren_do_not_outlive_the_child(tmp_path, then_hang):
    pid_path = tmp_path / "grandchild.pid"
    result = run_isolated(_leave_grandchild, str(pid_path), then_hang, timeout_s=2)
    assert result.status == ("timeout" if then_hang else "returned")
    grandchild = int(pid_path.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_a_caller_that_used_torch_threads_does_not_hang_its_children():
    # A child forked straight from a process whose OpenMP pool has run hangs in its first parallel op;
    # children come from the fork server, which never computes.
    _parallel_work()
    result = run_isolated(_parallel_work, timeout_s=60)
    assert result.status == "returned", result.summary


def _fork_server_state():
    return gc.get_freeze_count(), [name for name in ("torch._dynamo", "mmseg.models.losses.cross_entropy_loss") if name in sys.modules]


def test_children_start_with_each_cases_preload_done_and_the_preloaded_objects_frozen():
    # conftest's probe started the fork server with harness.cases.fork_server_modules()
    result = run_isolated(_fork_server_state, timeout_s=60)
    frozen, preloaded = result.value
    assert frozen > 100_000  # torch alone: a child's full collection never scans these
    assert preloaded == ["torch._dynamo", "mmseg.models.losses.cross_entropy_loss"]  # multigpu_segfault's, class_weight_index's


def test_a_fork_server_killed_and_reaped_behind_multiprocessings_back_is_replaced():
    # A child may kill the fork server, and the harness (a subreaper) may reap it before multiprocessing looks:
    # its next start then fails inside multiprocessing (ChildProcessError, or EOF on a socket still held open).
    run_isolated(os.getpid, timeout_s=60)
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGKILL)
    os.waitpid(server, 0)
    result = run_isolated(os.getppid, timeout_s=60)
    assert result.status == "returned" and result.value not in (server, os.getpid()), result.summary


def _signal_the_parent_then_return(signal_number):
    os.kill(os.getppid(), signal_number)
    time.sleep(0.5)  # the server dies, or stops, while this child still runs; then it returns as if all went well
    return "fine"


@pytest.mark.parametrize(
    ("signal_number", "lost"),
    [
        (signal.SIGKILL, "killed"),
        # a new fork server each time (7 s a signal): the README's run keeps SIGKILL, the untimed run the other two
        pytest.param(signal.SIGTERM, "killed", marks=[pytest.mark.slow, pytest.mark.untimed]),
        pytest.param(signal.SIGSTOP, "stopped", marks=[pytest.mark.slow, pytest.mark.untimed]),
    ],
)
def test_a_child_that_kills_or_stops_its_fork_server_gets_the_same_result_every_time(signal_number, lost):
    for _ in range(2):
        started = time.monotonic()
        result = run_isolated(_signal_the_parent_then_return, signal_number, timeout_s=60)
        assert (result.status, result.lost_server) == ("exited", lost), result.summary
        assert result.summary == f"{lost} its parent process, the harness's fork server" and not result.left_behind
        assert time.monotonic() - started < 30  # a stopped server is killed, never waited for until the deadline
        assert run_isolated(_add, 1, 2, timeout_s=60).value == 3  # the next child gets a new server


def _cuda_check_of_the_child():
    return os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"), torch.cuda._is_in_bad_fork()


def test_children_ask_nvml_whether_cuda_is_there_so_an_import_that_asks_cannot_poison_the_fork_server():
    """mmengine asks torch.cuda.is_available() at import, in the fork server: through the CUDA runtime that marked
    every child forked after it ("Cannot re-initialize CUDA in forked subprocess", seen on an H100)."""
    result = run_isolated(_cuda_check_of_the_child, timeout_s=60)
    assert result.value == ("1", False), result.summary


def test_a_scratch_folder_whose_harness_was_killed_is_removed_by_the_next_one(monkeypatch, tmp_path):
    """A harness killed by SIGKILL (or the OOM killer) cannot remove its child's scratch folder; the next harness process
    removes the folders whose maker's pid no longer runs, and no other."""
    import tempfile

    from harness.process import isolate

    dead = subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(isolate, "_SWEPT_BY", None)
    orphaned, running, other = (
        tmp_path / f"harness-child-{dead.pid}-x1",
        tmp_path / f"harness-child-{os.getpid()}-x2",
        tmp_path / "harness-child-x3",
    )
    for folder in (orphaned, running, other):
        (folder / "work").mkdir(parents=True)
    assert run_isolated(_add, 1, 2, timeout_s=60).value == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, other.name])  # its own scratch removed too
