"""Sweeps submitted to a real SLURM cluster: the one-node cluster of .ci/slurm-local, or the one SLURM_CONF names.

    nox -s slurm                                   # installs SLURM where missing, runs these and the five-case sweep
    pytest -m slurm tests/test_slurm.py            # as root with slurm-wlm, slurmdbd, munge and mariadb-server installed

Skipped where no `sbatch` is on the PATH (CI's default run), and where no cluster answers and none can
be started here (not root, or the daemons are not installed). A cluster named by SLURM_CONF is used as
it is (its default partition must take a 1-CPU job without GPU or memory request); otherwise the module
starts its own and stops it at the end.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from harness.cases import ROOT
from harness.cli import launcher_installed
from harness.sweep import EXIT_CHECK_FAILED, EXIT_OK, JOB_STATUS

SCRIPT = ROOT / ".ci" / "slurm-local"
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,  # a cluster started and stopped (.ci/run: pytest -m slow; nox -s slurm: -m slurm)
    pytest.mark.skipif(shutil.which("sbatch") is None, reason="no sbatch on the PATH: no SLURM here (nox -s slurm installs one)"),
    pytest.mark.skipif(
        not launcher_installed("hydra_submitit_launcher"), reason="hydra-submitit-launcher not installed: pip install -e '.[scale]'"
    ),
]


def _answers(env) -> bool:
    sinfo = subprocess.run(["sinfo", "-h", "-o", "%a"], env=env, capture_output=True, text=True, timeout=30)
    return sinfo.returncode == 0 and "up" in sinfo.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The environment that reaches the cluster (SLURM_CONF set)."""
    if os.environ.get("SLURM_CONF") and _answers(os.environ):
        yield dict(os.environ)
        return
    daemons = ["munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd"]
    path = f"{os.environ['PATH']}:/usr/sbin:/sbin"
    if os.geteuid() != 0 or not all(shutil.which(daemon, path=path) for daemon in daemons):
        pytest.skip("no SLURM cluster answers (SLURM_CONF) and none can be started here: needs root and " + ", ".join(daemons))
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run(["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    finally:
        stopped = subprocess.run(["bash", str(SCRIPT), "stop", str(state)], capture_output=True, text=True, timeout=300)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def _submit(sweep_dir, env, *overrides):
    command = [
        sys.executable,
        "-m",
        "harness",
        "-m",
        *overrides,
        "device=cpu",
        "hydra/launcher=slurm_local",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _jobs(sweep_dir):
    return sorted((json.loads(path.read_text()) for path in sweep_dir.glob(f"*/{JOB_STATUS}")), key=lambda status: status["job"])


def _record(sweep_dir, status):
    return json.loads((sweep_dir / f"{status['job']}_{status['case']}" / f"{status['case']}.cpu.json").read_text())


def _sacct_state(job, env) -> str:
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job], env=env, capture_output=True, text=True, timeout=30)
    return sacct.stdout.strip()


def test_two_cases_run_as_slurm_jobs_and_their_records_name_them(cluster, tmp_path):
    sweep = _submit(tmp_path / "sweep", cluster, "case=embedding_oob,codebook_oob", "phases=[reproduce]")
    output = sweep.communicate(timeout=600)[0]
    assert sweep.returncode == EXIT_OK, output
    jobs = _jobs(tmp_path / "sweep")
    assert [job["case"] for job in jobs] == ["embedding_oob", "codebook_oob"]
    for job in jobs:
        record = _record(tmp_path / "sweep", job)
        assert record["ok"] and record["finished_at"] and record["phases"][0]["status"] == "reproduced"
        assert record["environment"]["slurm"]["job"] == job["slurm_job"]  # the record names the job it ran in
        assert (tmp_path / "sweep" / ".submitit" / job["slurm_job"]).is_dir()  # where its log is
        assert _sacct_state(job["slurm_job"], cluster) == "COMPLETED"
    assert len({job["slurm_job"] for job in jobs}) == 2
    summary = output[output.rindex("summary") :]
    assert "embedding_oob" in summary and "codebook_oob" in summary and "cut" not in summary


def test_a_job_cancelled_mid_phase_keeps_its_phases_and_is_counted_apart(cluster, tmp_path):
    # Job 0 times for minutes (30 s per timing process); job 1 only reproduces and finishes.
    sweep = _submit(tmp_path / "sweep", cluster, "case=embedding_oob", "phases=[reproduce,speed],[reproduce]", "speed.process_s=30")
    record_path = tmp_path / "sweep" / "0_embedding_oob" / "embedding_oob.cpu.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until job 0 has finished reproduce: it is in its speed phase
        if record_path.is_file() and len(json.loads(record_path.read_text())["phases"]) == 1:
            break
        assert sweep.poll() is None, sweep.communicate()[0]
        time.sleep(0.5)
    else:
        pytest.fail("job 0 never got past its reproduce phase")
    job0 = _jobs(tmp_path / "sweep")[0]["slurm_job"]
    subprocess.run(["scancel", job0], env=cluster, check=True, timeout=30)
    output = sweep.communicate(timeout=600)[0]

    assert sweep.returncode == EXIT_CHECK_FAILED, output
    cut, done = _jobs(tmp_path / "sweep")
    record = _record(tmp_path / "sweep", cut)
    assert record["finished_at"] is None and cut["exit_code"] is None and "SIGTERM" in cut["cut"]
    assert [(phase["phase"], phase["status"]) for phase in record["phases"]] == [("reproduce", "reproduced"), ("speed", "cut")]
    assert "SIGTERM" in record["phases"][-1]["message"] and record["environment"]["slurm"]["job"] == job0
    assert _sacct_state(job0, cluster).startswith("CANCELLED")
    assert done["exit_code"] == EXIT_OK and _record(tmp_path / "sweep", done)["ok"]  # the launcher waited for it
    summary = output[output.rindex("summary") :]
    assert "1 job(s) cut" in summary and "cut in phase speed" in summary
