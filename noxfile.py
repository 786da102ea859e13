r"""The regression matrix: the whole harness under one torch release per session, each in its own venv.

    nox -s matrix                                # every version in TORCH_VERSIONS, then `latest`, one after another
    nox -s "matrix(torch='2.4.1')"               # one version
    nox -s "matrix(torch='latest')"              # the newest torch release on pip's configured index, resolved now
    nox -s "matrix(torch='1.13.1')"              # an older release a case names for itself (its yaml's `extra_torch`): that case alone
    nox -s nightly                               # opt-in: PyTorch's nightly CPU build; a failed install skips it
    nox -R -s "matrix(torch='2.4.1')"            # rerun in the existing venv, skipping the install
    nox -s "matrix(torch='2.4.1')" -- phases=[reproduce]   # extra Hydra overrides for the harness
    nox -l                                       # the sessions

Each session installs `torch==<v>` together with the project (one pip call, so pip keeps that torch),
checks that the torch it got is <v>, then writes
    results/matrix/cpu/torch-<v>/<case>/<case>.cpu.json   one harness record per case, eager (a mode's records are replaced)
    results/matrix/cpu/torch-<v>/inductor/<case>/<case>.cpu.inductor.json   the same under torch.compile (COMPILE_MODES)
    results/matrix/cpu/torch-<v>/harness.log              the harness's console output (not committed; inductor/harness.log)
    results/matrix/cpu/torch-<v>/session.json             the entry (<v>, latest or nightly), install time, venv size,
                                                          run times, exit codes, phases not ok
    results/benchmarks/<machine-id>/NNNN_torch-<v>.json   pytest-benchmark's save (the previous save of <v> is replaced)
Compare a later run with one of them:
    pytest tests/test_benchmarks.py tests/test_class_weight_index.py --benchmark-only \
        --benchmark-storage=file://results/benchmarks --benchmark-compare='*_torch-2.4.1' --benchmark-compare-fail=median:15%

A case may name releases of its own beyond TORCH_VERSIONS (`extra_torch` in its yaml: zero_grad_set_to_none's
boundary is torch 2.0, so it names 1.13.1 and 2.0.1). Their sessions run those cases only, eager where the torch cannot
compile on this Python (torch.compile is from 2.0, and 2.0's dynamo refuses Python 3.11), and skip the benchmarks
(they time every case). The project asks for torch>=2.3, so they install the project's other requirements beside the
old torch and the project itself without its dependencies; torch before 2.3 was built against numpy 1.

The moving entries resolve <v> when they run: `latest` asks pip (`pip index versions torch`, through pip's
own configuration of indexes) for the newest release; `nightly` installs the newest pre-release from
NIGHTLY_INDEX and takes <v> from the torch it got (e.g. 2.17.0.dev20260301). Their records go into the same
layout, named by that version (a `latest` that resolves to a pinned version replaces that version's records),
and session.json says which entry asked. Where $GITHUB_OUTPUT is set (a workflow step), the session also
writes `torch=<v>` and `records=<folder>` there, or, for a nightly that did not install, `install_error=<line>`.

A harness exit of 1 (some phase missed its expectation: a case that does not reproduce on an old torch)
is a result, and so is a failing benchmark test (pytest exit 1): the session passes. It fails when the
harness itself broke: an exit other than 0 or 1 (2 bad command line, 3 no device, a signal), a Python
traceback in its output, or a case under conf/case/ left without a finished record; and when pytest
could not run (exit 2 and up).

The venvs live outside the repository, in ~/.cache/torch-error-cases/nox (a CUDA build of torch makes
a venv of about 5 GB, so the matrix needs about 30 GB; a Docker build context or a copy of the tree
should not carry them). `--envdir .nox` keeps them in the repository instead (.nox/ is ignored by git).
Sessions reuse their venv by default (`reuse_venv=True`; pip then finds everything installed and
returns quickly); `-R` also skips the install, `--reuse-venv=never` starts from a fresh venv.
pip runs without its cache (six CUDA builds in the cache would be another 20 GB or so), so a fresh
venv downloads torch again. The measured costs are in docs/matrix_cost.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nox
from packaging.version import Version

# From the oldest release the harness supports (pyproject: torch>=2.3) to the newest on the registry.
TORCH_VERSIONS = ["2.3.1", "2.4.1", "2.6.0", "2.9.1", "2.11.0", "2.13.0", "2.15.0"]
# Releases cases name for themselves beyond TORCH_VERSIONS (`extra_torch: ["1.13.1", ...]` in conf/case/<case>.yaml).
EXTRA_TORCH_KEY = re.compile(r"^extra_torch:\s*\[([^\]]*)\]", re.MULTILINE)
LATEST = "latest"  # a moving entry: the newest release on the index when the session runs
NIGHTLY_INDEX = "https://download.pytorch.org/whl/nightly/cpu"  # PyTorch's own index of nightly pre-releases
DEVICE = "cpu"
# The compile axis (harness/compiled.py): eager records in <case>/, compiled ones in <mode>/<case>/.
# MATRIX_COMPILE=inductor runs one mode only; MATRIX_BENCHMARKS=0 skips the benchmarks (a re-run of one mode).
COMPILE_MODES = [mode for mode in os.environ.get("MATRIX_COMPILE", "off,inductor").split(",") if mode]
MATRIX_SPEED_MAX_S = (
    60  # the matrix's records must decide (at most 2% inconclusive): a speed verdict straddling its budget measures up to 60 s, not 20
)
# MATRIX_CASES=a,b runs those cases only (new cases joining a matrix already run); every other case's records stay.
MATRIX_CASES = [case for case in os.environ.get("MATRIX_CASES", "").split(",") if case]

ROOT = Path(__file__).resolve().parent
RESULTS = Path("results")  # relative to ROOT, where nox runs sessions: the records' argv stays short
BENCHMARKS = RESULTS / "benchmarks"
BENCHMARK_TESTS = ["tests/test_benchmarks.py", "tests/test_class_weight_index.py"]
HARNESS_CRASH_MARKERS = ("Traceback (most recent call last)", "Error executing job with overrides")

nox.options.envdir = str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch-error-cases" / "nox")
nox.options.sessions = ["matrix"]


def _cases_naming(version: str | None = None) -> dict[str, list[str]]:
    """{release: the cases whose yaml names it in `extra_torch`}, the releases not already in TORCH_VERSIONS."""
    named: dict[str, list[str]] = {}
    for path in sorted((ROOT / "conf" / "case").glob("*.yaml")):
        found = EXTRA_TORCH_KEY.search(path.read_text())
        for release in re.findall(r"[\w.+]+", found.group(1)) if found else []:
            if release not in TORCH_VERSIONS:
                named.setdefault(release, []).append(path.stem)
    return dict(sorted(named.items(), key=lambda item: Version(item[0])))


EXTRA_TORCH = list(_cases_naming())  # each a session of its own: matrix(torch='1.13.1')


@nox.session(reuse_venv=True)
@nox.parametrize("torch", [*TORCH_VERSIONS, *EXTRA_TORCH, LATEST])
def matrix(session: nox.Session, torch: str) -> None:
    """Run every case on CPU and the benchmarks under one torch release (or the newest: latest), in its own venv;
    under a release a case names for itself (EXTRA_TORCH), that case alone."""
    if torch in EXTRA_TORCH:
        _extra_release(session, torch)
        return
    version = _newest_release(session) if torch == LATEST else torch
    started = time.perf_counter()
    session.install("--no-cache-dir", f"torch=={version}", "-e", ".[test]")
    _run_matrix(session, entry=torch, version=version, install_s=time.perf_counter() - started)


def _extra_release(session: nox.Session, version: str) -> None:
    """The cases naming `version` in their yaml, under it: the project's requirements but torch, beside that torch."""
    import tomllib

    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    others = [requirement for requirement in requirements if not re.match(r"torch\b", requirement)]
    numpy = ["numpy<2"] if Version(version) < Version("2.3") else []  # built against numpy 1
    started = time.perf_counter()
    session.install("--no-cache-dir", f"torch=={version}", *others, *numpy)
    session.install("--no-cache-dir", "--no-deps", "-e", ".")
    cases = [case for case in _cases_naming()[version] if not MATRIX_CASES or case in MATRIX_CASES]
    modes = [mode for mode in COMPILE_MODES if mode == "off" or _can_compile(version)]
    _run_matrix(
        session, entry=version, version=version, install_s=time.perf_counter() - started, cases=cases, modes=modes, benchmarks=False
    )


