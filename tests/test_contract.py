"""Every case is complete: a module and a yaml, the contract's names, a docstring a person can read."""

import pytest
from omegaconf import OmegaConf

from harness.cases import CASE_CONFIG_DIR, ROOT, Symptom, case_names, case_text, config_names, contract_problems, load_case
from harness.process.outcome import Failure

CASES = case_names()


def test_cases_are_found_by_scanning_the_folder():
    assert {"embedding_oob", "codebook_oob"} <= set(CASES)


def test_every_case_module_has_a_yaml_and_every_yaml_a_module():
    assert CASES == config_names()


@pytest.mark.parametrize("name", CASES)
def test_case_fulfils_the_contract(name):
    problems = contract_problems(load_case(name))
    assert not problems, f"{name} lacks {len(problems)} part(s) of the contract (harness/cases.py):\n- " + "\n- ".join(problems)


@pytest.mark.parametrize("name", CASES)
def test_case_has_real_triage_logs_with_a_positive(name):
    folders = [ROOT / "tests" / folder / name for folder in ("triage_logs", "triage_logs_heldout")]
    logs = [path for folder in folders for path in folder.glob("*.log")]
    positives = [path for path in logs if f"#=EXPECT=# {name}\n" in path.read_text()]
    assert positives, f"{name} has no real log in tests/triage_logs/{name}/ marked `#=EXPECT=# {name}` (tests/test_triage.py says how)"


@pytest.mark.parametrize("name", CASES)
def test_yaml_starts_with_its_command_and_names_its_case(name):
    path = CASE_CONFIG_DIR / f"{name}.yaml"
    first_line = path.read_text().splitlines()[0]
    assert first_line == f"# python -m harness case={name}" or first_line.startswith(f"# python -m harness case={name} ")
    cfg = OmegaConf.load(path)
    assert cfg.name == name
    assert {"seed", "tolerance"} <= set(cfg)


@pytest.mark.parametrize("name", CASES)
def test_docstring_cites_upstream_and_states_fidelity(name):
    text = case_text(load_case(name))
    assert "https://github.com/" in text.sections["Upstream"]
    assert any(word in text.sections["Fidelity"].lower() for word in ("faithful", "synthetic"))


def test_docstring_sections_join_prose_and_keep_verbatim_lines():
    module = type("M", (), {"__doc__": "Title.\n\nCause: one\n    two\nSymptom on CPU: it says\n        IndexError: x\n"})
    text = case_text(module)
    assert text.title == "Title."
    assert text.sections == {"Cause": "one two", "Symptom on CPU": "it says\n    IndexError: x"}


def _failure(types, message):
    return Failure(types=types, message=message, where="", traceback="")


def test_symptom_matches_by_class_in_the_mro_and_message():
    symptom = Symptom("RuntimeError", r"device-side assert", output=r"srcIndex < srcSelectDimSize")
    accelerator_error = _failure(("AcceleratorError", "RuntimeError", "Exception"), "CUDA error: device-side assert triggered")
    assert symptom.mismatches(accelerator_error, "Assertion `srcIndex < srcSelectDimSize` failed.") == []
    problems = symptom.mismatches(_failure(("IndexError",), "index out of range in self"), "")
    assert len(problems) == 3


def test_a_symptom_fixed_upstream_is_expected_only_before_that_version():
    symptom = Symptom("RuntimeError", "unsupported", fixed_in="2.4.0")
    assert symptom.expected_on("2.3.1+cu121")
    assert not symptom.expected_on("2.4.0")
    assert not symptom.expected_on("2.13.0+cpu")
    assert Symptom("IndexError", "x").expected_on("2.13.0")


def test_a_symptom_that_appears_on_an_upgrade_holds_over_its_range_of_releases():
    from harness.cases import Versions, Warns, symptom_on

    warning = Warns(r"FutureWarning: You are using `torch.load` with `weights_only=False`", appears_in="2.4", fixed_in="2.6")
    error = Symptom("UnpicklingError", "Weights only load failed", appears_in="2.6")
    versions = Versions(warning, error)
    assert [versions.on(v) for v in ("2.3.1+cu121", "2.4.1", "2.5.1", "2.6.0", "2.13.0+cpu")] == [None, warning, warning, error, error]
    before = symptom_on(versions, "2.3.1")
    assert before is warning and not before.expected_on("2.3.1") and before.clean_status("2.3.1") == "clean_before"
    assert Symptom("IndexError", "x", fixed_in="2.4").clean_status("2.13.0") == "fixed_upstream"
    assert symptom_on(error, "2.3.1") is error and not error.expected_on("2.3.1")
    assert versions.range_text() == "Warns from torch 2.4 until 2.6; Symptom from torch 2.6 on"


def test_a_bad_fix_declared_right_on_some_torch_must_exist_and_name_a_range():
    from types import SimpleNamespace

    from harness.cases import _right_on_problems

    case = SimpleNamespace(bad_fixes={"string_check": None}, bad_fixes_right_on={"string_check": ">=2.7,<2.10"})
    assert _right_on_problems(case) == []
    case.bad_fixes_right_on = {"strnig_check": ">=2.7", "string_check": "2.7 to 2.9"}
    assert _right_on_problems(case) == [
        "`bad_fixes_right_on` names 'strnig_check', which is not in `bad_fixes`",
        "`bad_fixes_right_on['string_check']` is no torch version range: '2.7 to 2.9'",
    ]
