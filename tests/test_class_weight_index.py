"""class_weight_index beyond the harness phases: that the code run is mmsegmentation's own, what
avg_non_ignore=False means, what the threads' workarounds give, and the fix's speed against upstream."""

import contextlib
import inspect
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode

from cases import class_weight_index as case
from harness.cases import CASE_CONFIG_DIR, ROOT
from harness.measure.timing import estimate_ratio, paired_samples
from tests.conftest import compose_config, requires_cuda

SMALL = {"batch": 2, "height": 48, "width": 64, "image_height": 36}


def config(**loss):
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "class_weight_index.yaml")
    cfg.sizes = SMALL
    cfg.loss = {**cfg.loss, **loss}
    return cfg


@pytest.fixture(scope="module")
def x():
    return case.make_inputs(config(), "cpu")


def weighted_nll_sum(x, label, ignore_index):
    """sum over labelled pixels of w[y] * -log p(y), the numerator every variant shares."""
    return F.cross_entropy(x.pred, label, weight=x.class_weight, ignore_index=ignore_index, reduction="sum")


def loss_for(x, avg_non_ignore, criterion=None):
    config_dict = OmegaConf.to_container(config(avg_non_ignore=avg_non_ignore).loss)
    with contextlib.nullcontext() if avg_non_ignore else pytest.warns(UserWarning, match="avg_non_ignore"):  # mmseg warns for False
        return case.build_loss(config_dict, criterion)


# -- the code run is upstream's --------------------------------------------------------------


def test_the_loss_is_mmsegmentation_1_2_2s_own_class_built_by_its_registry(x):
    import mmseg

    module = case.upstream()
    assert metadata.version("mmsegmentation") == "1.2.2"
    assert Path(module.__file__) == Path(mmseg.__file__).parent / "models" / "losses" / "cross_entropy_loss.py"
    assert type(x.loss) is module.CrossEntropyLoss and module.MODELS.get("CrossEntropyLoss") is module.CrossEntropyLoss
    assert x.loss.cls_criterion is module.cross_entropy
    assert not hasattr(sys.modules["mmseg.models"], "EncoderDecoder")  # mmseg.models' __init__ did not run


def test_the_crash_comes_from_the_upstream_class_weight_lookup(x):
    with pytest.raises(IndexError, match=case.symptoms["cpu"].message) as raised:
        case.buggy(x)
    innermost = raised.traceback[-1]
    assert Path(str(innermost.path)) == Path(case.upstream().__file__)
    assert "class_weight[cls]" in str(innermost.statement)


def test_upstream_crashes_with_the_configs_own_avg_non_ignore_false_too(x):
    with pytest.raises(IndexError, match=case.symptoms["cpu"].message):
        loss_for(x, avg_non_ignore=False)(x.pred, x.label, ignore_index=255)


# -- the fix ---------------------------------------------------------------------------------


@pytest.mark.parametrize("avg_non_ignore", [True, False])
def test_on_labels_without_255_the_fix_equals_upstream(x, avg_non_ignore):
    valid = x.label.clamp(max=len(x.class_weight) - 1)
    upstream = loss_for(x, avg_non_ignore)(x.pred, valid, ignore_index=255)
    fixed = loss_for(x, avg_non_ignore, case.fixed_cross_entropy)(x.pred, valid, ignore_index=255)
    torch.testing.assert_close(fixed, upstream, atol=1e-6, rtol=1e-5)


