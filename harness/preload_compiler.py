"""Imported by the fork server of a run that compiles (`harness.cases.fork_server_modules`): inductor, once."""

from harness.compiled import preload_compiler

preload_compiler()
