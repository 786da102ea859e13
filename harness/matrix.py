"""The regression matrix: compare result records with the checked-in expectations, and tabulate them.

    python -m harness.matrix check results/matrix   # exit 1, naming case, torch, device and phase, on any drift
    python -m harness.matrix table results/matrix   # the markdown table of docs/matrix.md
    python -m harness.matrix changes OLD_DIR NEW_DIR  # markdown: what changed between two sets of records; exit 1 if anything did
    python -m harness.matrix margins results/matrix  # each control short of its margin (harness/margins.py); exit 1 if any

Records are the JSON files the harness writes (one per case and device), found recursively.
`expectations.yaml` says, per case, for a torch version range and devices, which status each phase
must end with; the first entry that matches a record applies. A record no entry covers is a drift
too: an expectation is established by running the matrix, never assumed. Each entry lists the torch
versions it was `established` on; a record from a newer torch is still judged by it, and the check
says that it extrapolated.
Needs only PyYAML and packaging (no torch), so a CI gate can run it on records it downloaded.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness import margins as control_margins
from harness.recordset import Record, RecordFormatError, load_records
from harness.triage import normalise

EXPECTATIONS = Path(__file__).resolve().parent.parent / "expectations.yaml"
EVERY_BAD_FIX = "bad_fix:*"  # an expectation key ending in ":*" covers every phase with that prefix (bad_fix:*, slow_fix:*)
UNDECIDED = "inconclusive"  # a speed verdict whose interval straddles the budget: never a pass, listed apart
ENTRY_KEYS = ("torch", "devices", "compile", "why", "established")  # the rest of an entry's keys are phases
SPEED_THRESHOLD = 0.2  # the change report's relative speed change where a record has no ratio interval
DOC_HEADER = """# The regression matrix

Generated from the records in `results/matrix` by `python -m harness.matrix table results/matrix > docs/matrix.md`;
`python -m harness.matrix check results/matrix` compares them with `expectations.yaml`. Each cell: the
reproduce outcome, the speed ratio of the fix against its baseline, and the bad fixes rejected; fix and
correct passed, and the fix's memory within its budget, unless the cell says otherwise. Each case has a row eager and a row per compile backend
(`compile=inductor`: harness/compiled.py), side by side. Records come from `nox -s matrix` (docs/matrix_cost.md
for its time and disk cost). Torch 2.13.0 is the local CPU wheel; the others are the registry's CUDA builds,
run on the CPU. No GPU records yet.

"""


def drifts(records: list[Record], expectations: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each way the records depart from the expectations, one line each; empty when none do."""
    found = []
    for record in records:
        where = record.where
        entry = _entry_for(record, expectations.get(record.case, []))
        if entry is None:
            found.append(f"{where}: no expectation covers this record ({record.path})")
            continue
        context = _speed_text(record)
        if _extrapolated(record, entry):
            context += f"; judged by extrapolation from {_entry_text(entry)}"
        for phase, allowed in _expected_statuses(entry).items():
            allowed = [allowed] if isinstance(allowed, str) else list(allowed)
            prefix = phase[:-1] if phase.endswith(":*") else None
            phases = [p for p in record.statuses if p.startswith(prefix)] if prefix else [phase]
            if prefix and not phases:
                found.append(f"{where} {prefix}*: none ran")
            for name in phases:
                got = record.statuses.get(name)
                if got is None:
                    found.append(f"{where} {name}: expected {' or '.join(allowed)}, but the phase did not run")
                elif got not in allowed:
                    found.append(f"{where} {name}: expected {' or '.join(allowed)}, got {got} ({record.messages[name]}){context}")
    return found


def undecided(records: list[Record]) -> list[str]:
    """Each phase whose verdict was inconclusive, one line each: allowed where expected, but not a pass."""
    return [
        f"{record.where} {phase}: {record.messages[phase]}"
        for record in records
        for phase, status in record.statuses.items()
        if status == UNDECIDED
    ]


