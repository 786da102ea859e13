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
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness import margins as control_margins
from harness.record_changes import SPEED_THRESHOLD, behaviour, behaviour_key, changes, ratio_text
from harness.recordset import Record, RecordFormatError, load_records
from harness.statuses import BadFix, Correct, Memory, SlowControl, Speed

EXPECTATIONS = Path(__file__).resolve().parent.parent / "expectations.yaml"
CASE_CONFIGS = Path(__file__).resolve().parent.parent / "conf" / "case"  # read for `extra_torch` only (PyYAML, no Hydra)
EVERY_BAD_FIX = "bad_fix:*"  # an expectation key ending in ":*" covers every phase with that prefix (bad_fix:*, slow_fix:*)
UNDECIDED = Speed.INCONCLUSIVE  # a speed verdict whose interval straddles the budget: never a pass, listed apart
ENTRY_KEYS = ("torch", "devices", "compile", "why", "established")  # the rest of an entry's keys are phases
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
    return f"; speed {ratio_text(speed)}" if "ratio" in speed else ""


def table(records: list[Record]) -> str:
    """Markdown: per device, case x torch version, each cell the reproduce outcome and the speed ratio."""
    lines = []
    by_device: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_device[record.device].append(record)
    for device in sorted(by_device):
        device_records = by_device[device]
        versions = sorted({record.torch for record in device_records}, key=Version)
        extra = [version for version in versions if version in extra_releases()]
        lines += [f"### {device}", ""]
        lines += _grid(device_records, [version for version in versions if version not in extra])
        if extra:
            lines += ["", "Older releases that cases name for themselves (`extra_torch` in their yaml), each run on those cases alone:", ""]
            lines += _grid([record for record in device_records if record.torch in extra], extra)
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


def extra_releases() -> set[str]:
    """The torch releases cases name beyond the matrix's own (`extra_torch` in conf/case/<case>.yaml)."""
    return {
        str(version) for path in CASE_CONFIGS.glob("*.yaml") for version in (yaml.safe_load(path.read_text()) or {}).get("extra_torch", [])
    }


def _grid(records: list[Record], versions: list[str]) -> list[str]:
    """The markdown rows of case x torch version, a row per case and compile mode, for these versions."""
    cells = {(record.case, record.compile, record.torch): record for record in records}
    lines = ["| case | compile | " + " | ".join(f"torch {v}" for v in versions) + " |", "|---" * (len(versions) + 2) + "|"]
    for case, mode in sorted({(record.case, record.compile) for record in records}, key=lambda key: (key[0], key[1] != "off", key[1])):
        row = [_cell(cells.get((case, mode, version))) for version in versions]
        lines.append(f"| `{case}` | {'eager' if mode == 'off' else mode} | " + " | ".join(row) + " |")
    return lines


def _cell(record: Record | None) -> str:
    if record is None:
        return "not run"
    parts = [record.statuses.get("reproduce", "-")]
    speed = record.figures.get("speed", {})
    if "ratio" in speed:
        interval = f" [{speed['ratio_low']:.2f}, {speed['ratio_high']:.2f}]" if speed.get("ratio_high") is not None else ""
        parts.append(f"{speed['ratio']:.2f}x{interval}")
    slow = [status for phase, status in record.statuses.items() if phase.startswith("slow_fix:") and status != SlowControl.NO_BUDGET]
    judged = [status for status in slow if status != SlowControl.RETRACED]
    if judged:
        parts.append(f"{judged.count(SlowControl.FLAGGED)}/{len(judged)} slow fixes flagged")
    if len(judged) < len(slow):
        parts.append(f"{len(slow) - len(judged)} slow fix not judged (the compiled baseline retraced every call)")
    bad = [status for phase, status in record.statuses.items() if phase.startswith("bad_fix:")]
    if bad:
        parts.append(f"{bad.count(BadFix.REJECTED)}/{len(bad)} bad fixes rejected")
    others = [
        f"**{phase}: {status}**" for phase, status in record.statuses.items() if phase in ("fix", "correct") and status != Correct.PASSED
    ]
    if record.statuses.get("speed") == Speed.OVER_BUDGET:
        others.append("**over budget**")
    if record.statuses.get("speed") == UNDECIDED:
        others.append("_inconclusive_")
    if record.statuses.get("memory") in (Memory.OVER_BUDGET, Memory.INCONCLUSIVE):
        others.append(f"**memory {record.statuses['memory'].replace('_', ' ')}**")
    return ", ".join(parts + others)


def _changes(records: list[Record], versions: list[str]) -> list[str]:
    lines = []
    for case, mode in sorted({(record.case, record.compile) for record in records}):
        by_version = {record.torch: record for record in records if (record.case, record.compile) == (case, mode)}
        present = [v for v in versions if v in by_version]
        compiled = "" if mode == "off" else f" under {mode}"
        for older, newer in zip(present, present[1:]):
            if behaviour_key(by_version[older]) != behaviour_key(by_version[newer]):
                before, after = behaviour(by_version[older]), behaviour(by_version[newer])
                lines.append(f"- `{case}`{compiled}, torch {older} -> {newer}: {before} -> {after}")
    return lines


def _versions(records: list[Record]) -> str:
    return ", ".join(sorted({record.torch for record in records}, key=Version))


def main(argv: list[str] | None = None) -> int:
    """Exit 0: no drift (check), or no change (changes); 1: a drift, or a change; 2: bad input."""
    args = _parser().parse_args(argv)
    loaded = _load([args.old, args.new] if args.command == "changes" else [args.records])
    if loaded is None:
        return 2
    if args.command == "changes":
        return _print_changes(*loaded, args)
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
    return _print_check(records, args.expectations)


def _parser() -> argparse.ArgumentParser:
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
    return parser


def _load(folders: list[Path]) -> list[list[Record]] | None:
    """The records of each folder; None, said on stderr, where one is not a folder of records."""
    loaded = []
    for folder in folders:
        if not folder.is_dir():
            print(f"error: {folder} is not a folder of records", file=sys.stderr)
            return None
        try:
            loaded.append(load_records(folder))
        except RecordFormatError as error:
            print(f"error: {error}", file=sys.stderr)
            return None
        if not loaded[-1]:
            print(f"error: no harness records under {folder}", file=sys.stderr)
            return None
    return loaded


def _print_changes(old: list[Record], new: list[Record], args: argparse.Namespace) -> int:
    found = changes(old, new, args.threshold)
    if not found:
        print(f"no change from torch {_versions(old)} ({args.old}) to torch {_versions(new)} ({args.new}), {len(new)} records")
        return 0
    print(f"## What changed from torch {_versions(old)} to torch {_versions(new)}\n\n`{args.old}` -> `{args.new}`\n")
    print("\n".join(found), end="")
    return 1


def _print_check(records: list[Record], expectations_path: Path) -> int:
    expectations = yaml.safe_load(expectations_path.read_text())
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
        f"{len(records)} records, {len(found)} drifts from {expectations_path.name}, "
        f"{len(extrapolated)} judged by extrapolation, {len(inconclusive)} inconclusive speed verdicts"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
