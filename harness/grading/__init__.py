"""Grading a submitted fix: the checks (fix, correct, speed, memory, integrity), the verdict, hints and exercises.

    grade       the grade's phases: the case's, with the graded checks in place of correct and around fix and speed
    submission  the submitted file, checked before anything runs
    judge       correct: the output made in one child, judged in another against the reference
    integrity   the sources unchanged, no write outside the sandbox, nothing left running
    verdict     the verdict, read from the records
    exercise    hints, the exercise a learner starts from, the model solution
    common      the constants and types they share

What keeps the submission from reaching what it is compared with lives beneath the phases, in the process layer:
harness/process/submitted.py (loading it in a child, behind tripwires) and harness/process/confine.py (what such a
child may do). `grade` uses `harness.phases` and hands the phases a candidate; nothing beneath imports `grade`.
"""