def extrapolations(records: list[Record], expectations: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One line per record judged by an entry established only on older torch versions than the record's."""
    found = []
    for record in records:
        entry = _entry_for(record, expectations.get(record.case, []))
        if entry is not None and _extrapolated(record, entry):
            found.append(f"{record.where}: judged by {_entry_text(entry)}, newer than all of them")
    return found


def _entry_for(record: Record, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    for entry in entries:
        # prereleases=True: a nightly (2.17.0.dev20250101) falls in ">=2.4" like the release it leads to
        in_range = SpecifierSet(entry["torch"]).contains(Version(record.torch), prereleases=True)
        if in_range and record.device in entry["devices"] and record.compile in entry.get("compile", ["off"]):
            return entry
    return None


def _expected_statuses(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key not in ENTRY_KEYS}


def _extrapolated(record: Record, entry: dict[str, Any]) -> bool:
    established = entry.get("established") or []
    return not established or Version(record.torch) > max(Version(str(version)) for version in established)


def _entry_text(entry: dict[str, Any]) -> str:
    established = sorted((str(version) for version in entry.get("established") or []), key=Version)
    on = f"established on torch {', '.join(established)}" if established else "which names no torch version it was established on"
    modes = entry.get("compile", ["off"])
    compiled = "" if modes == ["off"] else f" (compile {', '.join(modes)})"
    return f"the entry for torch {entry['torch']} on {', '.join(entry['devices'])}{compiled}, {on}"


def _speed_text(record: Record) -> str:
    """'; speed 1.02x [0.98, 1.05]' (the interval where the record has one), or nothing without a ratio."""
    speed = record.figures.get("speed", {})
    return f"; speed {_ratio_text(speed)}" if "ratio" in speed else ""


def _has_interval(speed: dict[str, Any]) -> bool:
    return speed.get("ratio_low") is not None and speed.get("ratio_high") is not None


def table(records: list[Record]) -> str:
    """Markdown: per device, case x torch version, each cell the reproduce outcome and the speed ratio."""
    lines = []
    by_device: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_device[record.device].append(record)
    for device in sorted(by_device):
        device_records = by_device[device]
        versions = sorted({record.torch for record in device_records}, key=Version)
        cells = {(record.case, record.compile, record.torch): record for record in device_records}
        lines += [
            f"### {device}",
            "",
            "| case | compile | " + " | ".join(f"torch {v}" for v in versions) + " |",
            "|---" * (len(versions) + 2) + "|",
        ]
        for case, mode in sorted(
            {(record.case, record.compile) for record in device_records}, key=lambda key: (key[0], key[1] != "off", key[1])
        ):
            row = [_cell(cells.get((case, mode, version))) for version in versions]
            lines.append(f"| `{case}` | {'eager' if mode == 'off' else mode} | " + " | ".join(row) + " |")
        inconclusive = undecided(device_records)
        lines += ["", f"Speed verdicts inconclusive (ok, not a pass): {len(inconclusive)} of {len(device_records)} records."]
        lines += [
            "",
            "Where behaviour changed between adjacent versions (the outcome, or the failure's text beyond generated names and locations):",
            "",
        ]
        changes = _changes(device_records, versions)
        lines += changes or ["- nowhere: every case behaves the same on every version"]
        lines.append("")
    return "\n".join(lines)


def _cell(record: Record | None) -> str:
    if record is None:
        return "not run"
    parts = [record.statuses.get("reproduce", "-")]
    speed = record.figures.get("speed", {})
    if "ratio" in speed:
        interval = f" [{speed['ratio_low']:.2f}, {speed['ratio_high']:.2f}]" if speed.get("ratio_high") is not None else ""
        parts.append(f"{speed['ratio']:.2f}x{interval}")
    slow = [status for phase, status in record.statuses.items() if phase.startswith("slow_fix:") and status != "no_budget"]
    if slow:
        parts.append(f"{slow.count('flagged')}/{len(slow)} slow fixes flagged")
    bad = [status for phase, status in record.statuses.items() if phase.startswith("bad_fix:")]
    if bad:
        parts.append(f"{bad.count('rejected')}/{len(bad)} bad fixes rejected")
    others = [f"**{phase}: {status}**" for phase, status in record.statuses.items() if phase in ("fix", "correct") and status != "passed"]
    if record.statuses.get("speed") == "over_budget":
        others.append("**over budget**")
    if record.statuses.get("speed") == UNDECIDED:
        others.append("_inconclusive_")
    if record.statuses.get("memory") in ("over_budget", UNDECIDED):
        others.append(f"**memory {record.statuses['memory'].replace('_', ' ')}**")
    return ", ".join(parts + others)


def _changes(records: list[Record], versions: list[str]) -> list[str]:
    lines = []
    for case, mode in sorted({(record.case, record.compile) for record in records}):
        by_version = {record.torch: record for record in records if (record.case, record.compile) == (case, mode)}
        present = [v for v in versions if v in by_version]
        compiled = "" if mode == "off" else f" under {mode}"
        for older, newer in zip(present, present[1:]):
            if _behaviour_key(by_version[older]) != _behaviour_key(by_version[newer]):
                before, after = _behaviour(by_version[older]), _behaviour(by_version[newer])
                lines.append(f"- `{case}`{compiled}, torch {older} -> {newer}: {before} -> {after}")
    return lines


def _behaviour(record: Record) -> str:
    status = record.statuses.get("reproduce", "-")
    error = _symptom_text(record)
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


def _behaviour_key(record: Record) -> tuple[str, str | None]:
    return record.statuses.get("reproduce", "-"), folded(_symptom_text(record))


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _symptom_text(record: Record) -> str | None:
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
            if folded(_symptom_text(before)) != folded(_symptom_text(after)):
                lines += ["- symptom text:", f"  - before: {_symptom(before)}", f"  - after: {_symptom(after)}"]
    speed_change = _speed_change(before.figures.get("speed", {}), after.figures.get("speed", {}), threshold)
    if speed_change:
        lines.append(
            f"- speed: {speed_change} (status {before.statuses.get('speed', 'not run')} -> {after.statuses.get('speed', 'not run')})"
        )
    return lines


def _symptom(record: Record) -> str:
    error = _symptom_text(record)
    return _code(error) if error else "none (no error recorded)"


def _speed_change(was: dict[str, Any], now: dict[str, Any], threshold: float) -> str | None:
    """How the speed ratio moved, when it moved beyond the noise; None when it did not."""
    if "ratio" not in was and "ratio" not in now:
        return None
    if "ratio" not in was or "ratio" not in now:
        return f"{_ratio_text(was)} -> {_ratio_text(now)}"
    if _has_interval(was) and _has_interval(now):
        if now["ratio_low"] > was["ratio_high"] or now["ratio_high"] < was["ratio_low"]:
            return f"{_ratio_text(was)} -> {_ratio_text(now)}: the intervals no longer overlap"
        return None
    relative = now["ratio"] / was["ratio"] - 1 if was["ratio"] else float("inf")
    if abs(relative) <= threshold:
        return None
    return f"{_ratio_text(was)} -> {_ratio_text(now)} ({relative:+.0%}): beyond the {threshold:.0%} threshold used where a record has no interval"


def _ratio_text(speed: dict[str, Any]) -> str:
    if "ratio" not in speed:
        return "not measured"
    interval = f" [{speed['ratio_low']:.2f}, {speed['ratio_high']:.2f}]" if _has_interval(speed) else ""
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


def _versions(records: list[Record]) -> str:
    return ", ".join(sorted({record.torch for record in records}, key=Version))


def main(argv: list[str] | None = None) -> int:
    """Exit 0: no drift (check), or no change (changes); 1: a drift, or a change; 2: bad input."""
    parser = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("check", "table", "margins"):
        command = commands.add_parser(name)
        command.add_argument("records", type=Path, help="folder holding result records, searched recursively")
        command.add_argument("--expectations", type=Path, default=EXPECTATIONS)
    command = commands.add_parser("changes", help="markdown: what changed from the records in OLD to those in NEW")
    command.add_argument("old", type=Path, help="folder of the earlier records (per case and device its newest torch is compared)")
    command.add_argument("new", type=Path, help="folder of the later records")
    command.add_argument(
        "--threshold", type=float, default=SPEED_THRESHOLD, help="relative speed change reported where a record has no interval"
    )
    args = parser.parse_args(argv)
    folders = [args.old, args.new] if args.command == "changes" else [args.records]
    loaded = []
    for folder in folders:
        if not folder.is_dir():
            print(f"error: {folder} is not a folder of records", file=sys.stderr)
            return 2
        try:
            loaded.append(load_records(folder))
        except RecordFormatError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if not loaded[-1]:
            print(f"error: no harness records under {folder}", file=sys.stderr)
            return 2
    if args.command == "changes":
        old, new = loaded
        found = changes(old, new, args.threshold)
        if not found:
            print(f"no change from torch {_versions(old)} ({args.old}) to torch {_versions(new)} ({args.new}), {len(new)} records")
            return 0
        print(f"## What changed from torch {_versions(old)} to torch {_versions(new)}\n\n`{args.old}` -> `{args.new}`\n")
        print("\n".join(found), end="")
        return 1
    records = loaded[0]
    if args.command == "table":
        print(DOC_HEADER + table(records) + "\n" + control_margins.table(control_margins.margins(records)), end="")
        return 0
    if args.command == "margins":
        short, counts = control_margins.report(control_margins.margins(records))
        for line in short:
            print(f"SHORT {line}")
        print(f"{len(records)} records, controls: " + ", ".join(f"{count} {standing}" for standing, count in sorted(counts.items())))
        return 1 if short else 0
    expectations = yaml.safe_load(args.expectations.read_text())
    extrapolated = extrapolations(records, expectations)
    for line in extrapolated:
        print(f"EXTRAPOLATED {line}")
    found = drifts(records, expectations)
    for line in found:
        print(f"DRIFT {line}")
    inconclusive = undecided(records)
    for line in inconclusive:
        print(f"UNDECIDED {line}")
    print(
        f"{len(records)} records, {len(found)} drifts from {args.expectations.name}, "
        f"{len(extrapolated)} judged by extrapolation, {len(inconclusive)} inconclusive speed verdicts"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