def test_avg_non_ignore_true_is_pytorchs_weighted_mean(x):
    expected = x.loss_weight * F.cross_entropy(x.pred, x.label, weight=x.class_weight, ignore_index=255)
    torch.testing.assert_close(case.fixed(x), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("avg_non_ignore", [True, False])
def test_the_fix_equals_the_float64_reference_on_either_path(x, avg_non_ignore):
    got = loss_for(x, avg_non_ignore, case.fixed_cross_entropy)(x.pred, x.label, ignore_index=255)
    want = x.loss_weight * case.weighted_mean_nll(x.pred, x.label, x.class_weight, 255, avg_non_ignore)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_the_reference_is_not_the_fused_call_but_agrees_with_it(x):
    assert "cross_entropy" not in inspect.getsource(case.reference) + inspect.getsource(case.weighted_mean_nll)
    fused = x.loss_weight * F.cross_entropy(x.pred.double(), x.label, weight=x.class_weight.double(), ignore_index=255)
    torch.testing.assert_close(case.reference(x), fused.float())


def test_with_a_per_pixel_weight_the_fix_keeps_upstreams_path_and_the_masked_denominator(x):
    pixel_weight = torch.rand(x.label.shape, generator=torch.Generator().manual_seed(1))
    got = case.fixed_cross_entropy(x.pred, x.label, weight=pixel_weight, class_weight=x.class_weight, ignore_index=255, avg_non_ignore=True)
    labelled = x.label != 255
    target = torch.where(labelled, x.label, 0)
    nll = -torch.log_softmax(x.pred.double(), 1).gather(1, target.unsqueeze(1)).squeeze(1)
    class_weights = x.class_weight.double()[target] * labelled
    want = (pixel_weight.double() * class_weights * nll).sum() / class_weights.sum()
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_the_fused_path_is_taken_exactly_where_it_equals_upstreams_mean(x, monkeypatch):
    upstream_calls = []
    original = case.upstream().cross_entropy
    monkeypatch.setattr(case.upstream(), "cross_entropy", lambda *args: upstream_calls.append(args) or original(*args))
    common = dict(class_weight=x.class_weight, ignore_index=255)
    case.fixed_cross_entropy(x.pred, x.label, avg_non_ignore=True, **common)
    assert upstream_calls == []
    for variant in (dict(avg_non_ignore=False), dict(avg_non_ignore=True, avg_factor=10.0), dict(avg_non_ignore=True, reduction="sum")):
        case.fixed_cross_entropy(x.pred, x.label, **common, **variant)
    assert len(upstream_calls) == 3


@pytest.mark.parametrize("name", sorted(case.slow_fixes))
def test_every_slow_fix_is_correct(x, name):
    torch.testing.assert_close(case.slow_fixes[name](x), case.reference(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(case.slow_fixes))
def test_every_slow_control_keeps_its_extra_work_out_of_dynamos_graphs(x, name):
    """What makes a control slow must survive compilation: inductor fused the old controls (the unfused path, the
    class loop's sums) to 0.56-1.47x of the fused baseline. A boolean index has a size only the host knows, so dynamo
    breaks the graph there (a class loop's frame then runs eager whole: no graph at all)."""
    from harness.compiled import graph_report

    report = graph_report(case.slow_fixes[name], x)
    assert report["graph_breaks"] != 0, report
    assert all("dynamic shape operator" in reason.lower() for reason in report["break_reasons"]), report
    assert graph_report(case.speed_baseline, x) == {"graphs": 1, "graph_breaks": 0, "break_reasons": []}


def test_avg_non_ignore_false_counts_each_ignored_pixel_once(x):
    fixed = loss_for(x, avg_non_ignore=False, criterion=case.fixed_cross_entropy)(x.pred, x.label, ignore_index=255)
    labelled = x.label != 255
    denominator = x.class_weight[x.label[labelled]].sum() + (~labelled).sum()
    torch.testing.assert_close(fixed, x.loss_weight * weighted_nll_sum(x, x.label, 255) / denominator)


def test_avg_non_ignore_false_with_unit_weights_is_upstreams_unweighted_mean(x):
    """Upstream's class_weight=None branch divides by label.numel(): the fixed False must agree with it."""
    ones = torch.ones_like(x.class_weight)
    fixed = case.fixed_cross_entropy(x.pred, x.label, class_weight=ones, ignore_index=255, avg_non_ignore=False)
    unweighted = case.upstream().cross_entropy(x.pred, x.label, class_weight=None, ignore_index=255, avg_non_ignore=False)
    torch.testing.assert_close(fixed, unweighted)


def test_avg_non_ignore_false_without_ignored_pixels_equals_true(x):
    valid = x.label.clamp(max=len(x.class_weight) - 1)
    false = case.fixed_cross_entropy(x.pred, valid, class_weight=x.class_weight, ignore_index=255, avg_non_ignore=False)
    true = case.fixed_cross_entropy(x.pred, valid, class_weight=x.class_weight, ignore_index=255, avg_non_ignore=True)
    torch.testing.assert_close(false, true)


class CountTorchCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def torch_calls(function, *args, **kwargs):
    with CountTorchCalls() as counter:
        function(*args, **kwargs)
    return counter.calls


def test_the_fix_has_no_python_loop_over_the_batch():
    one, eight = (case.make_inputs(OmegaConf.merge(config(), {"sizes": {"batch": batch}}), "cpu") for batch in (1, 8))
    valid = [inputs.label.clamp(max=len(inputs.class_weight) - 1) for inputs in (one, eight)]
    assert torch_calls(case.fixed, one) == torch_calls(case.fixed, eight)
    upstream = [torch_calls(inputs.loss, inputs.pred, label, ignore_index=255) for inputs, label in zip((one, eight), valid)]
    assert upstream[1] - upstream[0] >= 7  # upstream indexes the weights once per image


# -- the threads' workarounds ----------------------------------------------------------------


def test_commenting_out_the_branch_divides_by_every_pixel(x):
    got = case.comment_out_class_weight_branch(x)
    torch.testing.assert_close(got, x.loss_weight * weighted_nll_sum(x, x.label, 255) / x.label.numel())
    relative_error = float((got - case.reference(x)).abs() / case.reference(x))
    print(f"\ncomment_out_class_weight_branch: relative error {relative_error:.3f} at {SMALL}")
    assert relative_error > 0.1


def test_pad_with_minus_one_as_in_3864_crashes_on_cityscapes_void_labels(x):
    with pytest.raises(IndexError, match="Target 255 is out of bounds"):
        case.pad_with_minus_one(x)


def test_pad_with_minus_one_everywhere_gives_the_right_value_only_for_avg_non_ignore_true(x):
    """With void remapped to -1 too: class_weight[-1] is the last class's weight, which True then zeroes."""
    minus_one = torch.where(x.label == 255, -1, x.label)
    torch.testing.assert_close(x.loss(x.pred, minus_one, ignore_index=-1), case.reference(x), atol=1e-6, rtol=1e-5)

    workaround = loss_for(x, avg_non_ignore=False)(x.pred, minus_one, ignore_index=-1)
    labelled = x.label != 255
    last_class_per_ignored = x.class_weight[x.label[labelled]].sum() + (~labelled).sum() * x.class_weight[-1]
    torch.testing.assert_close(workaround, x.loss_weight * weighted_nll_sum(x, x.label, 255) / last_class_per_ignored)
    fixed = loss_for(x, avg_non_ignore=False, criterion=case.fixed_cross_entropy)(x.pred, x.label, ignore_index=255)
    assert not torch.isclose(workaround, fixed, atol=0, rtol=1e-4)


# -- degrading without mmsegmentation --------------------------------------------------------


@pytest.mark.untimed
@pytest.mark.slow  # a harness run in a copy without mmsegmentation: 7 s
def test_without_mmsegmentation_the_harness_reports_every_phase_as_an_error(tmp_path):
    """A stand-in `mmseg` that fails to import shadows the real one in every process the harness starts."""
    stand_in = tmp_path / "path" / "mmseg"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text('raise ImportError("simulated: mmsegmentation is not installed")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stand_in.parent), str(ROOT)])}
    command = [sys.executable, "-m", "harness", "case=class_weight_index", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    record = json.loads((tmp_path / "run" / "class_weight_index.cpu.json").read_text())
    also = OmegaConf.load(CASE_CONFIG_DIR / "class_weight_index.yaml").speed.also
    memory = 1 + len(getattr(case, "memory_fixes", {}))  # the memory phase (figures only here) and its controls
    assert len(record["phases"]) == 4 + len(also) + len(case.slow_fixes) + len(case.bad_fixes) + memory
    for phase in record["phases"]:
        assert (phase["status"], phase["ok"]) == ("error", False), phase
        assert "mmsegmentation==1.2.2" in phase["message"] and "simulated" in phase["message"], phase["message"]


# -- speed against upstream, and CUDA ---------------------------------------------------------


def test_fixed_speed_against_upstream_on_valid_labels(benchmark):
    """Where upstream does not crash (no 255), what the fix costs against it: a ratio, never a timing assertion."""
    cfg = OmegaConf.load(CASE_CONFIG_DIR / "class_weight_index.yaml")
    inputs = case.make_inputs(cfg, "cpu")
    inputs = inputs._replace(label=inputs.label.clamp(max=len(inputs.class_weight) - 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = paired_samples(case.fixed, case.buggy, inputs, device="cpu", warmup=1, pairs=7)
        benchmark.pedantic(case.fixed, args=(inputs,), rounds=5, iterations=1, warmup_rounds=1)
    finally:
        torch.set_num_threads(threads)
    estimate = estimate_ratio([samples], level=0.95)
    fixed_s, upstream_s, ratio = estimate.candidate_s, estimate.baseline_s, estimate.ratio
    benchmark.extra_info.update(fixed_s=fixed_s, upstream_s=upstream_s, ratio_fixed_over_upstream=ratio)
    print(f"\nfixed {fixed_s * 1e3:.1f} ms vs upstream {upstream_s * 1e3:.1f} ms on labels without 255: {ratio:.3f}x")
    assert ratio > 0


@requires_cuda
@pytest.mark.cuda
def test_on_cuda_the_lookup_fires_a_device_side_assert():
    from harness.phases import reproduce
    from harness.run import make_spec

    spec = make_spec(compose_config("case=class_weight_index", "device=cuda"), "cuda")  # the run's own spec: its GPU limits too
    record = reproduce(case, spec)
    assert (record.status, record.ok) == ("reproduced", True), record.message
    assert "index out of bounds" in record.figures["output_line"]
