"""Shared fixtures. The pytest process never touches CUDA itself: the harness forks
children that may, and CUDA cannot be re-initialised in a child forked after it."""

import pytest
from hydra import compose, initialize_config_dir

from harness.cases import ROOT
from harness.run import probe_environment

ENVIRONMENT = probe_environment()  # probed in an isolated child
CUDA_AVAILABLE = bool(ENVIRONMENT.get("cuda_available"))
requires_cuda = pytest.mark.skipif(not CUDA_AVAILABLE, reason="needs a CUDA device; none is present")


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="session")
def environment():
    return ENVIRONMENT
