"""Grading a submitted fix: the checks (fix, correct, speed, memory, integrity), the verdict, hints and exercises.

    grade      the checks of a submitted fix, the verdict, hints, exercises

What keeps the submission from reaching what it is compared with lives beneath the phases, in the process layer:
harness/process/submitted.py (loading it in a child, behind tripwires) and harness/process/confine.py (what such a
child may do). `grade` uses `harness.phases` and hands the phases a candidate; nothing beneath imports `grade`.
"""
