"""The process layer: how a phase's code runs apart from the harness, and what a child holding a submission may do.

    isolate    one call in a child process (forked from a preloaded server), bounded in time, its crash or signal
               turned into a record; the harness never dies or hangs because a case did
    confine    what a child that imports a submitted fix may do (Landlock, limits, process counts, the audit hook)
    submitted  loading a submitted file in a child, by path, behind tripwires; the process settings it changed

Nothing here imports a phase, a measurement or grading: the layers above use it (tests/test_imports.py).
"""
