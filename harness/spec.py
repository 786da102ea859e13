"""What one run of one case is, typed: made once from the Hydra config where the run starts (harness/run.py:
`make_spec`, after `validate`), and handed to every phase in place of the config and its settings.

The phases read the run's axes from its fields (`compile`, `submission`, `device`) and the case's inputs from
`case_cfg`, the case's own config section as the run's axes leave it; that section is also what a phase's child
gets (its wire format: it carries `compile` and the submission to the child). A `RunSpec` pickles (plain fields, a
DictConfig, frozen dataclasses), as a child or a launcher may need it.

    spec = RunSpec(case="embedding_oob", device="cpu", timeout_s=300, case_cfg=OmegaConf.load("conf/case/embedding_oob.yaml"))
    reproduce(load_case(spec.case), spec)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from harness.measure import footprint as memory_source
from harness.measure.timing import MAX_RETAKES
from harness.process.confine import Limits
from harness.process.submitted import Submission


@dataclass(frozen=True)
class SpeedSettings:
    warmup: int = 1  # pairs run untimed first, in each process
    pairs: int = 3  # interleaved candidate/baseline samples per process, at least...
    process_s: float = 0.5  # ...and more until they have taken this long
    min_processes: int = 2  # before a case's own first verdict (its slow controls' low ends may want more)...
    grade_decides_after: int = 2  # ...and before a grade's: an accept or a reject, whatever its margin
    max_processes: int = 12
    max_s: float = 20.0  # past this, a verdict still undecided is inconclusive
    grade_max_s: float = 60.0  # grading: past this, a verdict still undecided is `undecided`, a rejection (never accepted)...
    grade_min_processes: int = 10  # ...once this many timing processes have been measured too, or 3x grade_max_s has passed
    level: float = 0.95  # of the ratio's confidence interval
    max_retakes: int = MAX_RETAKES  # pairs retaken per process for fresh page faults (0: faulting is the cost timed, a compile per call)


@dataclass(frozen=True)
class RunSpec:
    case: str  # the case's name (cases/<case>.py)
    device: str  # cpu or cuda, resolved (never auto)
    timeout_s: float  # per child
    case_cfg: Any = None  # DictConfig: the case's config section as the run's axes leave it (compile, grading, device)
    compile: str = "off"  # torch.compile's backend every phase runs under, or off (eager): harness/compiled.py
    submission: Submission | None = None  # the submitted fix under grade (fix=); None: the case's own `fixed`
    phases: tuple[str, ...] = ()
    speed: SpeedSettings = SpeedSettings()
    cpu_threads: int = 1
    limits: Limits = Limits()  # for children that run a submitted fix (harness/process/confine.py)
    memory: memory_source.MemorySettings = memory_source.MemorySettings()
    config: dict[str, Any] = field(default_factory=dict, compare=False)  # the whole resolved config, for the record

    def __post_init__(self) -> None:
        if self.case_cfg is not None and not isinstance(self.case_cfg, DictConfig):
            raise TypeError(f"case_cfg: a DictConfig, not {type(self.case_cfg).__name__}")

    @property
    def graded(self) -> bool:
        """Whether a submitted fix is under test (a grade), rather than the case's own `fixed`."""
        return self.submission is not None
