"""How many workers the plain test run gets (tests/conftest.py): one per core, none where a run times things."""

import pytest

from tests.conftest import MAX_WORKERS, pytest_xdist_auto_num_workers


class Options:
    def __init__(self, **given):
        self.given = given

    def getoption(self, name, default=None):
        return self.given.get(name, default)


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)


def test_the_plain_run_gets_a_worker_per_core(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert pytest_xdist_auto_num_workers(Options(markexpr="not slow")) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert pytest_xdist_auto_num_workers(Options(markexpr="not slow")) == MAX_WORKERS


@pytest.mark.parametrize(
    "given",
    [
        {"markexpr": "slow"},
        {"markexpr": ""},
        {"markexpr": "cuda"},
        {"markexpr": "not slow", "benchmark_only": True},
        {"markexpr": "not slow", "benchmark_save": "x"},
    ],
)
def test_a_run_that_times_things_gets_no_worker(given):
    assert pytest_xdist_auto_num_workers(Options(**given)) == 0


def test_the_environment_decides_where_it_says(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert pytest_xdist_auto_num_workers(Options(markexpr="slow")) == 3
