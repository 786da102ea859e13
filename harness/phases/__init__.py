"""The phases, a module each. Each runs its case code in an isolated child and classifies the result.

    reproduce  run `buggy`; expect the device's symptom on this torch (harness/cases.py: `symptom_on`; outside the
               symptom's range of torch versions, `appears_in` to `fixed_in`, a clean run)
               reproduced | not_reproduced | fixed_upstream | clean_before | wrong_failure | crashed | timeout | error; a failure
               that raises nothing: wrong_result (`WrongResult`: differs from `reference`) | warned (`Warns`) | slow
               (`Slow`: right, and timed over `at_least` x the fix) | inconclusive
    fix        run `fixed` on the same inputs; it must not raise
               passed | raised | crashed | timeout | error
    correct    compare `fixed` with `reference` (where the failure is a warning, `Warns`, it must not issue it)
               passed | mismatch | raised | crashed | timeout | error
    speed      time `speed_candidate` (default `fixed`) against `speed_baseline`, on inputs made
               from the case config with `speed.inputs`, then `speed.device_inputs.<device>`, merged
               over it (`speed_config`), in several child processes; the
               ratio's confidence interval against the budget (harness.measure.timing)
               within_budget | over_budget | inconclusive (ok, shown apart) | measured (no budget for this device)
               | raised | crashed | timeout | error; grading: undecided in place of inconclusive (a rejection)
    speed:NAME the same, against each other baseline the yaml names under `speed.also`
    slow_fixes one record per slow fix, phase "slow_fix:<name>": a correct but slower fix, timed as `speed`
               times the fix; the speed verdict must catch it
               flagged (correct and over budget) | missed | no_budget | crashed | timeout | error
               | retraced (compiled: not flagged where dynamo traced the baseline again on every timed call, so
               its time was the tracer's; not judged, and the record says how many frames in how many calls)
    bad_fixes  one record per bad fix, phase "bad_fix:<name>"; each must be rejected
               rejected (it raised, crashed, differs from the reference, or still issues a `Warns` case's warning)
               | accepted | timeout | error
    memory     the fix's memory per step (`steps` calls on one inputs object) against `memory_baseline`
               (default `speed_baseline`; grading: the case's `fixed`), each in its own child, judged against the yaml's `memory.budget`
               (harness/measure/footprint.py); reproduce judges a `Growth` symptom the same way, on `buggy`
               within_budget | over_budget | inconclusive (ok, shown apart) | measured (no budget) | not_applicable
               | raised | crashed | timeout | error
    memory_fixes one record per memory control, phase "memory_fix:<name>"; the memory verdict must flag it
               flagged | missed | no_budget | raised | crashed | timeout | error

Each family's statuses are named in harness/statuses.py (a StrEnum each, written to the records as its strings).
"error" means the case itself broke (e.g. `make_inputs` raised): not a verdict on the bug.
A phase gets the case module and the run's `RunSpec` (harness/spec.py: device, compile mode, the submission, the
settings, and `case_cfg`, the case's config section its inputs are made from).
Children get the case by name (`cfg.name`) and import it from the fork server's preload.
When a submitted fix is graded (harness/grading/grade.py), `fix_under_test` hands fix, correct and speed that
fix instead of `fixed`, and speed times it against the case's own `fixed`.

    common     spec, the case function a phase runs, calling case code in a child, the phase record
    reproduce  reproduce;  correct  fix and correct;  speed  speed (its protocol: clock);  memory  memory;
    controls   slow_fixes, bad_fixes, memory_fixes
The modules import one way: common <- timing_processes <- speed, memory <- reproduce, correct <- controls <- this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Iterator

from harness.cases import fork_server_modules
from harness.phases.common import FIXED, fix_under_test, speed_config
from harness.phases.controls import bad_fix, memory_fix, slow_fix
from harness.phases.correct import correct, fix
from harness.phases.memory import memory, memory_budget, memory_config
from harness.phases.reproduce import reproduce
from harness.phases.speed import speed
from harness.process.fork_server import start_fork_server
from harness.records import PhaseRecord
from harness.spec import RunSpec, SpeedSettings
from harness.statuses import CLEAN_RUN, FAILURE_REPRODUCED

__all__ = [
    "CLEAN_RUN",
    "FAILURE_REPRODUCED",
    "FIXED",
    "CASE_CONTROLS",
    "PHASES",
    "TABLE",
    "RunSpec",
    "SpeedSettings",
    "bad_fix",
    "correct",
    "fix",
    "fix_under_test",
    "memory",
    "memory_budget",
    "memory_config",
    "memory_fix",
    "reproduce",
    "run_phase",
    "slow_fix",
    "speed",
    "speed_config",
    "start_children",
]


@dataclass(frozen=True)
class Phase:
    """One phase of the table: `records(case, spec)` (harness/spec.py: the run, typed) yields its records as each child finishes; a `control`
    phase checks the case's own controls (its slow, bad and memory fixes), which test the harness on the case and are
    left out of a grade."""

    name: str
    records: Callable[[ModuleType, RunSpec], Iterator[PhaseRecord]]
    control: bool = False


def _once(phase: Callable[[ModuleType, RunSpec], PhaseRecord]) -> Callable[..., Iterator[PhaseRecord]]:
    return lambda case, spec: iter([phase(case, spec)])


def _each(controls: str, phase: Callable[..., PhaseRecord]) -> Callable[..., Iterator[PhaseRecord]]:
    return lambda case, spec: (phase(name, case, spec) for name in getattr(case, controls, {}))


# The phases in the order a run takes them: `phases=` in the config names a subset (conf/config.yaml).
TABLE: dict[str, Phase] = {
    phase.name: phase
    for phase in (
        Phase("reproduce", _once(reproduce)),
        Phase("fix", _once(fix)),
        Phase("correct", _once(correct)),
        Phase("speed", speed),
        Phase("slow_fixes", _each("slow_fixes", slow_fix), control=True),
        Phase("bad_fixes", _each("bad_fixes", bad_fix), control=True),
        Phase("memory", _once(memory)),
        Phase("memory_fixes", _each("memory_fixes", memory_fix), control=True),
    )
}
CASE_CONTROLS = tuple(name for name, phase in TABLE.items() if phase.control)


def run_phase(phase: str, case: ModuleType, spec: RunSpec) -> Iterator[PhaseRecord]:
    """The phase's records, each yielded as soon as its child has finished."""
    yield from TABLE[phase].records(case, spec)


PHASES = tuple(TABLE)


def start_children(compiling: bool = False) -> None:
    """Start now the server every phase's child is forked from, while the caller goes on: it imports torch, the
    cases and, `compiling`, the compiler once (harness/compiled.py: `preload_compiler`), so that no child imports
    them again. A notebook calls it first; `python -m harness` starts its own (harness/__main__.py). A server
    already running is kept."""
    start_fork_server(fork_server_modules(compiling=compiling))
