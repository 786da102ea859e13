"""The scoreboard of a bench run (scoreboard.json, scoreboard.md) and what changed between two of them.

Overall, over the tasks in the run (every case, or `--cases`):
    accepted_of_attempted, accepted_of_all   the resolved rate, of the files given and of every task
    fast_p                                   the share of all tasks accepted with a speed verdict within the
                                             case's grade budget (KernelBench's fast_p, the threshold per case)
    geomean_speed_ratio                      of the accepted fixes' time over the case's own fix
Every scoreboard names the task set's hash, the settings and the environment it was graded in.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from harness.bench.run_folder import CaseResult
from harness.statuses import Speed

GRADED = ("accepted", "rejected")


def summary(results: dict[str, CaseResult]) -> dict[str, Any]:
    tasks = len(results)
    attempted = [r for r in results.values() if r.status != "not_attempted"]
    accepted = [r for r in results.values() if r.status == "accepted"]
    fast = [r for r in accepted if r.speed and r.speed["status"] == Speed.WITHIN_BUDGET]
    ratios = [r.speed["ratio"] for r in accepted if r.speed and r.speed.get("ratio")]
    counts: dict[str, int] = {}
    for result in results.values():
        counts[result.status] = counts.get(result.status, 0) + 1
    return {
        "tasks": tasks,
        "attempted": len(attempted),
        "accepted": len(accepted),
        "accepted_of_attempted": _share(len(accepted), len(attempted)),
        "accepted_of_all": _share(len(accepted), tasks),
        "fast_p": _share(len(fast), tasks),
        "geomean_speed_ratio": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4) if ratios else None,
        "statuses": dict(sorted(counts.items())),
        "seconds": round(sum(r.seconds or 0.0 for r in results.values()), 1),
    }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def scoreboard(results: dict[str, CaseResult], unmatched: list[str], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        **meta,
        "summary": summary(results),
        "cases": {case: dataclasses.asdict(result) for case, result in results.items()},
        "unmatched_files": [
            {"file": path, "status": "unknown_case", "verdict": "its name, fix_<case>.py, names no case of the task set"}
            for path in unmatched
        ],
    }


def markdown(board: dict[str, Any]) -> str:
    s = board["summary"]
    lines = [
        f"# Scoreboard: {board['fixes']}",
        "",
        f"Task set `{board['task_set']['sha256'][:16]}` (format {board['task_set']['format']}, {s['tasks']} tasks); "
        f"device={board['settings']['device']} compile={board['settings']['compile']}; "
        f"torch {board['environment'].get('torch')}, Python {board['environment'].get('python')}, {board['environment'].get('cpus')} CPUs; "
        f"commit {str(board['environment'].get('git_commit'))[:12]}; {board['finished_at'] or 'unfinished'}",
        "",
        "| accepted / attempted | accepted / all | fast_p | geomean speed ratio (accepted) | grading time |",
        "|---|---|---|---|---|",
        f"| {s['accepted']} / {s['attempted']} ({_percent(s['accepted_of_attempted'])}) | {s['accepted']} / {s['tasks']} ({_percent(s['accepted_of_all'])}) "
        f"| {_percent(s['fast_p'])} | {_ratio(s['geomean_speed_ratio'])} | {s['seconds']:.0f} s |",
        "",
        "| case | verdict | first failing check | speed (fix / case's fix) | memory | time |",
        "|---|---|---|---|---|---|",
    ]
    for case, r in board["cases"].items():
        lines.append(
            f"| {case} | {r['status']} | {r['first_failing'] or ''} | {speed_text(r['speed'])} | {_memory_text(r['memory'])} | {_seconds(r['seconds'])} |"
        )
    for entry in board["unmatched_files"]:
        lines.append(f"| `{entry['file']}` | unknown_case | | | | |")
    named = [(case, r) for case, r in board["cases"].items() if r["status"] not in ("accepted", "not_attempted")]
    if named:
        lines += ["", "Verdicts:", ""] + [f"- {case}: {' '.join(r['verdict'].split())[:400]}" for case, r in named]
    return "\n".join(lines) + "\n"


def speed_text(speed: dict | None) -> str:
    if not speed:
        return ""
    budget = f" (budget {speed['budget']}x)" if speed.get("budget") else ""
    interval = f" [{speed['ratio_low']:.2f}, {speed['ratio_high']:.2f}]" if speed.get("ratio_low") is not None else ""
    return f"{speed['ratio']:.2f}x{interval}{budget}"


def _memory_text(memory: dict | None) -> str:
    if not memory:
        return ""
    growth = memory.get("growth_fraction")
    return f"{memory['status']}" + (
        f", excess growth {round(growth, 2) + 0.0:.2f} of the baseline's peak a step" if growth is not None else ""
    )


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} s"


def changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs from scoreboard `a` to `b`: the set and settings, verdict flips, speed ratios whose intervals
    no longer overlap (a move the noise of either run does not explain). Empty when nothing did."""
    said = []
    if a["task_set"]["sha256"] != b["task_set"]["sha256"]:
        said.append(f"task set: {a['task_set']['sha256'][:16]} -> {b['task_set']['sha256'][:16]} (the tasks differ: compare with care)")
    for key in ("device", "compile"):
        if a["settings"][key] != b["settings"][key]:
            said.append(f"{key}: {a['settings'][key]} -> {b['settings'][key]}")
    for key in ("torch", "git_commit"):
        if a["environment"].get(key) != b["environment"].get(key):
            said.append(f"{key}: {a['environment'].get(key)} -> {b['environment'].get(key)}")
    for case in sorted(set(a["cases"]) | set(b["cases"])):
        before, after = a["cases"].get(case), b["cases"].get(case)
        if before is None or after is None:
            said.append(f"{case}: {'only in B' if before is None else 'only in A'}")
            continue
        if before["status"] != after["status"]:
            said.append(
                f"{case}: {before['status']} -> {after['status']}" + (f" ({after['first_failing']})" if after["first_failing"] else "")
            )
        moved = _moved(before["speed"], after["speed"])
        if moved:
            said.append(f"{case}: speed {moved}")
    return said


def _moved(before: dict | None, after: dict | None) -> str | None:
    if not before or not after or before.get("ratio_low") is None or after.get("ratio_low") is None:
        return None
    if after["ratio_low"] > before["ratio_high"]:
        return f"slower: {speed_text(before)} -> {speed_text(after)}"
    if after["ratio_high"] < before["ratio_low"]:
        return f"faster: {speed_text(before)} -> {speed_text(after)}"
    return None
