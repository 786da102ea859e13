"""docs/guides/extend.md's three recipes, each followed once in a copy of the harness: a case, a phase, a failure kind.

Each test writes what its recipe says into a fresh copy (the harness, the cases, the config), runs
`python -m harness` there, and checks two things: the run takes the new part, and the copy's changes are exactly the
files the recipe names. A recipe that needs another file, or whose files no longer exist, fails here first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("harness", "cases", "conf", "hydra_plugins", "pyproject.toml")
RECIPES = ROOT / "docs" / "guides" / "extend.md"

TOY_CASE = '''\
"""A float16 sum overflows to inf: a toy case, written by tests/test_extend.py to follow docs/guides/extend.md.

Upstream: https://github.com/pytorch/pytorch/issues/0 (none: this case is the recipe's test, not a real failure)

Fidelity: synthetic: 4096 values of 30.0 summed in float16, whose largest finite value is 65504.

Symptom on CUDA: the same, silent: the sum is inf.

Symptom on CPU: the same, silent: the sum is inf.

Cause: float16 cannot hold 122880. The sum overflows.

Fix: sum in float32.
"""

import torch

from harness.cases import WrongResult
from harness.triage import Sign, TriageSigns

symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}
triage_signs = TriageSigns(signs=(Sign("failure", r"(?i)float16 sum is inf", 0.9, "a float16 sum that overflowed"),))
compiled_unit = "the sum"


def make_inputs(cfg, device):
    return torch.full((cfg.sizes.count,), 30.0, device=device)


def buggy(x):
    """The sum in float16."""
    return x.half().sum().float()


def fixed(x):
    """The sum in float32."""
    return x.sum(dtype=torch.float32)


def reference(x):
    return x.double().sum().float()


def speed_baseline(x):
    return x.sum()


def clamp_to_the_largest_half(x):
    """Generic attempt: the sum in float16, clamped to its largest finite value."""
    return x.half().sum().clamp(max=65504).float()


bad_fixes = {"clamp_to_the_largest_half": clamp_to_the_largest_half}
'''

TOY_YAML = """\
# python -m harness case=toy_sum
name: toy_sum
seed: 0
sizes:
  count: 4096
tolerance: {atol: 1.0e-3, rtol: 1.0e-5}
speed:
  budget: {cpu: null, cuda: null}
hints:
  - "Where to look: the dtype of the sum."
  - "What is wrong: float16's largest value is 65504."
  - "What the fix does: sums in a wider dtype."
title: "A float16 sum overflows to inf"
summary:
  see: "The sum is inf."
  why: "float16 cannot hold it."
  fix: "Sum in float32."
"""


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The harness, its cases and its config, copied and committed, so that `git status` shows what a recipe changed."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, tree / name)
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        subprocess.run(["git", *command], cwd=tree, check=True)
    return tree


def changed_files(tree: Path) -> set[str]:
    status = subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=tree, check=True, capture_output=True, text=True).stdout
    return {line[3:] for line in status.splitlines()}


def run_harness(tree: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m harness` in the copy (its own modules first on the path), and the record it wrote."""
    out = tree.parent / "out"
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "harness", "device=cpu", "timeout_s=120", f"hydra.run.dir={out}", *overrides]
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    records = sorted(out.glob("*.json"))
    return result, (json.loads(records[0].read_text()) if records else {})


def edit(path: Path, old: str, new: str) -> None:
    """Replace `old` (which must be there, once) with `new`: the recipe's edit of an existing file."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer holds {old!r}: the recipe in extend.md names a place that moved"
    path.write_text(text.replace(old, new))


def add_the_toy_case(tree: Path) -> None:
    (tree / "cases" / "toy_sum.py").write_text(TOY_CASE)
    (tree / "conf" / "case" / "toy_sum.yaml").write_text(TOY_YAML)


def phases_of(record: dict) -> dict[str, dict]:
    return {phase["phase"]: phase for phase in record.get("phases", [])}


def test_the_recipes_name_the_files_these_tests_edit():
    text = RECIPES.read_text()
    for named in (
        "cases/<name>.py",
        "conf/case/<name>.yaml",
        "harness/phases/<phase>.py",
        "`TABLE` of `harness/phases/__init__.py`",
        "harness/symptoms.py",
        "`AnySymptom`",
        "harness/phases/reproduce.py",
        "`KINDS`",
    ):
        assert named in text, f"extend.md no longer says {named!r}: update the recipe and this test together"


@pytest.mark.untimed
@pytest.mark.slow
def test_a_case_costs_only_its_own_files(copy: Path):
    add_the_toy_case(copy)
    result, record = run_harness(copy, "case=toy_sum", "phases=[reproduce,fix,correct,bad_fixes]")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    phases = phases_of(record)
    assert phases["reproduce"]["status"] == "wrong_result" and phases["reproduce"]["ok"]
    assert phases["correct"]["ok"] and phases["bad_fix:clamp_to_the_largest_half"]["ok"]
    assert changed_files(copy) == {"cases/toy_sum.py", "conf/case/toy_sum.yaml"}


TOY_PHASE = '''\
"""A toy phase (tests/test_extend.py): how many bytes the case's inputs hold, measured in a child."""

from types import ModuleType

import torch
from omegaconf import DictConfig

