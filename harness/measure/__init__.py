"""The measurement layer: what the phases measure with, beneath them.

    clock      the speed protocol: the parent drives a timing child block by block and times it on its own clock
    footprint  memory per step: the parent drives a child step by step and reads what it retains and peaks at
    timing     paired samples and the ratio's interval against a budget
    compare    how far an output is from the reference, within a tolerance

It uses the process layer (harness/process/) and nothing above it (tests/test_imports.py).
"""
