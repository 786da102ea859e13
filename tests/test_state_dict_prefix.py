"""state_dict_prefix beyond the harness phases: what the saved keys are, what the wrong fixes do to them, and that
the fix leaves the caller's checkpoint as it was. Small sizes (the key names do not depend on them)."""

import warnings

import pytest
from omegaconf import OmegaConf

from cases import state_dict_prefix as case
from harness.cases import CASE_CONFIG_DIR

SMALL = {"f_maps": 8, "patch_depth": 8, "patch_height": 16, "patch_width": 16}


@pytest.fixture(scope="module")
def x():
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "state_dict_prefix.yaml")
    cfg.sizes = {**cfg.sizes, **SMALL}
    return case.make_inputs(cfg, "cpu")


def test_every_saved_key_is_a_model_name_behind_data_parallels_prefix(x):
    names = list(case.build_model(x).state_dict())
    saved = list(x.checkpoint["model_state_dict"])
    assert len(names) == 44 and saved == ["module." + name for name in names]
    assert sum("basic_module." in name for name in names) == 42  # upstream's inner name, which a replace rewrites


def test_strict_false_loads_nothing_and_warns_nothing(x):
    model = case.build_model(x)
    before = {name: p.clone() for name, p in model.named_parameters()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = model.load_state_dict(x.checkpoint["model_state_dict"], strict=False)
    assert not caught
    assert (len(result.missing_keys), len(result.unexpected_keys)) == (44, 44)
    assert all(p.equal(before[name]) for name, p in model.named_parameters())


def test_a_replace_rewrites_the_inner_basic_module_and_only_final_conv_survives(x):
    replaced = {k.replace("module.", "") for k in x.checkpoint["model_state_dict"]}
    names = set(case.build_model(x).state_dict())
    assert replaced & names == {"final_conv.weight", "final_conv.bias"}
    assert "encoders.0.basic_SingleConv1.groupnorm.weight" in replaced


def test_the_fix_leaves_the_callers_checkpoint_keys_and_metadata(x):
    saved = x.checkpoint["model_state_dict"]
    keys, metadata = list(saved), dict(saved._metadata)
    plain = case.unwrapped(saved)
    assert list(saved) == keys and dict(saved._metadata) == metadata
    assert list(plain) == [key.removeprefix("module.") for key in keys]
    assert all(plain[key.removeprefix("module.")] is saved[key] for key in keys)  # the same tensors, not copies
    assert "module" not in plain._metadata and "encoders.0" in plain._metadata
