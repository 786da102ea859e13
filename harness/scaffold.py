"""`python -m harness new <name>`: the skeleton of a new case, every part a placeholder that the contract names.

Writes
    cases/<name>.py                     the docstring's sections, the names the contract requires, each a TODO
    conf/case/<name>.yaml               its command line, name, seed, sizes, tolerance, speed budget, hints: TODOs
    tests/triage_logs/<name>/           real logs for triage (a README.md says what goes there)
    tests/triage_logs_heldout/<name>/   logs kept apart while the case's triage signs are tuned

The module imports (the fork server imports every case before each run), but every function raises
NotImplementedError and every section says TODO: until each is filled, `python -m pytest tests/test_contract.py`
fails, naming what the case still lacks (`contract_problems` in harness/cases.py). A scaffolded case never passes
quietly. Nothing is overwritten: a name already taken, or one that is not a lowercase Python identifier, is refused
with exit status 2.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

from harness.cases import ROOT

EXIT_OK, EXIT_USAGE = 0, 2
USAGE = "python -m harness new <name>   (a lowercase Python identifier, e.g. new loss_nan_after_amp)"
NAME = re.compile(r"[a-z][a-z0-9_]*")


def paths(name: str, root: Path = ROOT) -> dict[str, Path]:
    """What the scaffold writes, by role."""
    return {
        "module": root / "cases" / f"{name}.py",
        "config": root / "conf" / "case" / f"{name}.yaml",
        "logs": root / "tests" / "triage_logs" / name / "README.md",
        "held_out": root / "tests" / "triage_logs_heldout" / name / "README.md",
    }


def problem(name: str, root: Path = ROOT) -> str | None:
    """Why `name` cannot be a new case, or None."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        return f"{name!r} is not a case name: use a lowercase Python identifier (letters, digits, _; starting with a letter)"
    written = paths(name, root).values()
    taken = [
        path.relative_to(root) for path in (p.parent if p.name == "README.md" else p for p in written) if path.exists()
    ]  # a log folder, not its README
    if taken:
        return f"case {name!r} exists already ({', '.join(map(str, taken))}): nothing written"
    return None


def scaffold(name: str, root: Path = ROOT) -> list[Path]:
    """Write the new case's files under `root`; raises ValueError (nothing written) where `problem` says why not."""
    why = problem(name, root)
    if why:
        raise ValueError(why)
    texts = {
        "module": module_text(name),
        "config": config_text(name),
        "logs": LOGS_README.format(name=name),
        "held_out": HELD_OUT_README.format(name=name),
    }
    written = []
    for role, path in paths(name, root).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[role])
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(f"usage: {USAGE}")
        return EXIT_OK
    if len(argv) != 1:
        print(f"usage: {USAGE}", file=sys.stderr)
        return EXIT_USAGE
    name = argv[0]
    try:
        written = scaffold(name)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"new case {name}: wrote")
    for path in written:
        print(f"  {path.relative_to(ROOT)}")
    print(f"""next:
  python -m pytest tests/test_contract.py -k {name}    # names what {name} still lacks; fill it in until it passes
  python -m harness case={name} device=cpu              # then every phase, until it exits 0
  the steps: docs/guides/add-a-case.md""")
    return EXIT_OK


def module_text(name: str) -> str:
    return MODULE.replace("<name>", name)


def config_text(name: str) -> str:
    return CONFIG.replace("<name>", name)


