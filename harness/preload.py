"""Imported last by the fork server (`harness.cases.fork_server_modules`): each case's `preload`, once.

An upstream package a case needs but cannot import (not installed) is the case's own error, reported
by its phases; here it is passed over.
"""

import contextlib
import gc
import sys

for _module in [module for name, module in sorted(sys.modules.items()) if name.startswith("cases.")]:
    with contextlib.suppress(ImportError):
        getattr(_module, "preload", lambda: None)()

gc.freeze()  # a child's full collection scans only what it made since (0.2 s -> ms), and leaves the shared pages unwritten
