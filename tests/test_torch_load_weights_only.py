"""torch_load_weights_only beyond the harness phases: which symptom each torch release is judged by, what the two
checkpoints name, and that the fix's allowlist is what a numpy float64 needs and no more."""

import io
import os
import pickle
import pickletools
import re

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.torch_version import TorchVersion

from cases import torch_load_weights_only as case
from harness.cases import CASE_CONFIG_DIR, Symptom, WrongResult, case_text, symptom_on

requires_2_6 = pytest.mark.skipif(
    TorchVersion(torch.__version__) < "2.6", reason="get_unsafe_globals_in_checkpoint and the default flip are torch >= 2.6"
)
SMALL = {"epochs": 3, "classes": 2, "in_channels": 1, "stages": 1, "base_features": 4}


@pytest.fixture(scope="module")
def x():
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "torch_load_weights_only.yaml")
    cfg.sizes = SMALL
    return case.make_inputs(cfg, "cpu")


@pytest.mark.parametrize(
    ("version", "kind", "warns"),
    [
        ("2.3.1", WrongResult, False),  # pickle, silently: the crafted file's code runs
        ("2.4.1", WrongResult, True),  # the same, with the FutureWarning (torch/serialization.py of 2.4.0 and 2.5.1)
        ("2.5.1+cpu", WrongResult, True),
        ("2.6.0", Symptom, False),  # weights_only defaults to True (`_default_to_weights_only`)
        ("2.13.0+cpu", Symptom, False),
    ],
)
def test_each_release_is_judged_by_its_own_symptom(version, kind, warns):
    for device in ("cpu", "cuda"):
        symptom = symptom_on(case.symptoms[device], version)
        assert type(symptom) is kind and symptom.expected_on(version)
        assert (getattr(symptom, "warning", None) is not None) == warns


@requires_2_6
def test_the_symptom_patterns_match_the_texts_the_docstring_quotes():
    quoted = case_text(case).sections["Symptom on CPU"]
    assert re.search(case.FUTURE_WARNING, quoted)
    assert re.search(case.UNPICKLING, quoted.replace("\n    ", "\n"))  # the thread's numpy 1.x name, numpy.core
    try:
        torch.load(io.BytesIO(case._saved({"x": np.float64(0.5)})))
    except pickle.UnpicklingError as error:  # this torch and numpy: numpy._core
        assert re.search(case.UNPICKLING, str(error))


@requires_2_6
def test_the_trusted_checkpoint_names_numpy_alone_and_the_crafted_one_names_exec(x):
    trusted = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(x.checkpoint))
    crafted = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(x.crafted))
    assert all(name.startswith("numpy.") for name in trusted) and trusted
    assert "builtins.exec" in crafted


@requires_2_6
def test_the_allowlist_needs_each_of_its_three_entries():
    saved = case._saved({"best": np.float64(0.5)})
    for left_out in range(len(case.NUMPY_FLOAT64)):
        allowed = [entry for index, entry in enumerate(case.NUMPY_FLOAT64) if index != left_out]
        with pytest.raises(pickle.UnpicklingError), torch.serialization.safe_globals(allowed):
            torch.load(io.BytesIO(saved), weights_only=True)
    assert case.load_weights_only(io.BytesIO(saved)) == {"best": 0.5}


@requires_2_6
def test_the_fix_refuses_the_crafted_file_without_running_it_and_pickle_runs_it(x):
    assert case.fixed(x)["crafted"] == {"refused": torch.tensor(True), "code_ran": torch.tensor(False)}
    assert case.weights_only_false(x)["crafted"] == {"refused": torch.tensor(False), "code_ran": torch.tensor(True)}


def inputs_with_payload(name: str, exec_seed: int = 0):
    """Small inputs whose crafted checkpoint carries the payload `name`: the yaml's seed for `exec`, else the first
    seed that draws it."""
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "torch_load_weights_only.yaml")
    cfg.sizes = SMALL
    cfg.seed = exec_seed if name == "exec" else next(seed for seed in range(1, 1000) if case.payload_of(seed, exec_seed)[0] == name)
    return case.make_inputs(cfg, "cpu")


def test_the_published_seed_keeps_exec_and_every_other_seed_draws_another_payload_under_a_variable_of_its_own():
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "torch_load_weights_only.yaml")
    assert case.payload_of(cfg.seed, cfg.crafted.exec_seed) == ("exec", case.PAYLOAD_FLAG, "ran")
    drawn = [case.payload_of(seed, cfg.crafted.exec_seed) for seed in range(1, 400)]
    assert {name for name, _, _ in drawn} == set(case.PAYLOADS) - {"exec"}
    assert len({flag for _, flag, _ in drawn}) == len(drawn) and case.PAYLOAD_FLAG not in {flag for _, flag, _ in drawn}


def named_in(payload) -> set[str]:
    """The globals and strings a pickled payload holds, as a byte scan would see them."""
    found, strings = set(), []
    for opcode, argument, _ in pickletools.genops(pickle.dumps(payload, protocol=2)):
        if opcode.name == "GLOBAL":
            found.add(argument)
        elif isinstance(argument, str):
            strings.append(argument)
    return found | set(strings)


def test_no_global_and_no_string_is_common_to_every_payload_a_second_seed_may_carry():
    """A loader that refuses files naming one thing (exec, eval, os, environ, the variable) loads one of them."""
    common = set.intersection(*(named_in(case.crafted_payload(seed, 0)) for seed in range(1, 200)))
    assert not common, common


@requires_2_6
@pytest.mark.parametrize("name", sorted(case.PAYLOADS))
def test_every_payload_runs_under_pickle_is_refused_by_the_fix_and_rejects_every_bad_fix(name):
    x = inputs_with_payload(name)
    _, flag, _ = case.payload_of(x.seed, 0)
    want = case.reference(x)["crafted"]
    assert case.fixed(x)["crafted"] == want == {"refused": torch.tensor(True), "code_ran": torch.tensor(False)}
    assert case.weights_only_false(x)["crafted"] == {"refused": torch.tensor(False), "code_ran": torch.tensor(True)}
    assert flag not in os.environ  # what the payload set is taken back
    for bad, fix in case.bad_fixes.items():
        try:
            got = fix(x)["crafted"]
        except pickle.UnpicklingError:
            continue  # weights_only=True alone: the trusted checkpoint still raises
        assert got != want, f"{bad} passes on the {name} payload"


def test_the_environment_is_compared_and_put_back():
    before = dict(os.environ)
    assert not case.environment_restored(before)
    os.environ["TORCH_LOAD_CASE_TEST_ADDED"] = "1"
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/changed"
    assert case.environment_restored(before)
    assert dict(os.environ) == before