def _can_compile(version: str) -> bool:
    """torch.compile is from 2.0, and 2.0's dynamo refuses Python 3.11 and later (it runs there from 2.1)."""
    release = Version(version)
    return release >= Version("2.1") or (release >= Version("2.0") and sys.version_info < (3, 11))


@nox.session(reuse_venv=True)
def nightly(session: nox.Session) -> None:
    """Opt-in (not in `nox -s matrix`): the same run under today's nightly CPU build from NIGHTLY_INDEX."""
    started = time.perf_counter()
    pip = [
        "python",
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--retries",
        "2",
        "--upgrade",
        "--pre",
        "torch",
        "--index-url",
        NIGHTLY_INDEX,
    ]
    code, output = _run_tee(session, pip, None)
    installed = _installed_torch(session) if code == 0 else None
    if installed is None or not Version(installed).is_prerelease:  # reported, not a failed session
        errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR")]
        reason = (
            (errors or [f"pip exit {code}"])[-1]
            if installed is None
            else f"no nightly there; pip took torch {installed} from its other sources"
        )
        _tell_workflow(install_error=reason)
        session.skip(f"nightly torch did not install from {NIGHTLY_INDEX}: {reason}")
    session.install("--no-cache-dir", "-e", ".[test]")  # keeps the nightly: a pre-release satisfies torch>=2.3
    _run_matrix(session, entry="nightly", version=Version(installed).public, install_s=time.perf_counter() - started)


