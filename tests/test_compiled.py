"""The compile axis (harness/compiled.py): the option, how compiled failures are classified, the cache, and one
case run under inductor end to end on CPU (the compiled symptom differs from eager's: that is the point)."""

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from harness import compiled as compile_axis
from harness.matrix import drifts, load_records, table
from harness.run import ConfigError, run_case, validate
from tests.conftest import compose_config

INDUCTOR_ABORT = """\
terminate called after throwing an instance of 'std::runtime_error'
terminate called recursively
  what():  kernel, /root/.cache/torch-error-cases/inductor/torch-2.13.0/qt/cqtj2clxiynftnx4axyieestw6cw27jxuk7i5lsr7hsbu3oarf2w.main.cpp:26, index out of bounds: 0 <= tmp3 < 1583L
  what():  kernel, /root/.cache/torch-error-cases/inductor/torch-2.13.0/qt/cqtj2clxiynftnx4axyieestw6cw27jxuk7i5lsr7hsbu3oarf2w.main.cpp:26, index out of bounds: 0 <= tmp3 < 1583L
Fatal Python error: Aborted
"""


@pytest.mark.parametrize("mode", ["off", "inductor", "aot_eager", False])
def test_the_known_modes_are_accepted(mode):
    assert compile_axis.problem(mode) is None


def test_an_unknown_backend_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"^compile=tensorrt: choose one of off, inductor, aot_eager"):
        validate(compose_config("case=embedding_oob", "compile=tensorrt"))


def test_the_default_is_eager_even_where_yaml_reads_off_as_false():
    assert compile_axis.mode_of(compose_config("case=embedding_oob")) == "off"
    assert compile_axis.mode_of(OmegaConf.create("compile: off")) == "off"  # YAML 1.1: a bare off is false


def test_the_native_message_of_an_abort_is_kept_verbatim_once_and_its_headline_names_the_kernel_line():
    lines = compile_axis.native_message(INDUCTOR_ABORT)
    assert lines.count(lines[2]) == 1 and "index out of bounds: 0 <= tmp3 < 1583L" in lines[2]
    assert compile_axis.native_headline(lines) == "what():  kernel, main.cpp:26, index out of bounds: 0 <= tmp3 < 1583L"


def test_compiler_errors_are_told_apart_by_module_not_by_name():
    assert compile_axis.is_compiler_error(
        ("GuardOnDataDependentSymNode", "RuntimeError"), ("torch.fx.experimental.symbolic_shapes", "builtins")
    )
    assert compile_axis.is_compiler_error(("Unsupported",), ("torch._dynamo.exc",))
    assert not compile_axis.is_compiler_error(("IndexError", "LookupError"), ("builtins", "builtins"))


def test_compiled_runs_use_the_yaml_compile_tolerance_and_eager_ones_do_not():
    case_cfg = compose_config("case=class_weight_index").case
    assert compile_axis.case_config(case_cfg, "inductor").tolerance == case_cfg.compile_tolerance
    assert compile_axis.case_config(case_cfg, "off").tolerance == case_cfg.tolerance
    assert compile_axis.case_config(case_cfg, "off").compile == "off"


def test_a_compiled_grade_uses_the_yaml_compile_grade_budget():
    from harness.grading.grade import graded_config
    from harness.process.submitted import Submission

    case_cfg = compose_config("case=target_out_of_bounds").case
    submitted = Submission("/tmp/fix.py", "fix", "0" * 64)
    assert graded_config(compile_axis.case_config(case_cfg, "inductor"), submitted).speed.budget == case_cfg.speed.compile_grade_budget
    assert graded_config(compile_axis.case_config(case_cfg, "off"), submitted).speed.budget == case_cfg.speed.grade_budget
    assert compile_axis.case_config(case_cfg, "inductor").speed.budget == case_cfg.speed.budget  # the case's own run keeps its budget


def test_compiled_children_generate_kernels_for_the_speed_phase_s_threads():
    case_cfg = compose_config("case=codebook_oob").case
    assert compile_axis.case_config(case_cfg, "inductor", 1).kernel_threads == 1
    assert "kernel_threads" not in compile_axis.case_config(case_cfg, "off", 1)
    assert "kernel_threads" not in compile_axis.as_users_run_it(compile_axis.case_config(case_cfg, "inductor", 1))  # reproduce


@pytest.mark.untimed
@pytest.mark.slow  # two cold inductor compiles (30-38 s); the config it relies on is checked above, fast
def test_a_kernel_compiled_at_one_torch_thread_count_serves_another_once_kernel_threads_are_set(tmp_path):
    # A phase's child runs torch at the machine's threads, a timing child at speed.cpu_threads: with the count
    # left to torch, the timing child missed every kernel the fix phase had compiled (a grade's SNAC decoder: twice cold).
    from harness.process.isolate import run_isolated
    from tests.compiled_children import compiled_at

    def counts(threads: int, folder: str, kernel_threads: int | None) -> dict:
        result = run_isolated(compiled_at, threads, str(tmp_path / folder), kernel_threads, timeout_s=300)
        assert result.status == "returned", result.output[-3000:]
        return result.value

    assert counts(2, "left_to_torch", None) == {"fxgraph_cache_miss": 1}
    assert counts(1, "left_to_torch", None) == {"fxgraph_cache_miss": 1}  # what the pinning is for
    assert counts(2, "pinned", 1) == {"fxgraph_cache_miss": 1}
    assert counts(1, "pinned", 1) == {"fxgraph_cache_hit": 1}


