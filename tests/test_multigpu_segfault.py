"""multigpu_segfault: the report of a rank's native death, the teardown, the pre-flight, DDP against one process.

Each test launches real ranks (forked by torch elastic's agent, gloo on the CPU) from this process,
so the processes it leaves and the ports it holds are checked right here.
"""

import logging
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

import cases.multigpu_segfault as case
from cases._ddp_worker import descendants, launch, listening, own_listening_ports, read_rank_logs
from harness.cases import CASE_CONFIG_DIR, contract_problems

CONFIG = OmegaConf.load(CASE_CONFIG_DIR / "multigpu_segfault.yaml")
TEARDOWN_GOAL_S = 5.0


def job(**overrides):
    sizes = overrides.pop("sizes", {})
    cfg = OmegaConf.merge(CONFIG, {"sizes": sizes, **overrides})
    return case.make_inputs(cfg, "cpu")


@pytest.fixture(autouse=True, scope="module")
def no_log_records():
    """pytest keeps the log records of a test until its teardown; the launcher's `logger.exception`
    record reaches the agent's frames through its traceback, and with them the rendezvous TCPStore,
    whose port would stay open. No records, then (the harness keeps none either)."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture
def no_leftovers(tmp_path, monkeypatch):
    """Whatever the test launched is gone when it ends: no child process, no listening socket of ours, no file in the
    temporary folder (a rank that raised used to leave torch.multiprocessing's `pytorch-errorfile-*.pickle` there).

    Yields the processes that were already there (the harness's fork server, when conftest started it)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    before, ports_before = set(descendants(os.getpid())), own_listening_ports()
    yield before
    assert set(descendants(os.getpid())) <= before
    assert own_listening_ports() <= ports_before
    assert sorted(path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor_")) == []  # bar torch's kernel cache


def failure_of(function, the_job):
    with pytest.raises(ChildFailedError) as caught:
        function(the_job)
    return caught.value


def test_the_process_group_backend_is_a_config_value():
    assert job().backend == "auto"
    assert job(backend="gloo").backend == "gloo"
    with pytest.raises(ValueError, match="backend=mpi: choose auto, gloo or nccl"):
        job(backend="mpi")


def test_the_case_meets_the_contract():
    assert contract_problems(case) == []
    assert (CASE_CONFIG_DIR / "multigpu_segfault.yaml").read_text().startswith("# python -m harness case=multigpu_segfault")


def test_segfault_is_reported_with_rank_signal_and_stack(no_leftovers):
    error = failure_of(case.buggy, job(fault="segfault"))
    figures = error.figures
    assert figures["native_fault_ranks"] == {"1": "SIGSEGV"}
    assert figures["rank_outcomes"]["1"] == "SIGSEGV"
    assert "Fatal Python error: Segmentation fault" in figures["stack"]
    assert "in native_fault" in figures["stack"] and "in train" in figures["stack"]
    assert "rank 1 died of SIGSEGV" in str(error)
    assert figures["blamed_rank"] in (0, 1)  # the launcher's pick is a race: the reset peer exits too
    if figures["blamed_rank"] == 1:
        assert "Signal 11 (SIGSEGV) received by PID" in str(error)


def test_default_fault_aborts_the_peer_not_the_odd_rank(no_leftovers):
    error = failure_of(case.buggy, job())
    figures = error.figures
    # Rank 0 receives rank 1's 8-byte elements into its 4-byte buffer: it is the one that aborts, every time.
    assert figures["native_fault_ranks"] == {"0": "SIGABRT"}
    assert "op.preamble.length <= op.nbytes" in figures["native_error"]
    # Rank 1 either raises on the lost connection or is stopped by the launcher first: a race.
    assert figures["rank_outcomes"]["1"].startswith(("raised RuntimeError", "stopped by the launcher"))
    assert "in train" in figures["stack"]
    # Whom the launcher blames is a race on a loaded machine: the aborted rank, or the peer exiting with 1.
    if figures["blamed_rank"] == 0:
        assert (figures["exitcode"], figures["signal"]) == (-6, "SIGABRT")
        assert "Signal 6 (SIGABRT) received by PID" in str(error)
    else:
        assert (figures["blamed_rank"], figures["exitcode"]) == (1, 1)


@pytest.mark.parametrize("fault", ["env_precision", "segfault"])
def test_teardown_is_fast_and_leaves_nothing(fault, no_leftovers):
    figures = failure_of(case.buggy, job(fault=fault)).figures
    assert 0 <= figures["teardown_s"] < TEARDOWN_GOAL_S
    assert figures["processes_left"] == 0 and set(descendants(os.getpid())) <= no_leftovers
    assert figures["port_released"] and figures["ports_left"] == []
    assert not listening(figures["port"])
    with socket.socket() as reuse:  # the rendezvous port can be bound again at once
        reuse.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reuse.bind(("127.0.0.1", figures["port"]))
    assert not figures["deadline_hit"]


def test_a_long_process_group_timeout_is_never_waited_for(no_leftovers):
    figures = failure_of(case.longer_timeout, job()).figures
    assert figures["teardown_s"] < TEARDOWN_GOAL_S  # the timeout is 1800 s


def test_a_hung_rank_is_killed_at_the_deadline(no_leftovers):
    error = failure_of(lambda j: launch(sleep_forever, j, nprocs=2, deadline_s=2.0), job())
    assert error.figures["deadline_hit"] and error.figures["exitcode"] == -9
    assert error.figures["processes_left"] == 0


def test_a_rank_waiting_in_cpp_dies_at_the_launchers_sigterm(no_leftovers):
    """Rank 0 waits in C++ on a key that never comes (store timeout 20 s); rank 1 exits: the launcher's
    SIGTERM must end rank 0 at once, not when its wait times out."""
    started = time.monotonic()
    error = failure_of(lambda j: launch(wait_in_cpp, j, nprocs=2), job(fault="none", pg_timeout_s=20))
    assert time.monotonic() - started < TEARDOWN_GOAL_S
    assert error.figures["rank_outcomes"] == {"0": "stopped by the launcher", "1": "exited with code 3"}
    assert error.figures["blamed_rank"] == 1 and not error.figures["deadline_hit"]


def wait_in_cpp(the_job):
    import torch.distributed as dist

    rank, _ = case.start_rank(the_job)
    if rank == 1:
        time.sleep(0.5)
        os._exit(3)
    started = time.monotonic()
    dist.distributed_c10d._get_default_store().wait(["never set"])
    return time.monotonic() - started


def sleep_forever(_):
    time.sleep(3600)


@pytest.mark.parametrize(
    ("fault", "field"),
    [("model_dtype", "param dtypes"), ("model_shape", "param shapes"), ("torch_version", "torch")],
)
def test_preflight_names_the_odd_rank_and_field(fault, field, no_leftovers):
    with pytest.raises(case.PreflightMismatch, match=f"^rank 1 differs on {field}: .* where rank 0 has ") as caught:
        case.fixed(job(fault=fault))
    assert caught.value.figures["processes_left"] == 0


def test_preflight_alone_names_the_rank_whose_environment_differs(no_leftovers):
    expected = "^rank 1 differs on param dtypes: conv1.weight float64 where rank 0 has conv1.weight float32$"
    with pytest.raises(case.PreflightMismatch, match=expected):
        case.check_only(job(fault="env_precision"))


def test_preflight_blames_the_minority_among_three_ranks(no_leftovers):
    expected = r"^rank 0 differs on param shapes: conv1.weight \(16, 8, 3\) where ranks 1, 2 have conv1.weight \(8, 8, 3\)$"
    with pytest.raises(case.PreflightMismatch, match=expected):
        case.fixed(job(fault="model_shape", fault_rank=0, sizes={"ranks": 3, "batch": 6}))


def test_disagreements_names_each_field():
    usual = {"torch": "2.13.0", "device": "x86_64", "param dtypes": (("w", "float32"), ("b", "float32"))}
    odd = {**usual, "torch": "2.12.0", "param dtypes": (("w", "float32"), ("b", "float64"))}
    assert case.disagreements([usual, usual, odd]) == [
        "rank 2 differs on torch: '2.12.0' where ranks 0, 1 have '2.13.0'",
        "rank 2 differs on param dtypes: b float64 where ranks 0, 1 have b float32",
    ]
    assert case.disagreements([usual, usual]) == []


@pytest.mark.parametrize("fault", ["env_precision", "none"])
def test_fixed_ddp_equals_single_process_training(fault, no_leftovers):
    the_job = job(fault=fault)
    got, want = case.fixed(the_job), case.reference(the_job)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == (2, *the_job.init[name].shape)
        torch.testing.assert_close(got[name], want[name], atol=CONFIG.tolerance.atol, rtol=CONFIG.tolerance.rtol)
        assert torch.equal(got[name][0], got[name][1])  # DDP keeps the ranks identical


def test_one_rank_trains_but_is_not_the_job(no_leftovers):
    the_job = job()
    got = case.single_rank(the_job)
    assert got["conv1.weight"].shape[0] == 1 != the_job.ranks


def test_ddp_start_up_broadcast_corrupts_the_odd_rank_silently(no_leftovers):
    """The mismatched broadcast passes: rank 1's float64 weights take rank 0's float32 bytes."""
    changed = launch(broadcast_probe, job(), nprocs=2)
    assert not any(changed[0].values())
    assert changed[1]["norm1.weight"]


def broadcast_probe(the_job):
    rank, device = case.start_rank(the_job)
    model = case.build_model(the_job, rank, getattr(torch, os.environ.get(case.PRECISION_ENV, the_job.precision)), device)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.nn.parallel.DistributedDataParallel(model)
    return {name: not torch.equal(p.detach(), before[name]) for name, p in model.named_parameters()}


def test_own_listening_ports_sees_an_open_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port in own_listening_ports() and listening(port)
    assert port not in own_listening_ports()


def test_yaml_fault_modes_are_the_case_modes():
    assert "fault: env_precision" in Path(CASE_CONFIG_DIR / "multigpu_segfault.yaml").read_text()
    with pytest.raises(ValueError, match="fault=bogus"):
        job(fault="bogus")


@pytest.mark.parametrize("content", ["", '{"message": {"message": "RuntimeE', '{"message": {}}'], ids=["empty", "cut short", "no message"])
def test_a_rank_whose_error_file_was_cut_short_reads_as_stopped_by_the_launcher(tmp_path, content):
    # The launcher's SIGTERM can fall while a rank writes its error file (seen on torch 2.4.1): an empty file.
    rank_dir = tmp_path / "run" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stderr.log").write_text("")
    (rank_dir / "error.json").write_text(content)
    assert read_rank_logs(str(tmp_path))[1]["outcome"] == "stopped by the launcher"


def test_a_rank_that_raised_reads_as_raised_with_the_first_line_of_its_error(tmp_path):
    rank_dir = tmp_path / "run" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "error.json").write_text('{"message": {"message": "PreflightMismatch: rank 1 differs\\nmore", "extraInfo": {}}}')
    rank = read_rank_logs(str(tmp_path))[0]
    assert (rank["outcome"], rank["error"]) == ("raised", "PreflightMismatch: rank 1 differs")
