"""A stand-in for `python -m harness case=... fix=...` in the bench's bookkeeping tests: it grades nothing.

It takes the grader's arguments, and acts as the file it was given says in a comment, `# bench: <action>`:
`accept` (default) writes an accepted record, `reject` a rejected one, `die` kills itself with SIGSEGV, `hang`
sleeps past any limit, `usage` exits 2 as the harness does for a file it refuses, `killbench` kills the bench. Each run first sleeps
BENCH_GRADER_S seconds (default 0.5) with a child beside it, as a real grade has its fork server.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    args = dict(arg.split("=", 1) for arg in argv)
    case, folder = args["case"], Path(args["hydra.run.dir"].strip("'"))
    source = Path(args["fix"].strip("'").rpartition(":")[0]).read_text()
    action = (re.search(r"# bench: (\w+)", source) or re.match("(accept)", "accept")).group(1)
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # bench_grader helper"])
    time.sleep(float(os.environ.get("BENCH_GRADER_S", "0.5")))
    if action == "killbench":
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(600)
    if action == "die":
        os.kill(os.getpid(), signal.SIGSEGV)
    if action == "hang":
        time.sleep(600)
    if action == "usage":
        print("error: fix=...: the file has no function fix")
        return 2
    accepted = action == "accept"
    verdict = "accepted: fix, correct, speed passed" if accepted else "rejected by correct: mismatch: 3 of 8 values differ"
    speed = {
        "phase": "speed",
        "status": "within_budget",
        "ok": True,
        "figures": {"ratio": 1.02, "ratio_low": 0.98, "ratio_high": 1.06, "budget": 1.15},
    }
    record = {"case": case, "verdict": verdict, "phases": [speed]}
    (folder / f"{case}.{args['device']}.json").write_text(json.dumps(record))
    helper.kill()
    return 0 if accepted else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