def test_a_yaml_cuda_tolerance_widens_the_tolerance_on_cuda_alone():
    from harness.run import on_device

    case_cfg = compose_config("case=backward_twice").case
    assert on_device(case_cfg, "cpu").tolerance == case_cfg.tolerance
    on_cuda = on_device(case_cfg, "cuda").tolerance
    assert (on_cuda.atol, on_cuda.rtol) == (
        max(case_cfg.tolerance.atol, case_cfg.cuda_tolerance.atol),
        max(case_cfg.tolerance.rtol, case_cfg.cuda_tolerance.rtol),
    )
    compiled = compose_config("case=class_weight_index").case  # no cuda_tolerance: compiled keeps its compile_tolerance
    assert on_device(compile_axis.case_config(compiled, "inductor"), "cuda").tolerance == compiled.compile_tolerance


def test_the_cache_is_the_harness_own_per_torch_version_unless_the_user_chose_one(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert compile_axis.cache_dir(private=False) == compile_axis.CACHE_ROOT / f"torch-{torch.__version__.split('+')[0]}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert compile_axis.cache_dir(private=False) == tmp_path
    monkeypatch.setenv("TMPDIR", str(tmp_path / "scratch"))  # where a graded child's private folder goes (never /tmp here)
    (tmp_path / "scratch").mkdir()
    private = compile_axis.cache_dir(private=True)
    assert private != tmp_path and private.parent == tmp_path / "scratch"  # a graded child never shares a cache


@pytest.fixture(scope="module")
def compiled_embedding(environment, tmp_path_factory):
    cfg = compose_config("case=embedding_oob", "device=cpu", "compile=inductor", "phases=[reproduce,fix,correct,bad_fixes]")
    return run_case(cfg, "cpu", tmp_path_factory.mktemp("compiled"), environment)


@pytest.mark.untimed
@pytest.mark.slow  # compiles embedding_oob's functions with a cold kernel cache: 25 to 60 s, shared by the two tests that read it
def test_the_compiled_lookup_fails_differently_from_eager_and_the_record_says_how(compiled_embedding):
    record, path = compiled_embedding
    assert path.name == "embedding_oob.cpu.inductor.json" and json.loads(path.read_text())["compile"] == "inductor"
    reproduce = record.phases[0]
    assert reproduce.ok and reproduce.status in ("aborted", "raised", "silent"), reproduce.message
    assert reproduce.figures["same_as_eager"] is False, reproduce.message  # eager raises IndexError at the lookup
    if reproduce.status == "aborted":
        assert reproduce.figures["signal"] == "SIGABRT" and any(
            "index out of bounds" in line for line in reproduce.figures["native_message"]
        )
    if torch.get_num_threads() > 1:  # a user's process: the kernel's bounds check throws in a parallel region and aborts
        assert reproduce.status == "aborted", f"{reproduce.status}: reproduce compiled for one thread (kernel_threads), not as users run it"


@pytest.mark.untimed
@pytest.mark.slow  # compiles embedding_oob's functions with a cold kernel cache: 25 to 60 s, shared by the two tests that read it
def test_the_fix_compiles_as_one_graph_and_matches_the_eager_reference(compiled_embedding):
    record, _ = compiled_embedding
    fix, correct = record.phases[1], record.phases[2]
    assert fix.status == "passed" and fix.figures["fullgraph"] is True and fix.figures["compile_s"] > 0, fix.message
    assert correct.status == "passed", correct.message
    assert all(phase.status == "rejected" for phase in record.phases if phase.phase.startswith("bad_fix:"))


def test_the_matrix_keeps_eager_and_compiled_records_apart(tmp_path):
    for mode, status in (("off", "reproduced"), ("inductor", "aborted")):
        record = {
            "case": "embedding_oob",
            "device": "cpu",
            "compile": mode,
            "environment": {"torch": "2.13.0"},
            "phases": [{"phase": "reproduce", "status": status, "message": status, "figures": {}}],
        }
        (tmp_path / f"embedding_oob.cpu.{mode}.json").write_text(json.dumps(record))
    records = load_records(tmp_path)
    expectations = {
        "embedding_oob": [
            {"torch": ">=2.3", "devices": ["cpu"], "reproduce": "reproduced"},
            {"torch": ">=2.3", "devices": ["cpu"], "compile": ["inductor"], "reproduce": "aborted"},
        ]
    }
    assert drifts(records, expectations) == []
    assert drifts(records, {"embedding_oob": expectations["embedding_oob"][:1]}) == [
        "embedding_oob torch 2.13.0 cpu inductor: no expectation covers this record ("
        + str(tmp_path / "embedding_oob.cpu.inductor.json")
        + ")"
    ]
    rows = [line for line in table(records).splitlines() if line.startswith("| `embedding_oob`")]
    assert rows == ["| `embedding_oob` | eager | reproduced |", "| `embedding_oob` | inductor | aborted |"]


@pytest.mark.parametrize(
    "arguments, compiles",
    [
        (["case=embedding_oob", "compile=inductor"], True),
        (["-m", "case=glob(*)", "compile=off,inductor", "device=cpu"], True),
        (["case=embedding_oob", "compile=aot_eager"], True),
        (["case=embedding_oob", "compile=off"], False),
        (["case=embedding_oob"], False),
        (["case=embedding_oob", "fix=compile=inductor.py:fix"], False),
    ],
)
def test_a_command_line_that_compiles_is_told_from_one_that_does_not(arguments, compiles):
    assert compile_axis.requested(arguments) is compiles


FORK_SERVER_OF_A_COMPILED_RUN = """
import sys
from harness.cases import fork_server_modules
from harness.process.fork_server import start_fork_server
from harness.process.isolate import run_isolated

def state():
    import torch._dynamo.utils
    isa = sys.modules.get("torch._inductor.cpu_vec_isa") or sys.modules.get("torch._inductor.codecache")
    return (
        [name for name in ("torch._inductor.compile_fx", "torch._inductor.lowering") if name in sys.modules],
        isa.valid_vec_isa_list.cache_info().currsize if isa else 0,
        dict(torch._dynamo.utils.counters["stats"]),
    )

if __name__ == "__main__":
    start_fork_server(fork_server_modules(compiling=sys.argv[1] == "compiled"))
    print(repr(run_isolated(state, timeout_s=120).value))
"""


COMPILED_RUN = pytest.param("compiled", marks=[pytest.mark.slow, pytest.mark.untimed])  # imports inductor cold (5-14 s), times nothing


@pytest.mark.parametrize("run", [COMPILED_RUN, "eager"])
def test_the_fork_server_of_a_compiled_run_holds_the_compiler_imported_and_probed_but_nothing_compiled(run, tmp_path):
    import ast
    import os
    import subprocess
    import sys

    script = tmp_path / "server.py"
    script.write_text(FORK_SERVER_OF_A_COMPILED_RUN)
    root = compile_axis.Path(__file__).parents[1]
    done = subprocess.run(  # PYTHONPATH: this checkout's harness, not the one an editable install points to
        [sys.executable, str(script), run],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))},
    )
    modules, probed, stats = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    if run == "compiled":
        assert (modules, probed > 0) == (["torch._inductor.compile_fx", "torch._inductor.lowering"], True), done.stderr[-2000:]
    else:
        assert (modules, probed) == ([], 0), done.stderr[-2000:]
    assert not stats.get("unique_graphs"), stats  # the children compile; the fork server never does


