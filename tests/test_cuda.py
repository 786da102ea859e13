"""On a CUDA machine: every case reproduces its CUDA symptom in isolation, and the harness survives it.

The failure may be any kind the harness knows (raised, a wrong result, a warning, a slowdown) or a clean run where
the case records none on this torch; the fix and its check pass and every bad fix is rejected. Timing is left to
the harness's own CUDA runs (tools/device_plan.sh): here only the phases that decide right and wrong run.

Skipped where no GPU is present (CI). Where the CUDA symptom is a device-side assert in the
case's own process, the context is poisoned: an unrelated op in the same process must fail too.
(A launch case's ranks die in processes of their own: the phase's process is not poisoned.)
"""

import pytest

from harness.cases import case_names, load_case
from harness.run import run_case
from harness.statuses import CLEAN_RUN, FAILURE_REPRODUCED, Reproduce
from tests.conftest import compose_config, requires_cuda

pytestmark = [pytest.mark.cuda, requires_cuda]


@pytest.mark.parametrize("name", case_names())
def test_case_on_cuda(name, environment, tmp_path):
    config = compose_config(f"case={name}", "device=cuda", "phases=[reproduce,fix,correct,bad_fixes]")
    record, _ = run_case(config, "cuda", tmp_path, environment)
    phases = {phase.phase: phase for phase in record.phases}
    reproduce = phases["reproduce"]
    assert reproduce.ok and reproduce.status in FAILURE_REPRODUCED | CLEAN_RUN, reproduce.message + "\n" + reproduce.output_tail[-2000:]
    symptom = load_case(name).symptoms["cuda"]
    if reproduce.status == Reproduce.REPRODUCED and getattr(symptom, "output", None):
        assert reproduce.figures["output_line"]
    if reproduce.status == Reproduce.REPRODUCED and "device-side assert" in getattr(symptom, "message", ""):  # raised in this process
        assert reproduce.figures["unrelated_op_after_error"].startswith("failed too")
    for phase in ("fix", "correct"):
        assert phases[phase].status == "passed", phases[phase].message
    assert all(p.status == "rejected" for p in record.phases if p.phase.startswith("bad_fix:"))