def _newest_release(session: nox.Session) -> str:
    """The newest torch release (no pre-release) on the indexes pip is configured with, as pip itself lists them."""
    listing = session.run("python", "-m", "pip", "index", "versions", "torch", silent=True)
    found = re.search(r"^torch \((\S+)\)$", listing or "", re.MULTILINE)
    if not found:
        session.error(f"`pip index versions torch` named no newest torch: {(listing or '').strip()[-300:]}")
    session.log(f"latest: torch {found.group(1)} is the newest release on pip's configured index")
    return found.group(1)


def _installed_torch(session: nox.Session) -> str:
    printed = session.run("python", "-c", "import torch; print(torch.__version__)", silent=True)
    if printed is None:  # `nox --install-only`: the venv is built, and nothing runs in it
        session.skip("--install-only: the venv is ready")
    return printed.strip().splitlines()[-1]


def _run_matrix(
    session: nox.Session,
    entry: str,
    version: str,
    install_s: float,
    cases: list[str] | None = None,
    modes: list[str] | None = None,
    benchmarks: bool = True,
) -> None:
    """The harness and the benchmarks under the torch installed in the session's venv, which must be `version`:
    `cases` (MATRIX_CASES, or every case) in `modes` (COMPILE_MODES)."""
    cases = cases if cases is not None else _matrix_cases()
    modes = modes if modes is not None else COMPILE_MODES
    out = RESULTS / "matrix" / DEVICE / f"torch-{version}"
    venv = session.virtualenv
    cost: dict = {"entry": entry, "torch_requested": version, "device": DEVICE, "venv": venv.location}
    cost["venv_reused"] = bool(getattr(venv, "_reused", False))
    cost["install_s"] = round(install_s, 1)  # about 0 where -R skipped the install
    installed = _installed_torch(session)
    cost["torch_installed"] = installed
    if Version(installed).public != version:
        session.error(f"asked for torch=={version}, the venv has torch {installed}")
    cost["venv_bytes"] = _disk_usage(Path(venv.location))
    session.log(f"torch {installed} ({entry}): install {cost['install_s']} s, venv {cost['venv_bytes'] / 2**30:.2f} GiB")
    _tell_workflow(torch=version, records=str(out))

    cost["source_digest"] = _source_digest()  # the harness, cases and configs this run used (the tree may be dirty)
    cost["not_ok"], cost["harness_problems"] = [], []
    skipped = [mode for mode in COMPILE_MODES if mode not in modes]
    if skipped:
        cost["compile_skipped"] = {
            mode: f"torch {version} cannot compile on Python {sys.version_info.major}.{sys.version_info.minor}" for mode in skipped
        }
    for mode in modes:
        folder = _mode_folder(out, mode)
        for stale in [folder / case for case in cases] + [folder / "harness.log"]:  # this mode's records only
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        command = [
            "python",
            "-m",
            "harness",
            "-m",
            f"case={','.join(cases) if cases != _case_names() else 'glob(*)'}",
            f"device={DEVICE}",
            f"compile={mode}",
            f"speed.max_s={MATRIX_SPEED_MAX_S}",
        ]
        command += [f"hydra.sweep.dir={folder}", "hydra.sweep.subdir=${case.name}", *session.posargs]  # one folder per case
        started = time.perf_counter()
        code, output = _run_tee(session, command, folder / "harness.log")
        key = _key(mode)
        cost[f"harness{key}_s"] = round(time.perf_counter() - started, 1)
        cost[f"harness{key}_exit"] = code
        problems = _harness_problems(code, output, folder, mode, cases)
        cost["not_ok"] += _phases_not_ok(folder, mode, cases)
        cost["harness_problems"] += problems
        if problems:
            _write_cost(out, cost, cases, modes)
            session.error(f"the harness broke under torch {installed}, compile={mode}: " + "; ".join(problems))
    if os.environ.get("MATRIX_BENCHMARKS") == "0" or not benchmarks:
        _write_cost(out, cost, cases, modes)
        session.log(
            f"torch {installed}: "
            + ", ".join(f"compile={mode} harness exit {cost[f'harness{_key(mode)}_exit']}" for mode in modes)
            + (
                "; benchmarks skipped (MATRIX_BENCHMARKS=0)"
                if benchmarks
                else f"; benchmarks skipped (they time every case; {', '.join(cases)} ran)"
            )
        )
        return

    started, saved_after = time.perf_counter(), time.time()
    save = f"torch-{version}"
    pytest = ["python", "-m", "pytest", *BENCHMARK_TESTS, "--benchmark-only", f"--benchmark-save={save}"]
    pytest_exit = _run_tee(session, [*pytest, f"--benchmark-storage=file://{BENCHMARKS}", "-p", "no:cacheprovider"], None)[0]
    cost["benchmark_s"] = round(time.perf_counter() - started, 1)
    cost["pytest_exit"] = pytest_exit
    saves = []
    for machine in sorted(BENCHMARKS.iterdir()) if BENCHMARKS.is_dir() else []:  # pytest-benchmark's machine-id folders
        *older, newest = sorted(machine.glob(f"[0-9][0-9][0-9][0-9]_{save}.json")) or [None]
        for path in older:  # one save per torch version and machine id: the newest
            path.unlink()
        saves += [newest] if newest else []
    saves = [path for path in saves if path.stat().st_mtime >= saved_after - 1]  # this run's
    cost["benchmark_file"] = str(saves[0]) if saves else None
    _write_cost(out, cost, cases, modes)

    runs = ", ".join(
        f"harness{'' if mode == 'off' else ' ' + mode} exit {cost[f'harness{_key(mode)}_exit']} in {cost[f'harness{_key(mode)}_s']} s"
        for mode in modes
    )
    summary = f"torch {installed}: {runs}, pytest exit {pytest_exit} in {cost['benchmark_s']} s"
    for miss in cost["not_ok"]:
        summary += f"\n  not ok: {miss['case']} {miss['phase']} {miss['status']}: {miss['message'][:200]}"
    session.log(summary)
    if pytest_exit not in (0, 1):  # 1: a test failed, a result; 2 and up: pytest could not run them
        session.error(f"pytest could not run the benchmarks (exit {pytest_exit})")
    if not saves:
        session.error(f"pytest-benchmark saved no {save} under {BENCHMARKS}")


