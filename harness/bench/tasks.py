"""The task set: one folder per case with the starter a fixer edits and a task card, and a hash that names the set.

    python -m harness.bench tasks OUT

OUT/<case>/fix_<case>.py is the starter as `exercise=` writes it (graded from that folder: the grade command
in it names the file by its relative path); OUT/<case>/task.json is the card: the symptom per device, the
command that reproduces it and the grading contract. Nothing in the set holds the case's fix, its
reference or its hints. OUT/tasks.json lists the cases with the set's version and `sha256`, a hash of every
file's relative path and bytes: two `tasks` runs on the same sources write the same hash, and a changed
starter or card changes it. Every scoreboard names the hash of the set it graded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import yaml

from harness.cases import CASE_CONFIG_DIR, case_names, case_text, load_case
from harness.grading.grade import EXERCISE_FUNCTION, GRADED_PHASES, starter_source

FORMAT = 1  # of the cards and the index; bumped when a field changes meaning
INDEX = "tasks.json"
CARD = "task.json"


def submission_name(case: str) -> str:
    return f"fix_{case}.py"


def card(name: str) -> dict[str, Any]:
    """What a fixer is told of a case: its failure and how it is graded, not how to fix it."""
    case = load_case(name)
    text = case_text(case)
    cfg = yaml.safe_load((CASE_CONFIG_DIR / f"{name}.yaml").read_text())
    speed = cfg.get("speed") or {}
    memory = cfg.get("memory") or {}
    inputs = getattr(getattr(case, "Inputs", None), "_fields", None)
    memory_budget = _budget(memory, "grade_budget")
    return {
        "format": FORMAT,
        "case": name,
        "title": text.title,
        "upstream": text.sections["Upstream"],
        "symptom": {device: text.sections[f"Symptom on {device.upper()}"] for device in ("cpu", "cuda")},
        "reproduce": f"python -m harness case={name} phases=[reproduce]",
        "starter": submission_name(name),
        "grade": f"python -m harness case={name} fix={submission_name(name)}:{EXERCISE_FUNCTION}",
        "contract": {
            "function": f"{EXERCISE_FUNCTION}{inspect.signature(case.buggy)}",
            "takes": "the case's inputs, as the starter's `fix` does" + (f" (fields: {', '.join(inputs)})" if inputs else ""),
            "returns": "what the case's reference returns for those inputs: plain tensors, the same count, shapes, dtypes and device",
            "checks": [*GRADED_PHASES[:-1], *(["memory"] if memory_budget else []), GRADED_PHASES[-1]],
            "tolerance": {key: cfg[key] for key in ("tolerance", "compile_tolerance", "cuda_tolerance") if key in cfg},
            "speed_budget": {
                "against": "the case's own fix, timed in processes of its own; the ratio's 95% interval must lie under the budget",
                "eager": _budget(speed, "grade_budget"),
                "compiled": _budget(speed, "compile_grade_budget", "grade_budget"),
            },
            "memory_budget": memory_budget,
        },
    }


def _budget(section: dict, *keys: str) -> dict | None:
    """The first of `keys`, then `budget`, that the section sets: {device: value}, devices without one left out."""
    for key in (*keys, "budget"):
        if section.get(key):
            return {device: value for device, value in section[key].items() if value is not None} or None
    return None


def task_files(names: list[str] | None = None) -> dict[str, bytes]:
    """Every file of the set by relative path, the index included (its hash covers the rest)."""
    names = names or case_names()
    files: dict[str, bytes] = {}
    for name in names:
        files[f"{name}/{submission_name(name)}"] = starter_source(load_case(name), Path(submission_name(name))).encode()
        files[f"{name}/{CARD}"] = _json(card(name))
    files[INDEX] = _json({"format": FORMAT, "cases": names, "sha256": content_hash(files)})
    return files


def content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        if path != INDEX:
            digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


def write_tasks(out: Path, names: list[str] | None = None) -> dict[str, Any]:
    """Write the set under `out` (created; a file of a former set is overwritten, nothing else touched); the index."""
    files = task_files(names)
    for relative, data in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return json.loads(files[INDEX])


def set_hash(names: list[str] | None = None) -> str:
    return content_hash(task_files(names))


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
