"""A fixer benchmark: every case as a task, one command that scores a set of fixes, a scoreboard to trust.

    python -m harness.bench tasks OUT                    # the task set: OUT/<case>/fix_<case>.py and task.json
    python -m harness.bench grade FIXES [--out DIR] [--cases a,b] [--jobs N] [device=cpu|cuda] [compile=off|inductor|aot_eager]
    python -m harness.bench compare A.json B.json        # verdict flips, speed ratios that moved beyond their intervals
    python -m harness.bench solutions OUT                # the cases' own fixes, written out as submissions
    python -m harness.bench split FILE OUT               # a file of functions named after cases, one submission each

    tasks       the task set and its hash (harness/bench/tasks.py)
    runner      grading a folder of fixes, a process per grade, resumable (harness/bench/runner.py)
    run_folder  one run's folder: finished results, markers of grades in progress, the log (harness/bench/run_folder.py)
    scoreboard  the scoreboard, its summary and the comparison of two (harness/bench/scoreboard.py)
    cli         the command line

The import graph runs one way: cli uses the others, runner and scoreboard use run_folder; none uses cli, and nothing
in the harness imports the bench (a grade is `python -m harness case=... fix=...`, run as a process).
"""