def _tell_workflow(**outputs: str) -> None:
    """A GitHub Actions step's outputs (steps.<id>.outputs.<key>); nothing outside a workflow."""
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as step_outputs:
            step_outputs.writelines(f"{key}={value}\n" for key, value in outputs.items())


def _run_tee(session: nox.Session, args: list[str], log: Path | None) -> tuple[int, str]:
    """Run in the session's venv, printing as it goes (and into `log`); returns the exit code and the output."""
    env = {**os.environ, **{k: v for k, v in session.env.items() if v is not None}, "PYTHONUNBUFFERED": "1"}
    env["PATH"] = os.pathsep.join([*(session.bin_paths or []), env.get("PATH", "")])
    for key in (k for k, v in session.env.items() if v is None):
        env.pop(key, None)
    session.log(" ".join(args))
    lines = []
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env, cwd=ROOT) as child:
        assert child.stdout is not None
        with open(log, "w") if log else open(os.devnull, "w") as copy:
            for line in child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                copy.write(line)
                lines.append(line)
    return child.returncode, "".join(lines)


def _key(mode: str) -> str:
    """session.json's key suffix for a mode: harness_s eager, harness_inductor_s compiled."""
    return "" if mode == "off" else f"_{mode}"


def _matrix_cases() -> list[str]:
    """The cases this session runs: MATRIX_CASES, or every case."""
    unknown = sorted(set(MATRIX_CASES) - set(_case_names()))
    if unknown:
        raise SystemExit(f"MATRIX_CASES names no case {', '.join(unknown)}: cases are {', '.join(_case_names())}")
    return MATRIX_CASES or _case_names()


