"""Grading a submitted fix, and the machinery that keeps the submission from reaching what it is compared with.

    grade      the checks of a submitted fix (fix, correct, speed, memory, integrity), the verdict, hints, exercises
    submitted  loading the submitted file in a child, by path, behind tripwires; the process settings it changed
    confine    what a child that imports a submission may do (Landlock, limits, process counts)
    clock      the speed phase's protocol: a child serves blocks of calls, the parent times them

The import graph runs one way: `harness.phases` uses `clock`, `confine` and `submitted`; `grade` uses
`harness.phases`; nothing here imports `grade`.
"""
