"""What differs between records: a case's behaviour across torch versions (the matrix's table), and the change
report from one set of records to another (`python -m harness.matrix changes`)."""

from __future__ import annotations

import re
from typing import Any

from packaging.version import Version

from harness.recordset import Record
from harness.triage import normalise

SPEED_THRESHOLD = 0.2  # the change report's relative speed change where a record has no ratio interval


def behaviour(record: Record) -> str:
    status = record.statuses.get("reproduce", "-")
    error = symptom_text(record)
    return f"{status} ({error})" if error else status


# What a build generates rather than what broke, folded before two symptoms are compared (on top of triage's cleaning:
# paths, pids, addresses, line numbers, inductor's tmpN): the generated kernel's location that newer inductor prints
# before its bounds check, and a fragment of faulthandler's `File "...", line N` that another thread wrote into the
# middle of the C++ abort's line.
_GENERATED = (
    re.compile(r"\bkernel, [\w.<>-]+\.(?:cpp|py|c):<n>, "),
    re.compile(r'\bFile "[^"]*"(?:, line(?: <n>)?)?'),
    re.compile(r"(?<=what\(\):)\s*, line\b(?: <n>)?"),
)


def folded(text: str | None) -> str | None:
    """A symptom's text with generated names and locations folded: two texts equal after folding are the same failure."""
    if text is None:
        return None
    lines = []
    for line in normalise(text):
        for pattern in _GENERATED:
            line = pattern.sub(" ", line)
        lines.append(" ".join(line.split()))
    return "\n".join(lines).strip()


def behaviour_key(record: Record) -> tuple[str, str | None]:
    return record.statuses.get("reproduce", "-"), folded(symptom_text(record))


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def symptom_text(record: Record) -> str | None:
    """The reproduce error, or for a process a native error killed, its telling line (harness/compiled.py); for a
    failure that raises nothing (a wrong result, a warning), the warning that named it."""
    figures = record.figures.get("reproduce", {})
    if figures.get("error"):
        return ANSI_ESCAPE.sub("", figures["error"])  # torch's own bold (UnpicklingError's "do those steps only if ...")
    if figures.get("warning"):
        return figures["warning"]
    if figures.get("native_message"):
        return record.messages.get("reproduce")
    return None


def changes(old: list[Record], new: list[Record], threshold: float = SPEED_THRESHOLD) -> list[str]:
    """Markdown lines, per case and device, of what changed from `old` to `new`; empty when nothing did.

    Each side may hold several torch versions: per case and device its newest record is compared.
    Reported: the reproduce outcome, the verbatim symptom (the reproduce error), every other phase's
    status but speed, and a speed ratio whose interval no longer overlaps the old one (or, where a
    record has no interval, that moved by more than `threshold`, relative).
    """
    before, after = _newest_per_case(old), _newest_per_case(new)
    lines = []
    for key in sorted(before.keys() | after.keys()):
        case, platform = key
        if key not in after:
            lines += [f"### `{case}` on {platform}", "", f"- no record in the new set (the old one is from torch {before[key].torch})", ""]
            continue
        if key not in before:
            lines += [f"### `{case}` on {platform}", "", f"- no record in the old set (the new one is from torch {after[key].torch})", ""]
            continue
        found = _record_changes(before[key], after[key], threshold)
        if found:
            lines += [f"### `{case}` on {platform}, torch {before[key].torch} -> {after[key].torch}", "", *found, ""]
    return lines


def _newest_per_case(records: list[Record]) -> dict[tuple[str, str], Record]:
    """Per case and platform (the device, and the compile backend where compiled), the newest torch's record."""
    newest: dict[tuple[str, str], Record] = {}
    for record in sorted(records, key=lambda record: Version(record.torch)):
        newest[(record.case, record.platform)] = record
    return newest


def _record_changes(before: Record, after: Record, threshold: float) -> list[str]:
    lines = []
    phases = ["reproduce"] + [phase for phase in dict.fromkeys([*before.statuses, *after.statuses]) if phase not in ("reproduce", "speed")]
    for phase in phases:
        was, now = before.statuses.get(phase, "not run"), after.statuses.get(phase, "not run")
        if was != now:
            lines.append(f"- `{phase}`: {was} -> {now}" + (f": {_code(after.messages[phase])}" if phase in after.messages else ""))
        if phase == "reproduce":
            if folded(symptom_text(before)) != folded(symptom_text(after)):
                lines += ["- symptom text:", f"  - before: {_symptom(before)}", f"  - after: {_symptom(after)}"]
    speed_change = _speed_change(before.figures.get("speed", {}), after.figures.get("speed", {}), threshold)
    if speed_change:
        lines.append(
            f"- speed: {speed_change} (status {before.statuses.get('speed', 'not run')} -> {after.statuses.get('speed', 'not run')})"
        )
    return lines


def _symptom(record: Record) -> str:
    error = symptom_text(record)
    return _code(error) if error else "none (no error recorded)"


def _speed_change(was: dict[str, Any], now: dict[str, Any], threshold: float) -> str | None:
    """How the speed ratio moved, when it moved beyond the noise; None when it did not."""
    if "ratio" not in was and "ratio" not in now:
        return None
    if "ratio" not in was or "ratio" not in now:
        return f"{ratio_text(was)} -> {ratio_text(now)}"
    if has_interval(was) and has_interval(now):
        if now["ratio_low"] > was["ratio_high"] or now["ratio_high"] < was["ratio_low"]:
            return f"{ratio_text(was)} -> {ratio_text(now)}: the intervals no longer overlap"
        return None
    relative = now["ratio"] / was["ratio"] - 1 if was["ratio"] else float("inf")
    if abs(relative) <= threshold:
        return None
    return f"{ratio_text(was)} -> {ratio_text(now)} ({relative:+.0%}): beyond the {threshold:.0%} threshold used where a record has no interval"


def ratio_text(speed: dict[str, Any]) -> str:
    if "ratio" not in speed:
        return "not measured"
    interval = f" [{speed['ratio_low']:.2f}, {speed['ratio_high']:.2f}]" if has_interval(speed) else ""
    return f"{speed['ratio']:.2f}x{interval}"


def _code(text: str) -> str:
    """Markdown code for verbatim text: inline for a line, fenced for several; fences longer than any backtick run inside."""
    run = max((len(ticks) for ticks in re.findall(r"`+", text)), default=0) + 1
    if "\n" in text.strip():
        fence = "`" * max(3, run)
        return f"\n\n{fence}text\n{text.strip()}\n{fence}\n"
    fence = "`" * run
    padded = f" {text} " if text.startswith("`") or text.endswith("`") else text
    return f"{fence}{padded}{fence}"


def has_interval(speed: dict[str, Any]) -> bool:
    return speed.get("ratio_low") is not None and speed.get("ratio_high") is not None
