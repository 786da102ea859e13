"""A pytest plugin for runs that may be cut off (a lent GPU machine's time limit): each failure is printed the
moment it happens, not in a summary a killed run never reaches.

    python -m pytest -p tools.pytest_live_failures ...
"""

import sys

_in_worker = False


def pytest_configure(config):
    global _in_worker
    _in_worker = hasattr(config, "workerinput")  # under xdist, the controller alone prints


def pytest_runtest_logreport(report):
    if _in_worker:
        return
    if report.failed:
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext[-4000:]}\n")
        sys.stderr.flush()
    elif report.when == "call" and report.passed:
        sys.stderr.write(f"PASSED {report.nodeid} ({report.duration:.1f} s)\n")
        sys.stderr.flush()
