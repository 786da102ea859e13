"""Grading a submitted fix, and the machinery that keeps the submission from reaching what it is compared with.

    grade      the checks of a submitted fix (fix, correct, speed, memory, integrity), the verdict, hints, exercises
    submitted  loading the submitted file in a child, by path, behind tripwires; the process settings it changed
    confine    what a child that imports a submission may do (Landlock, limits, process counts)

The import graph runs one way: `harness.phases` uses `confine` and `submitted` (how a child holding a submission is
loaded and held); `grade` uses `harness.phases`, and hands the phases a candidate; nothing here imports `grade`.
The speed protocol the phases time with is the speed phase's own (harness/phases/clock.py).
"""