def _case_names() -> list[str]:
    return sorted(path.stem for path in (ROOT / "conf" / "case").glob("*.yaml"))


def _mode_folder(out: Path, mode: str) -> Path:
    return out if mode == "off" else out / mode


def _record_name(case: str, mode: str) -> str:
    return f"{case}.{DEVICE}.json" if mode == "off" else f"{case}.{DEVICE}.{mode}.json"  # harness/run.py's record_name


def _harness_problems(code: int, output: str, out: Path, mode: str = "off", cases: list[str] | None = None) -> list[str]:
    """Why this run says nothing about the cases (empty when it ran them all), as opposed to a phase missing its expectation."""
    problems = []
    if code not in (0, 1):
        problems.append(f"exit code {code}" + (" (a bad command line)" if code == 2 else " (device missing)" if code == 3 else ""))
    for marker in HARNESS_CRASH_MARKERS:
        if marker in output:
            problems.append(f"its output has {marker!r}")
    for case in cases if cases is not None else _matrix_cases():  # the cases this session ran
        record = out / case / _record_name(case, mode)
        if not record.is_file():
            problems.append(f"no record for {case}")
        elif json.loads(record.read_text()).get("finished_at") is None:
            problems.append(f"the record of {case} was cut short")
    return problems


def _phases_not_ok(out: Path, mode: str = "off", cases: list[str] | None = None) -> list[dict]:
    missed = []
    cases = _case_names() if cases is None else cases
    for record_path in sorted(out / case / _record_name(case, mode) for case in cases if (out / case / _record_name(case, mode)).is_file()):
        record = json.loads(record_path.read_text())
        for phase in record["phases"]:
            if not phase["ok"]:
                message = re.sub(r"\s+", " ", phase["message"])
                missed.append(
                    {"case": record["case"], "compile": mode, "phase": phase["phase"], "status": phase["status"], "message": message}
                )
    return missed


