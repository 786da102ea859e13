"""`python -m harness new <name>`: the scaffold of a case fails the contract loudly, naming every placeholder left.

Scaffolds into a temporary root, never into the real cases/ folder."""

import importlib.util
import subprocess
import sys

import pytest
import yaml

from harness import cases, scaffold
from harness.cases import ROOT, contract_problems
from harness.triage import load_signs


def _load(root, name):
    spec = importlib.util.spec_from_file_location(f"cases.{name}", root / "cases" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not registered in sys.modules: the real cases package never sees it
    return module


@pytest.fixture
def scaffolded(tmp_path, monkeypatch):
    written = scaffold.scaffold("scaffolded", root=tmp_path)
    monkeypatch.setattr(cases, "CASE_CONFIG_DIR", tmp_path / "conf" / "case")
    return tmp_path, written


def test_the_scaffold_writes_the_module_the_yaml_and_both_triage_folders(scaffolded):
    root, written = scaffolded
    assert sorted(path.relative_to(root).as_posix() for path in written) == [
        "cases/scaffolded.py",
        "conf/case/scaffolded.yaml",
        "tests/triage_logs/scaffolded/README.md",
        "tests/triage_logs_heldout/scaffolded/README.md",
    ]
    config = (root / "conf" / "case" / "scaffolded.yaml").read_text()
    assert config.splitlines()[0] == "# python -m harness case=scaffolded"
    assert {"name": "scaffolded", "seed": 0}.items() <= yaml.safe_load(config).items()
    assert load_signs(root / "cases")["scaffolded"].signs == ()  # triage reads it without importing it, and claims nothing


def test_a_scaffolded_case_fails_the_contract_naming_every_placeholder(scaffolded):
    root, _ = scaffolded
    problems = contract_problems(_load(root, "scaffolded"))
    for expected in (
        "no symptom for cpu",
        "no symptom for cuda",
        "`bad_fixes` is empty",
        "`triage_signs` has no failure sign: `python -m harness.triage` cannot recognise the failure",
        "`compiled_unit` still says TODO: what a user of this code would torch.compile",
        *(
            f"`{name}` still raises NotImplementedError: write it"
            for name in ("make_inputs", "buggy", "fixed", "reference", "speed_baseline")
        ),
        "docstring title still says TODO: what goes wrong, in one line",
        *(f"docstring section {section!r} still says TODO" for section in cases.REQUIRED_SECTIONS),
    ):
        assert expected in problems
    assert any(problem.startswith("conf/case/scaffolded.yaml line 4 still says TODO") for problem in problems)


def test_each_placeholder_filled_clears_its_problem_and_a_bad_fill_is_named(scaffolded):
    root, _ = scaffolded
    path = root / "cases" / "scaffolded.py"
    text = path.read_text()
    upstream = text[text.index("Upstream:") : text.index("\n\nFidelity:")]
    path.write_text(
        text.replace(upstream, "Upstream: a forum post, not a github thread.").replace(
            'def buggy(x):\n    """TODO: the upstream code, which fails with the symptom above."""\n    raise NotImplementedError("TODO: buggy")',
            "def buggy(x):\n    return x[0]",
        )
    )
    problems = contract_problems(_load(root, "scaffolded"))
    assert "docstring section 'Upstream' cites no https://github.com/ thread" in problems
    assert "docstring section 'Upstream' still says TODO" not in problems
    assert "`buggy` still raises NotImplementedError: write it" not in problems
    assert "`fixed` still raises NotImplementedError: write it" in problems


def test_controls_that_still_raise_are_named_by_their_key(scaffolded):
    root, _ = scaffolded
    path = root / "cases" / "scaffolded.py"
    path.write_text(
        path.read_text().replace("bad_fixes = {}", "def _todo(x):\n    raise NotImplementedError\n\n\nbad_fixes = {'clamp': _todo}")
    )
    problems = contract_problems(_load(root, "scaffolded"))
    assert "`bad_fixes` is empty" not in problems
    assert "`bad_fixes['clamp']` still raises NotImplementedError: write it" in problems


@pytest.mark.parametrize(
    "name, why",
    [
        ("embedding_oob", "exists already"),
        ("Demo", "not a case name"),
        ("demo-case", "not a case name"),
        ("class", "not a case name"),
        ("_private", "not a case name"),
    ],
)
def test_a_taken_or_invalid_name_is_refused_with_exit_2_and_nothing_written(name, why, capsys):
    before = sorted(path.name for path in (ROOT / "cases").iterdir())
    assert scaffold.main([name]) == 2
    assert why in capsys.readouterr().err
    assert sorted(path.name for path in (ROOT / "cases").iterdir()) == before


def test_a_name_taken_in_the_root_is_refused(tmp_path):
    scaffold.scaffold("twice", root=tmp_path)
    with pytest.raises(ValueError, match="exists already"):
        scaffold.scaffold("twice", root=tmp_path)


def test_python_m_harness_new_runs_before_hydra():
    run = subprocess.run([sys.executable, "-m", "harness", "new", "embedding_oob"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "case 'embedding_oob' exists already" in run.stderr and "nothing written" in run.stderr
    usage = subprocess.run([sys.executable, "-m", "harness", "new"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage: python -m harness new <name>" in usage.stderr


def test_the_harness_refuses_to_run_a_case_that_fails_the_contract(monkeypatch):
    from harness import run
    from harness.run import ConfigError
    from tests.conftest import compose_config

    monkeypatch.setattr(
        run,
        "contract_problems",
        lambda case: ["no symptom for cpu", "`bad_fixes` is empty", "`buggy` still raises NotImplementedError: write it", "more"],
    )
    with pytest.raises(
        ConfigError,
        match=r"^case embedding_oob does not meet the contract yet, 4 part\(s\) missing .*: no symptom for cpu; `bad_fixes` is empty; `buggy` still raises NotImplementedError: write it; \.\.\.$",
    ):
        run.validate(compose_config("case=embedding_oob"))