MODULE = '''"""TODO: the title: what goes wrong, in one line.

Upstream: TODO: the thread, https://github.com/<owner>/<repo>/issues/<number>, and which project's code it is.

Fidelity: TODO: what is faithful to upstream (the layer, the sizes, the order of ops) and what is synthetic
    (seeded stand-ins for data the thread does not publish), in those words.

Symptom on CUDA: TODO: the error as upstream printed it on CUDA, verbatim, indented by 8:
        TODO: RuntimeError: ...

Symptom on CPU: TODO: the error as upstream printed it on CPU, verbatim, indented by 8:
        TODO: IndexError: ...

Cause: TODO: in two sentences, what the code does wrong and why that fails.

Fix: TODO: what the fix does (upstream's own, where there is one), and why it is right.
"""

import torch

from harness.cases import Symptom
from harness.triage import Sign, TriageSigns

# TODO: the failure per device, e.g. {"cpu": Symptom("IndexError", r"index out of range"), "cuda": Symptom("RuntimeError",
# r"device-side assert", output=r"<the kernel's assertion>")}: the exception class, a regex of its message, and for CUDA a
# regex of what the process printed.
symptoms = {}

# TODO: the signs by which `python -m harness.triage` recognises this failure in a pasted log (literal data only), e.g.
# Sign("failure", r"<the error line>", 0.8, "<what broke>"), Sign("context", r"<a frame by file and function>", 0.3, "<where>"),
# Sign("veto", r"<a near-miss>", 0.0, "<why it is another bug>"). Tune on tests/triage_logs/<name>/, measure on
# tests/triage_logs_heldout/<name>/.
triage_signs = TriageSigns(signs=())

compiled_unit = "TODO: what a user of this code would torch.compile (the model's forward, the loss, the training step)"


def make_inputs(cfg, device):
    """TODO: the inputs, deterministic from `cfg.seed`, sized by `cfg.sizes`, on `device`."""
    raise NotImplementedError("TODO: make_inputs")


def buggy(x):
    """TODO: the upstream code, which fails with the symptom above."""
    raise NotImplementedError("TODO: buggy")


def fixed(x):
    """TODO: the fix, on the same inputs."""
    raise NotImplementedError("TODO: fixed")


def reference(x):
    """TODO: the intended result, computed independently of `fixed` (the correct phase compares the two)."""
    raise NotImplementedError("TODO: reference")


def speed_baseline(x):
    """TODO: what the fix is timed against (the code that worked, or the same op without the guard)."""
    raise NotImplementedError("TODO: speed_baseline")


# TODO: the plausible wrong fixes from the threads, each of which the harness must reject: {"name": function}.
bad_fixes = {}

# TODO: correct but clearly slower fixes (a Python loop, a round trip through the host): the speed verdict must flag
# each. Required once the yaml sets a speed budget.
slow_fixes = {}
'''

CONFIG = """# python -m harness case=<name>
name: <name>
seed: 0
sizes: {}           # TODO: the upstream sizes, positive integers (batch: 64, ...)
tolerance: {atol: 0.0, rtol: 0.0}  # TODO: of the comparison with `reference` (integers are compared exactly)
speed:
  budget: {cpu: null, cuda: null}  # TODO: the most the fix may cost against speed_baseline, per device, once measured
hints:  # python -m harness case=<name> hint=<n>: where to look, what is wrong, what the fix does (never its code)
  - "TODO: Where to look: ..."
  - "TODO: What is wrong: ..."
  - "TODO: What the fix does: ..."
title: "TODO: what goes wrong, at most 12 words"  # the page's title (docs/cases/<name>.md): one line
summary:  # the box above the page's story: what you see, why, the fix, a short line each (harness/teach/summary.py)
  see: "TODO: what you see: the error's line, or what goes wrong where nothing raises"
  why: "TODO: why, in one line"
  fix: "TODO: the fix, in one line"
"""

LOGS_README = """# Triage logs of {name}

Real logs of this failure from other projects' threads (never the case's own upstream thread): positives, and at least
as many near-misses (logs that look alike and are another bug), one log per file, `<project>_<what>.log`. Each starts
with the lines `#=EXPECT=# {name}` (or `none`, or the case a near-miss is), `#=SOURCE=# <the thread's URL>`, and marks
the line that decides with ` #=MATCH=#` at its end; `#=CANDIDATE=# {name}` marks a log that holds too little to decide.
The markers are described in tests/test_triage.py; `python -m pytest tests/test_triage.py` checks every log.
"""

HELD_OUT_README = """# Held-out triage logs of {name}

Logs of the same form as tests/triage_logs/{name}/, kept apart while the case's `triage_signs` are tuned: measure the
signs on them once, record the figures in docs/history/measurements.md, and only then let them join the rest.
"""
