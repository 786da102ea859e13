"""Multiruns whose jobs run elsewhere: the summary and exit status come from the sweep dir, whichever launcher ran them.

The launchers are an optional extra (`pip install -e '.[scale]'`): tests that need one skip without it.
SLURM itself is not run here (tests/test_slurm.py does, where sbatch is installed); its config is composed
and rendered into the sbatch script it would submit.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console

from harness.cases import ROOT, case_names
from harness.cli import EXIT_NO_DEVICE, launcher_installed
from harness.phases import CLEAN_RUN, FAILURE_REPRODUCED
from harness.records import CaseRecord, PhaseRecord, load_record, write_record
from harness.sweep import EXIT_CHECK_FAILED, EXIT_OK, JOB_STATUS, SWEEP_TOKEN, report_sweep, sweep_jobs
from tests.conftest import CUDA_AVAILABLE

HAS_JOBLIB = launcher_installed("hydra_joblib_launcher")
HAS_SUBMITIT = launcher_installed("hydra_submitit_launcher")
needs_joblib = pytest.mark.skipif(not HAS_JOBLIB, reason="hydra-joblib-launcher not installed: pip install -e '.[scale]'")
needs_submitit = pytest.mark.skipif(not HAS_SUBMITIT, reason="hydra-submitit-launcher not installed: pip install -e '.[scale]'")


def sweep(*args, tmp_path):
    command = [sys.executable, "-m", "harness", "-m", *args, f"hydra.sweep.dir={tmp_path}/multirun"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def statuses(tmp_path):
    return [json.loads(path.read_text()) for path in sorted((tmp_path / "multirun").glob(f"*/{JOB_STATUS}"))]


# -- the extra --------------------------------------------------------------------------------


def test_the_launchers_are_an_optional_extra():
    tomllib = pytest.importorskip("tomllib")  # python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scale = " ".join(project["optional-dependencies"]["scale"])
    assert "hydra-joblib-launcher" in scale and "hydra-submitit-launcher" in scale
    assert not any("launcher" in dependency or "submitit" in dependency for dependency in project["dependencies"])


# -- the configs compose ----------------------------------------------------------------------


def _launcher(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["case=embedding_oob", *overrides], return_hydra_config=True).hydra


@needs_joblib
def test_local_parallel_is_joblib_with_two_jobs():
    hydra_cfg = _launcher("hydra/launcher=local_parallel")
    assert hydra_cfg.launcher._target_.endswith("JoblibLauncher") and hydra_cfg.launcher.n_jobs == 2
    assert _launcher("hydra/launcher=local_parallel", "hydra.launcher.n_jobs=4").launcher.n_jobs == 4


@needs_submitit
def test_slurm_composes_with_its_defaults_and_leaves_the_partition_to_the_user():
    launcher = _launcher("hydra/launcher=slurm", "hydra.sweep.dir=/shared/sweep").launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition is None and launcher.timeout_min == 60 and launcher.gpus_per_node == 1
    assert launcher.cpus_per_task >= 1 and launcher.mem_gb >= 1 and launcher.tasks_per_node == 1
    assert launcher.submitit_folder == "/shared/sweep/.submitit/%j"  # logs land in the sweep dir


@needs_submitit
def test_slurm_renders_the_sbatch_script_it_would_submit(tmp_path, monkeypatch):
    # submitit refuses to build a SLURM executor without `srun` on the PATH: give it one that is never run.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    import submitit
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["case=embedding_oob", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", f"hydra.sweep.dir={tmp_path}/sweep"],
            return_hydra_config=True,
        )
        params = dict(instantiate(cfg.hydra.launcher).params)
    # as hydra_submitit_launcher's SlurmLauncher.launch builds its executor
    executor = submitit.AutoExecutor(
        cluster="slurm", folder=params.pop("submitit_folder"), slurm_max_num_timeout=params.pop("max_num_timeout")
    )
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{key if key in base else f"slurm_{key}": value for key, value in params.items()})
    script = executor._executor._make_submission_file_text("python -u -m submitit.core._submit", "uid")
    for line in (
        "--partition=gpu",
        "--time=60",
        "--gpus-per-node=1",
        "--ntasks-per-node=1",
        "--job-name=torch-error-cases",
        f"--output={tmp_path}/sweep/.submitit/",
    ):
        assert line in script


@needs_submitit
def test_slurm_shows_in_the_cli_config():
    shown = subprocess.run(
        [sys.executable, "-m", "harness", "case=embedding_oob", "hydra/launcher=slurm", "--cfg", "hydra", "-p", "hydra.launcher"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == EXIT_OK, shown.stderr
    assert "SlurmLauncher" in shown.stdout and "timeout_min: 60" in shown.stdout


# -- jobs in other processes ------------------------------------------------------------------


@pytest.mark.untimed
@pytest.mark.slow  # workers or programs that each start a fork server: 40 to 50 s
@needs_joblib
def test_local_parallel_runs_every_case_in_worker_processes(tmp_path):
    run = sweep("case=glob(*)", "device=cpu", "phases=[reproduce]", "hydra/launcher=local_parallel", tmp_path=tmp_path)
    assert run.returncode == EXIT_OK, run.stdout + run.stderr
    jobs = statuses(tmp_path)
    assert sorted(job["case"] for job in jobs) == sorted(case_names())
    assert all(job["exit_code"] == EXIT_OK for job in jobs)
    assert len({job["pid"] for job in jobs}) == 2  # two loky workers, each with its own fork server
    for job in jobs:
        record = json.loads((tmp_path / "multirun" / f"{job['job']}_{job['case']}" / job["record"]).read_text())
        assert record["ok"] and record["phases"][0]["status"] in FAILURE_REPRODUCED | CLEAN_RUN, record["phases"][0]
    summary = run.stdout[run.stdout.rindex("summary") :]
    assert all(name in summary for name in case_names())


@pytest.mark.untimed
@pytest.mark.slow  # workers or programs that each start a fork server: 40 to 50 s
@needs_joblib
def test_local_parallel_exit_status_is_the_worst_job_s(tmp_path):
    run = sweep(
        "case=embedding_oob", "device=cpu", "phases=[reproduce]", "timeout_s=300,0.01", "hydra/launcher=local_parallel", tmp_path=tmp_path
    )
    assert run.returncode == EXIT_CHECK_FAILED, run.stdout + run.stderr
    assert sorted(job["exit_code"] for job in statuses(tmp_path)) == [EXIT_OK, EXIT_CHECK_FAILED]
    summary = run.stdout[run.stdout.rindex("summary") :]
    assert "timeout_s=0.01" in summary and "timeout" in summary and "reproduced" in summary


@pytest.mark.untimed
@pytest.mark.slow  # workers or programs that each start a fork server: 40 to 50 s
@needs_joblib
@pytest.mark.skipif(CUDA_AVAILABLE, reason="checks the error on a machine without CUDA")
def test_local_parallel_reports_a_missing_device(tmp_path):
    run = sweep("case=embedding_oob,codebook_oob", "device=cuda", "hydra/launcher=local_parallel", tmp_path=tmp_path)
    assert run.returncode == EXIT_NO_DEVICE, run.stdout + run.stderr
    assert run.stdout.count("no CUDA") >= 2  # one note per job in the summary


@pytest.mark.untimed
@pytest.mark.slow  # workers or programs that each start a fork server: 40 to 50 s
@needs_submitit
def test_submitit_runs_jobs_as_separate_programs_like_slurm_jobs(tmp_path):
    # submitit_local runs each job as `python -m submitit.core._submit`, from a pickle, as SLURM would.
    run = sweep("case=embedding_oob,codebook_oob", "device=cpu", "phases=[reproduce]", "hydra/launcher=submitit_local", tmp_path=tmp_path)
    assert run.returncode == EXIT_OK, run.stdout + run.stderr
    assert sorted(job["case"] for job in statuses(tmp_path)) == ["codebook_oob", "embedding_oob"]
    logs = "".join(path.read_text() for path in (tmp_path / "multirun" / ".submitit").glob("*/*_log.out"))
    assert "every phase met its expectation" in logs  # each job's report is in its log
    assert "embedding_oob" in run.stdout[run.stdout.rindex("summary") :]


def test_the_basic_launcher_summary_comes_from_disk_too(tmp_path):
    run = sweep("case=embedding_oob", "device=cpu", "phases=[reproduce]", "timeout_s=300,0.01", tmp_path=tmp_path)
    assert run.returncode == EXIT_CHECK_FAILED, run.stdout + run.stderr
    assert len(statuses(tmp_path)) == 2 and "timeout_s=0.01" in run.stdout[run.stdout.rindex("summary") :]
    assert (tmp_path / "multirun" / SWEEP_TOKEN).exists()


# -- reading a sweep dir back -----------------------------------------------------------------


def _job(sweep_dir, num, case, *, token, exit_code, finished=True, ok=True):
    job_dir = sweep_dir / f"{num}_{case}"
    record = CaseRecord(
        case=case, title=case, device="cpu", started_at="t0", environment={}, config={}, finished_at="t1" if finished else None
    )
    record.phases.append(PhaseRecord(phase="reproduce", status="reproduced" if ok else "not_reproduced", ok=ok, message="m"))
    write_record(record, job_dir / f"{case}.cpu.json")
    status = {"sweep": token, "job": num, "case": case, "device": "cpu", "overrides": [f"case={case}"], "exit_code": exit_code}
    status["record"] = f"{case}.cpu.json" if exit_code is not None else None
    (job_dir / JOB_STATUS).write_text(json.dumps(status))


def _report(sweep_dir, token):
    console = Console(record=True, width=200)
    return report_sweep(sweep_dir, token, console), console.export_text()


def test_a_job_cut_short_counts_as_failed_and_an_earlier_sweep_s_jobs_are_ignored(tmp_path):
    _job(tmp_path, 0, "embedding_oob", token="now", exit_code=EXIT_OK)
    _job(tmp_path, 1, "codebook_oob", token="now", exit_code=None, finished=False)  # killed: a SLURM time limit
    _job(tmp_path, 2, "autocast_device", token="before", exit_code=EXIT_NO_DEVICE)  # a reused sweep dir
    code, text = _report(tmp_path, "now")
    assert code == EXIT_CHECK_FAILED
    assert "cut short" in text and "codebook_oob" in text and "autocast_device" not in text
    assert [job.status["case"] for job in sweep_jobs(tmp_path, "now")] == ["embedding_oob", "codebook_oob"]


def test_a_sweep_with_no_job_on_disk_is_not_a_success(tmp_path, capsys):
    _job(tmp_path, 0, "embedding_oob", token="before", exit_code=EXIT_OK)
    code, _ = _report(tmp_path, "now")
    assert code == EXIT_CHECK_FAILED and "no job of this sweep" in capsys.readouterr().err


def test_records_read_back_equal_what_was_written(tmp_path):
    _job(tmp_path, 0, "embedding_oob", token="now", exit_code=EXIT_CHECK_FAILED, ok=False)
    path = tmp_path / "0_embedding_oob" / "embedding_oob.cpu.json"
    record = load_record(path)
    assert record.to_json() == json.loads(path.read_text()) and not record.ok


@pytest.mark.untimed
@pytest.mark.slow  # a sweep cut mid-phase: 5 s; the summary-from-disk sweep above stays in the plain run
def test_a_sweep_cut_by_sigterm_mid_phase_records_the_phase_it_cut(tmp_path):
    # What scancel or a SLURM time limit does to a job, here to the basic launcher's process (tests/test_slurm.py: under SLURM).
    command = [
        sys.executable,
        "-m",
        "harness",
        "-m",
        "case=embedding_oob",
        "device=cpu",
        "phases=[reproduce,speed]",
        "speed.process_s=30",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    sweep = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    record_path = tmp_path / "multirun" / "0_embedding_oob" / "embedding_oob.cpu.json"
    deadline = time.monotonic() + 300
    while not (record_path.is_file() and len(json.loads(record_path.read_text())["phases"]) == 1):  # in its speed phase
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()[0]
        time.sleep(0.2)
    sweep.send_signal(signal.SIGTERM)
    output = sweep.communicate(timeout=120)[0]
    assert sweep.returncode == EXIT_CHECK_FAILED, output
    record = json.loads(record_path.read_text())
    assert [(phase["phase"], phase["status"]) for phase in record["phases"]] == [("reproduce", "reproduced"), ("speed", "cut")]
    assert record["finished_at"] is None and "SIGTERM" in record["phases"][-1]["message"]
    (status,) = statuses(tmp_path)
    assert status["exit_code"] is None and "SIGTERM" in status["cut"]
    summary = output[output.rindex("summary") :]
    assert "1 job(s) cut" in summary and "cut in phase speed" in summary


def test_the_summary_counts_undecided_speed_and_memory_apart():
    from io import StringIO

    from rich.console import Console

    from harness.records import CaseRecord, PhaseRecord
    from harness.report import print_summary

    phases = [
        PhaseRecord("speed", "inconclusive", True, ""),
        PhaseRecord("memory", "inconclusive", True, ""),
        PhaseRecord("memory_fix:keeps_graph", "inconclusive", True, ""),
    ]
    record = CaseRecord("graph_kept_alive", "", "cpu", "", {}, {}, phases)
    console = Console(file=StringIO(), width=200)
    print_summary(console, [(record, None)])
    printed = console.file.getvalue()
    assert "1 speed verdict(s) inconclusive" in printed and "2 memory verdict(s) inconclusive" in printed


def test_a_copied_tree_records_the_commit_its_sender_names(monkeypatch):
    """A lent GPU machine gets a copy of the tree whose .git need not be the sender's (one such copy said 47efc51-dirty
    while the tree was 770ec26): the sender's TORCH_ERROR_CASES_COMMIT wins over what git says there."""
    from harness.records import host_environment

    monkeypatch.setenv("TORCH_ERROR_CASES_COMMIT", "770ec266637e9d5c33fb9a891cb3ccbe4395133b")
    assert host_environment()["git_commit"] == "770ec266637e9d5c33fb9a891cb3ccbe4395133b"
    monkeypatch.delenv("TORCH_ERROR_CASES_COMMIT")
    assert host_environment()["git_commit"] != "770ec266637e9d5c33fb9a891cb3ccbe4395133b"
