"""Imported last by the fork server (`harness.cases.fork_server_modules`): every case, then each case's `preload`, once.

A case that cannot be imported on this torch (an API from a later release: a case run on the matrix's older releases
imports beside them), or whose upstream package is not installed, is passed over here: it is the case's own error,
reported by its phases when it runs, never the fork server's.
"""

import contextlib
import gc
import importlib
import sys

from harness.cases import case_names

for _name in case_names():
    with contextlib.suppress(Exception):
        importlib.import_module(f"cases.{_name}")

for _module in [module for name, module in sorted(sys.modules.items()) if name.startswith("cases.")]:
    with contextlib.suppress(ImportError):
        getattr(_module, "preload", lambda: None)()

gc.freeze()  # a child's full collection scans only what it made since (0.2 s -> ms), and leaves the shared pages unwritten
