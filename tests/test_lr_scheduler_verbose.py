"""lr_scheduler_verbose beyond the harness phases: which symptom each torch release is judged by, that the
reference's written-out rule is torch's ReduceLROnPlateau, and how each wrong fix is wrong."""

import inspect
import re

import pytest
import torch
from omegaconf import OmegaConf
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.torch_version import TorchVersion

from cases import lr_scheduler_verbose as case
from harness.cases import CASE_CONFIG_DIR, Symptom, Warns, case_text, symptom_on
from tests.fixes.alternatives.lr_scheduler_verbose import accepted_keywords
from tests.fixes.alternatives.lr_scheduler_verbose import lr_scheduler_verbose as alternative

CFG = OmegaConf.load(CASE_CONFIG_DIR / "lr_scheduler_verbose.yaml")
REMOVED = TorchVersion(torch.__version__) >= "2.7"


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(CFG, "cpu")


@pytest.fixture(scope="module")
def want(x):
    return case.reference(x)


@pytest.mark.parametrize(
    ("version", "kind"),
    [
        ("2.3.1", Warns),  # deprecated in 2.2 (pytorch #111302)
        ("2.6.0", Warns),  # measured: the UserWarning, the same schedule
        ("2.7.0", Symptom),  # removed (pytorch #147301)
        ("2.9.1", Symptom),  # measured
        ("2.13.0+cpu", Symptom),  # measured
    ],
)
def test_each_release_is_judged_by_its_own_symptom(version, kind):
    for device in ("cpu", "cuda"):
        symptom = symptom_on(case.symptoms[device], version)
        assert type(symptom) is kind and symptom.expected_on(version)
    assert not case.symptoms["cpu"].expected_on("2.1.2")  # before the deprecation it ran silently


def test_the_patterns_match_the_texts_the_docstring_quotes():
    quoted = case_text(case).sections["Symptom on CPU"]
    assert re.search(case.UNEXPECTED, quoted) and re.search(case.DEPRECATED, quoted)


def test_this_torch_has_verbose_in_the_signature_exactly_before_2_7():
    assert ("verbose" in inspect.signature(ReduceLROnPlateau.__init__).parameters) is not REMOVED


@pytest.mark.skipif(not REMOVED, reason="the TypeError is torch >= 2.7's")
def test_buggy_raises_the_quoted_error_at_construction(x):
    with pytest.raises(TypeError, match=case.UNEXPECTED):
        case.buggy(x)


def test_the_written_out_rule_is_torchs_scheduler_on_plateaus_cooldowns_and_the_floor():
    """The reference's rule against torch's ReduceLROnPlateau on series that plateau early, late, and hit min_lr."""
    generator = torch.Generator().manual_seed(1)
    for epochs, scale in ((50, 5.0), (300, 15.0), (1000, 30.0)):
        t = torch.arange(epochs, dtype=torch.float64)
        losses = tuple((0.2 + 0.8 * torch.exp(-t / scale) + 0.01 * torch.randn(epochs, generator=generator, dtype=torch.float64)).tolist())
        series = case.Inputs(None, None, None, None, losses, 3e-4, 10)
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=3e-4)
        scheduler = case.scheduler_without_verbose(optimizer, 10)
        seen = []
        for loss in losses:
            seen.append(optimizer.param_groups[0]["lr"])
            scheduler.step(loss)
        assert seen == case.plateau_lrs(series)
    assert min(seen) == 3e-6  # the longest series reaches the floor


def test_the_schedule_halves_several_times_in_200_epochs(want):
    assert sorted(set(want.lrs.tolist()), reverse=True)[:3] == [3e-4, 1.5e-4, 7.5e-5]
    assert len(set(want.lrs.tolist())) >= 5


def test_fixed_and_the_alternative_give_the_reference_bit_for_bit(x, want):
    for got in (case.fixed(x), alternative(x)):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_the_alternative_drops_verbose_only_where_the_constructor_lacks_it():
    kept = accepted_keywords(ReduceLROnPlateau, {"factor": 0.5, "verbose": True})
    assert kept == ({"factor": 0.5} if REMOVED else {"factor": 0.5, "verbose": True})


def test_except_type_error_never_decays_the_lr(x, want):
    got = case.except_type_error(x)
    if REMOVED:
        assert set(got.lrs.tolist()) == {3e-4}  # no scheduler: the LR of epoch 0 for all 200
        assert (got.lrs / want.lrs).max() >= 50  # where the reference has halved it six times
    else:
        assert torch.equal(got.lrs, want.lrs)  # nothing raised: right by luck of the version


def test_the_version_string_check_is_wrong_from_2_10():
    assert "2.13.0" < "2.7" and "2.9.1" > "2.7"  # as strings: 2.10 and later compare below 2.7
    assert TorchVersion("2.13.0") > "2.7"  # as versions they do not


@pytest.mark.skipif(not REMOVED, reason="the pin and verbose=False only fail where verbose is gone")
def test_the_pin_and_verbose_false_raise_on_this_torch(x):
    with pytest.raises(RuntimeError, match="needs torch<2.7"):
        case.pin_torch_below_2_7(x)
    with pytest.raises(TypeError, match=case.UNEXPECTED):
        case.verbose_false(x)


def test_the_slow_control_is_correct(x, want):
    assert all(torch.equal(a, b) for a, b in zip(case.replay_every_epoch(x), want))
