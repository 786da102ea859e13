"""hydra/launcher=slurm: hydra-submitit-launcher's SlurmLauncher, waiting for every job before it reports a failed one.

Hydra takes launchers only from the `hydra_plugins` namespace package, hence this folder beside harness/.

The plugin's launch ends in `[job.results()[0] for job in jobs]`: the first job that was cancelled or hit
its time limit raises there while later jobs still run, and the sweep's summary, read from the sweep
dir at that moment, would call them cut too. This launch waits for all of them, then raises the first
failure (Hydra reports it; harness/cli.py then reads the summary and exit status from disk as always).
Needs the `scale` extra (pip install -e '.[scale]'); without it Hydra's plugin scan finds nothing here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from omegaconf import OmegaConf

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
except ImportError:  # no `scale` extra: no launcher to extend (hydra/launcher=slurm then says to install it)
    submitit_launcher = None


class SlurmLauncher(submitit_launcher.SlurmLauncher if submitit_launcher else object):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        # As BaseSubmititLauncher.launch (hydra-submitit-launcher 1.2), but for the wait at the end.
        import submitit

        assert self.config is not None and len(job_overrides) > 0
        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(
            cluster="slurm", folder=self.params["submitit_folder"], slurm_max_num_timeout=self.params["max_num_timeout"]
        )
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(
            **{key if key in base else f"slurm_{key}": value for key, value in self.params.items() if key not in init_keys}
        )
        submitit_launcher.log.info(f"Submitit 'slurm' sweep output dir : {self.config.hydra.sweep.dir}")
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            sweep_dir.chmod(int(str(self.config.hydra.sweep.mode), 8))
        job_params: list[Any] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            submitit_launcher.log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            job_params.append((list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*job_params))
        submitit_launcher.log.info(f"SLURM jobs {', '.join(job.job_id for job in jobs)}")
        returns, failure = [], None
        for job in jobs:
            try:
                returns.append(job.results()[0])
            except Exception as error:  # cancelled, out of time, or the job's process died: wait for the others first
                failure = failure or error
        if failure is not None:
            raise failure
        return returns
