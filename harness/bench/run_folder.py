"""One bench run's folder OUT (harness/bench/runner.py): each finished case's result, a marker per grade in progress,
the log; and what an interrupted run left running, killed by its session."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.process.tree import start_ticks


@dataclass
class CaseResult:
    """One task's line of the scoreboard."""

    case: str
    status: str  # accepted, rejected, not_attempted, duplicate, syntax_error, bad_submission, no_device, grader_timeout, grader_crashed
    verdict: str = ""  # the grader's verdict line, or why there is none
    first_failing: str | None = None  # "<check>: <status>" of a rejection
    files: list[str] = dataclasses.field(default_factory=list)
    sha256: str | None = None
    speed: dict[str, Any] | None = None  # ratio, ratio_low, ratio_high, budget, status
    memory: dict[str, Any] | None = None  # where the grade judged memory
    seconds: float | None = None
    record: str | None = None  # relative to OUT
    exit_code: int | None = None


class Run:
    """One bench run over OUT: its lock, its finished cases, its markers and its log."""

    def __init__(self, out: Path) -> None:
        self.out = out
        (out / "cases").mkdir(parents=True, exist_ok=True)
        (out / "running").mkdir(exist_ok=True)
        self._lock_file = open(out / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another bench run is grading into {out}") from None
        self._log_lock = threading.Lock()

    def finished(self, case: str) -> CaseResult | None:
        path = self.out / "cases" / f"{case}.json"
        if not path.exists():
            return None
        return CaseResult(**json.loads(path.read_text()))

    def keep(self, result: CaseResult) -> None:
        write_atomically(self.out / "cases" / f"{result.case}.json", json.dumps(dataclasses.asdict(result), indent=2) + "\n")

    def log(self, **event: Any) -> None:
        with self._log_lock, open(self.out / "log.jsonl", "a") as log:
            log.write(json.dumps({"at": round(time.time(), 3), **event}) + "\n")

    def interruptions(self, case: str, sha256: str) -> int:
        return sum(e["event"] == "interrupted" and e["case"] == case and e.get("sha256") == sha256 for e in self.events())

    def events(self) -> list[dict[str, Any]]:
        path = self.out / "log.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def clear_interrupted(self, event: str = "interrupted") -> None:
        """Kill what grades cut short left running (by their session), forget their markers; log `event` for each:
        `interrupted` where a run died under them (counted: INTERRUPTIONS), `stopped` where it was stopped (Ctrl-C)."""
        for marker in sorted((self.out / "running").glob("*.json")):
            said = json.loads(marker.read_text() or "{}")
            killed = kill_session(int(said.get("pid", 0)), int(said.get("start_ticks", 0)))
            self.log(case=said.get("case", marker.stem), event=event, sha256=said.get("sha256"), killed=killed)
            marker.unlink()

    @contextlib.contextmanager
    def running(self, case: str, sha256: str, pid: int) -> Iterator[None]:
        marker = self.out / "running" / f"{case}.json"
        write_atomically(marker, json.dumps({"case": case, "sha256": sha256, "pid": pid, "start_ticks": start_ticks(pid)}))
        try:
            yield
        finally:
            marker.unlink(missing_ok=True)


def kill_session(leader: int, leader_ticks: int) -> int:
    """SIGKILL every process in the session `leader` started that started no earlier than the leader did (so a
    process that merely reuses an old pid is spared); the number killed."""
    if leader <= 0:
        return 0
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == leader and int(fields[19]) >= leader_ticks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    temporary.write_text(text)
    os.replace(temporary, path)