from harness.cases import load_case
from harness.phases.common import abnormal, record_of
from harness.process.isolate import run_isolated


def _input_bytes(cfg: DictConfig, device: str) -> int:
    inputs = load_case(cfg.name).make_inputs(cfg, device)
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else [t for t in inputs if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def input_bytes(case: ModuleType, spec) -> "PhaseRecord":
    result = run_isolated(_input_bytes, spec.case_cfg, spec.device, timeout_s=spec.timeout_s)
    if result.status != "returned":
        return abnormal("input_bytes", result)
    return record_of("input_bytes", "measured", True, f"{result.value} bytes", result, {"bytes": result.value})
'''


@pytest.mark.untimed
@pytest.mark.slow
def test_a_phase_costs_its_module_and_one_table_entry(copy: Path):
    add_the_toy_case(copy)
    (copy / "harness" / "phases" / "input_bytes.py").write_text(TOY_PHASE)
    table = copy / "harness" / "phases" / "__init__.py"
    edit(table, "\nTABLE: dict[str, Phase] = {", "\nfrom harness.phases.input_bytes import input_bytes\n\nTABLE: dict[str, Phase] = {")
    edit(table, "\n    )\n}\nCASE_CONTROLS", '\n        Phase("input_bytes", _once(input_bytes)),\n    )\n}\nCASE_CONTROLS')

    result, record = run_harness(copy, "case=toy_sum", "phases=[reproduce,input_bytes]")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert phases_of(record)["input_bytes"]["figures"]["bytes"] == 4096 * 4
    assert changed_files(copy) - {"cases/toy_sum.py", "conf/case/toy_sum.yaml"} == {
        "harness/phases/input_bytes.py",
        "harness/phases/__init__.py",
    }


TOY_KIND = '''

@dataclass(frozen=True)
class Prints(_Ranged):
    """A failure that is a line printed: `buggy` returns the reference's output but prints `line` (a regex), as a
    library does that reports an error and carries on. A toy kind (tests/test_extend.py)."""

    line: str
    fixed_in: str | None = None
    appears_in: str | None = None
    modes: tuple[str, ...] | None = None


'''

TOY_JUDGE = '''
def reproduce_printed(symptom, case, cfg, settings, result):
    """A failure that is a printed line (`Prints`): the first line of the buggy child's output that matches."""
    if result.status != "returned":
        return abnormal("reproduce", result)
    line = _first_matching_line(symptom.line, result.output)
    if line is None:
        return record_of("reproduce", "not_reproduced", False, f"buggy printed nothing matching /{symptom.line}/", result)
    return record_of("reproduce", "reproduced", True, line, result, {"printed": line})


'''


@pytest.mark.untimed
@pytest.mark.slow
def test_a_failure_kind_costs_its_class_and_its_judge(copy: Path):
    add_the_toy_case(copy)
    symptoms = copy / "harness" / "symptoms.py"
    edit(
        symptoms,
        "\n\nAnySymptom = Symptom | Growth | WrongResult | Warns | Slow\n",
        TOY_KIND + "AnySymptom = Symptom | Growth | WrongResult | Warns | Slow | Prints\n",
    )
    edit(
        copy / "harness" / "cases.py",
        "    AnySymptom,\n    Growth,\n",
        "    AnySymptom,\n    Growth,\n    Prints,\n",
    )
    reproduce = copy / "harness" / "phases" / "reproduce.py"
    edit(
        reproduce,
        "\nKINDS: dict[type, Kind] = {",
        TOY_JUDGE + "from harness.symptoms import Prints  # noqa: E402\n\nKINDS: dict[type, Kind] = {",
    )
    edit(
        reproduce,
        "    Growth: Kind(_reproduce_growth, in_child=False),\n}",
        "    Growth: Kind(_reproduce_growth, in_child=False),\n    Prints: Kind(reproduce_printed, returns=True),\n}",
    )
    case = copy / "cases" / "toy_sum.py"
    edit(case, "from harness.cases import WrongResult", "from harness.cases import Prints")
    edit(
        case,
        'symptoms = {"cpu": WrongResult(), "cuda": WrongResult()}',
        'symptoms = {"cpu": Prints(r"overflow"), "cuda": Prints(r"overflow")}',
    )
    edit(
        case,
        '    """The sum in float16."""\n    return x.half().sum().float()',
        '    """The sum in float32, and a warning printed."""\n    print("toy_sum: overflow in float16, summed in float32", flush=True)\n    return x.sum(dtype=torch.float32)',
    )

    result, record = run_harness(copy, "case=toy_sum", "phases=[reproduce,fix,correct]")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reproduced = phases_of(record)["reproduce"]
    assert reproduced["status"] == "reproduced" and "overflow in float16" in reproduced["figures"]["printed"]
    assert changed_files(copy) - {"cases/toy_sum.py", "conf/case/toy_sum.yaml"} == {
        "harness/symptoms.py",
        "harness/cases.py",
        "harness/phases/reproduce.py",
    }


def test_the_recipes_are_followed_here():
    """The recipe tests above exist for each of extend.md's three headings."""
    headings = [line[3:] for line in RECIPES.read_text().splitlines() if line.startswith("## ")]
    assert headings == ["A case", "A phase", "A failure kind"], headings