@pytest.mark.untimed
@pytest.mark.slow  # a compiled run from the command line: 12 to 30 s
def test_a_compiled_run_leaves_no_semaphore_for_the_resource_tracker_to_report(tmp_path):
    # Inductor's progress bar made tqdm create a multiprocessing lock in every compiled child, which ends with
    # os._exit: the harness's exit printed "There appear to be N leaked semaphore objects to clean up at shutdown".
    import subprocess
    import sys

    command = [
        sys.executable,
        "-m",
        "harness",
        "case=autocast_device",
        "compile=inductor",
        "device=cpu",
        "phases=[fix]",
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=compile_axis.Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaked semaphore" not in done.stderr, done.stderr[-2000:]


def test_torch_s_default_folder_is_not_taken_for_the_user_s_choice_wherever_tmp_is(monkeypatch, tmp_path):
    # A graded child's TMPDIR is its scratch folder: torch's default, set under /tmp by an earlier process, must
    # still read as torch's default there (a launcher's ranks wrote /tmp/torchinductor_<user> and were refused).
    import getpass
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # tempfile keeps the folder it found first
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", f"/tmp/torchinductor_{getpass.getuser()}")
    assert compile_axis.cache_dir(private=False) == compile_axis.CACHE_ROOT / f"torch-{torch.__version__.split('+')[0]}"


def test_the_ranks_a_graded_child_starts_compile_in_its_private_folder(tmp_path):
    # Their precompiled header too, where this torch makes one: torch's own folder for it is shared by every process.
    import torch._inductor.config as inductor_config

    from harness.process.isolate import run_isolated
    from tests.compiled_children import prepared_in_a_rank_of_a_graded_child

    result = run_isolated(prepared_in_a_rank_of_a_graded_child, str(tmp_path), timeout_s=120)
    assert result.status == "returned", result.output[-3000:]
    graded, rank, headers = result.value
    assert graded == rank and graded.startswith(str(tmp_path)), result.summary
    if getattr(inductor_config, "cpp_cache_precompile_headers", False):
        assert headers == str(Path(graded) / "precompiled_headers"), headers
    else:
        assert not headers, headers
