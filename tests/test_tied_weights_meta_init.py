"""tied_weights_meta_init beyond the harness phases: where the tie is lost (`to_empty`, not the init nor the
optimizer), what the buggy run counts, and how each wrong fix is wrong."""

import pytest
import torch
from omegaconf import OmegaConf

from cases import tied_weights_meta_init as case
from harness.cases import CASE_CONFIG_DIR
from harness.measure.compare import compare
from tests.fixes.alternatives.tied_weights_meta_init import tied_groups
from tests.fixes.alternatives.tied_weights_meta_init import tied_weights_meta_init as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "tied_weights_meta_init.yaml")
TOLERANCE = dict(CFG.tolerance)


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


def test_to_empty_makes_two_parameters_of_the_tied_one(x):
    model = case.on_meta(x)
    assert model.output.weight is model.tok_embeddings.weight and len(list(model.parameters())) == 24
    model.to_empty(device="cpu")
    assert model.output.weight is not model.tok_embeddings.weight and len(list(model.parameters())) == 25
    state = model.state_dict()
    assert state["output.weight"].data_ptr() != state["tok_embeddings.weight"].data_ptr()  # two tensors in a checkpoint


def test_a_tie_made_on_the_cpu_survives_a_conversion(x):
    """The contrast: `.to()` between compatible tensor types sets `.data` in place and keeps the one Parameter."""
    with torch.device("cpu"):
        model = case.Transformer(x.args)
    case.tie(model)
    model.to(torch.float64)
    assert model.output.weight is model.tok_embeddings.weight


def test_the_buggy_run_counts_one_matrix_more(x, want):
    got = case.buggy(x)
    assert (int(got["distinct_parameters"]), int(want["distinct_parameters"])) == (25, 24)
    assert int(got["parameter_elements"]) - int(want["parameter_elements"]) == x.args.vocab_size * x.args.dim == 32768
    assert not bool(got["head_is_embedding"]) and bool(want["head_is_embedding"])
    relative = float((got["param"]["tok_embeddings.weight"] - want["param"]["tok_embeddings.weight"]).norm())
    assert relative / float(want["param"]["tok_embeddings.weight"].norm()) > 5  # measured 8.3: a normal(0, 1) draw kept
    assert not compare(got, want, **TOLERANCE)["match"]


def test_the_untied_head_is_initialised_as_the_tied_weight_and_the_embedding_is_not(x):
    """Both runs draw the same init; the tied tensor ends with the head's draw (written last), the untied embedding
    keeps its own normal(0, 1) draw."""
    untied = case.on_meta(x)
    untied.to_empty(device="cpu")
    case.initialise(untied, x)
    tied = case.on_meta(x)
    tied.to_empty(device="cpu")
    case.tie(tied)
    case.initialise(tied, x)
    assert torch.equal(untied.output.weight, tied.output.weight)
    assert not torch.allclose(untied.tok_embeddings.weight, tied.tok_embeddings.weight)
    assert untied.tok_embeddings.weight.std() > 0.9 and tied.tok_embeddings.weight.std() < 0.2


def test_retie_with_data_shares_storage_but_steps_two_parameters(x, want):
    got = case.retie_data(x)
    assert int(got["distinct_parameters"]) == 25 and not bool(got["head_is_embedding"])
    assert torch.equal(got["param"]["output.weight"], got["param"]["tok_embeddings.weight"])  # one storage
    result = compare(got, want, **TOLERANCE)
    assert not result["match"] and result["tolerance_excess"] > 10  # measured 34x


def test_copying_the_values_after_init_trains_two_tensors_apart(x, want):
    got = case.copy_values_after_init(x)
    assert not torch.allclose(got["param"]["output.weight"], got["param"]["tok_embeddings.weight"])
    result = compare(got, want, **TOLERANCE)
    assert not result["match"] and result["tolerance_excess"] > 10  # measured 66x


def test_the_fix_the_alternative_and_the_slow_control_match_the_model_built_on_the_cpu(x, want):
    assert tied_groups(case.on_meta(x)) == [["tok_embeddings.weight", "output.weight"]]
    for fix in (case.fixed, alternative, case.one_sequence_at_a_time):
        got = fix(x)
        assert compare(got, want, **TOLERANCE)["match"], fix.__name__
        assert bool(got["head_is_embedding"]) and int(got["distinct_parameters"]) == 24