def _source_digest() -> str:
    digest = hashlib.sha256()
    harness = [path for path in ROOT.glob("harness/**/*.py") if path.name != "matrix.py"]  # matrix.py only reads records
    for path in sorted([*harness, *ROOT.glob("cases/*.py"), *ROOT.glob("conf/**/*.yaml"), ROOT / "pyproject.toml"]):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _disk_usage(path: Path) -> int:
    du = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
    return int(du.stdout.split()[0]) * 1024


def _write_cost(out: Path, cost: dict, cases: list[str] | None = None, modes: list[str] | None = None) -> None:
    """session.json; a run of fewer modes (MATRIX_COMPILE) keeps what an earlier run said of the others, and a run of
    fewer cases (MATRIX_CASES) keeps the earlier run's figures, its own listed under `partial_runs`."""
    path = out / "session.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {}
    modes = modes if modes is not None else COMPILE_MODES
    if MATRIX_CASES and earlier:
        ran = set(modes)
        kept = [miss for miss in earlier.get("not_ok", []) if miss.get("case") not in MATRIX_CASES or miss.get("compile", "off") not in ran]
        partial = {
            "cases": MATRIX_CASES,
            **{key: value for key, value in cost.items() if key.startswith("harness") or key in ("source_digest", "torch_installed")},
        }
        cost = {**earlier, "not_ok": kept + cost.get("not_ok", []), "partial_runs": [*earlier.get("partial_runs", []), partial]}
    elif set(modes) != {"off", "inductor"} and earlier:
        ran = set(modes)
        kept = [miss for miss in earlier.get("not_ok", []) if miss.get("compile", "off") not in ran]
        cost = {**earlier, **cost, "not_ok": kept + cost.get("not_ok", [])}
    path.write_text(json.dumps(cost, indent=2) + "\n")


# autocast_device's upstream tier: the real speechbrain Brain, per release, with a torch it imports
# with (docs/autocast_device_versions.md: 1.0.3 does not import with torchaudio >= 2.11).
SPEECHBRAIN_MATRIX = [
    ("2.3.1", "1.0.3"),
    ("2.3.1", "1.1.0"),
    ("2.4.1", "1.0.3"),
    ("2.4.1", "1.1.0"),
    ("2.4.1", "1.1.2"),
    ("2.11.0", "1.1.2"),
]


@nox.session(reuse_venv=True)
@nox.parametrize(("torch", "speechbrain"), SPEECHBRAIN_MATRIX)
def speechbrain(session: nox.Session, torch: str, speechbrain: str) -> None:
    """tests/test_autocast_device.py with speechbrain importable: its upstream tier runs instead of skipping."""
    numpy = ["numpy<2"] if Version(torch) < Version("2.5") else []  # torchaudio 2.3/2.4 were built against numpy 1
    session.install("--no-cache-dir", f"torch=={torch}", f"torchaudio=={torch}", f"speechbrain=={speechbrain}", *numpy, "-e", ".[test]")
    out = RESULTS / "speechbrain" / f"torch-{torch}-speechbrain-{speechbrain}.xml"
    out.parent.mkdir(parents=True, exist_ok=True)
    code = _run_tee(
        session,
        ["python", "-m", "pytest", "tests/test_autocast_device.py", "-q", "-rs", f"--junitxml={out}", "-p", "no:cacheprovider"],
        None,
    )[0]
    if code != 0:
        session.error(f"speechbrain {speechbrain} with torch {torch}: pytest exit {code}")


# The tests a plain `pytest` leaves out (marked slow; pyproject's addopts): the end-to-end checks of what faster tests cover.
CI_TORCH = "2.13.0"  # .ci/run's


@nox.session(reuse_venv=True)
def slow(session: nox.Session) -> None:
    """`pytest -m slow` under .ci/run's torch: the exploit suite's speed grades, the notebooks, SLURM, the launchers' sweeps, compiled grading."""
    session.install("--no-cache-dir", f"torch=={CI_TORCH}", "-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "slow", "-p", "no:cacheprovider", *session.posargs)


# The sweep submitted to SLURM: a one-node cluster on this machine (.ci/slurm-local), its jobs as SLURM jobs.
SLURM_SCRIPT = ".ci/slurm-local"
SLURM_TORCH = "2.13.0"  # .ci/run's


@nox.session(reuse_venv=True)
def slurm(session: nox.Session) -> None:
    """Every case as a SLURM job (hydra/launcher=slurm_local) on a cluster started and stopped here, then tests/test_slurm.py.

    Installs slurm-wlm, slurmdbd, munge and mariadb-server where missing (apt-get, as root). Like the matrix,
    a harness exit of 1 with every record finished (a phase missed its expectation: a speed verdict on a
    loaded machine) is reported, not a failure: SLURM ran the jobs and brought their records back. It fails
    when SLURM or the launcher broke (any other exit, a traceback), a record is missing or was cut, a record
    or status lacks its SLURM job id, the tests fail, or a daemon outlives the session.
    """
    import tempfile

    session.run("bash", SLURM_SCRIPT, "install", external=True)
    session.install("--no-cache-dir", f"torch=={SLURM_TORCH}", "-e", ".[test]")
    scratch = Path(tempfile.mkdtemp(prefix="nox-slurm-"))
    sweep = ROOT / "multirun" / "slurm" / time.strftime("%Y-%m-%d_%H-%M-%S")
    sweep.mkdir(parents=True)
    command = [
        "bash",
        SLURM_SCRIPT,
        "run",
        "--",
        "python",
        "-m",
        "harness",
        "-m",
        "case=glob(*)",
        f"device={DEVICE}",
        "hydra/launcher=slurm_local",
    ]
    command += [
        f"hydra.launcher.cpus_per_task={os.cpu_count()}",
        f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${case.name}",
        *session.posargs,
    ]
    session.env["SLURM_LOCAL_STATE"] = str(scratch / "cluster")  # one job at a time: every CPU each, as the speed phase wants
    started = time.perf_counter()
    code, output = _run_tee(session, command, sweep / "harness.log")
    sweep_s = time.perf_counter() - started
    problems = _harness_problems(code, output, sweep)
    jobs = {}
    for case in _case_names():
        status_path, record_path = sweep / case / "exit_status", sweep / case / _record_name(case, "off")
        status = json.loads(status_path.read_text()) if status_path.is_file() else {}
        record = json.loads(record_path.read_text()) if record_path.is_file() else {}
        job = status.get("slurm_job")
        if not job or (record and record["environment"].get("slurm", {}).get("job") != job):
            problems.append(f"{case}: no SLURM job id in its exit status and record ({job!r})")
        jobs[case] = job
    session.log(
        f"sweep through SLURM: harness exit {code} in {sweep_s:.0f} s; jobs " + ", ".join(f"{case} {job}" for case, job in jobs.items())
    )
    for miss in _phases_not_ok(sweep):
        session.log(f"  not ok (reported, not a failure): {miss['case']} {miss['phase']} {miss['status']}: {miss['message'][:200]}")

    del session.env["SLURM_LOCAL_STATE"]
    tests = [
        "python",
        "-m",
        "pytest",
        "-m",
        "slurm",
        "tests/test_slurm.py",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        f"--basetemp={scratch / 'pytest'}",
    ]
    pytest_exit = _run_tee(session, tests, None)[0]  # its own cluster, started and stopped by the test module
    if pytest_exit != 0:
        problems.append(f"tests/test_slurm.py: pytest exit {pytest_exit}")
    left = _processes_mentioning(str(scratch))
    if left:
        problems.append(f"processes of the cluster left running: {left}")
    shutil.rmtree(scratch, ignore_errors=True)
    if problems:
        session.error("; ".join(problems))
    session.log(f"records: {sweep}; no SLURM daemon left")


def _processes_mentioning(text: str) -> list[str]:
    """Processes whose command line or environment (SLURM_CONF) holds `text`: what the cluster's scripts started."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.name != str(os.getpid()) and any(text.encode() in (proc / part).read_bytes() for part in ("cmdline", "environ")):
                found.append(f"{proc.name} {(proc / 'comm').read_text().strip()}")
        except OSError:
            continue
    return found
