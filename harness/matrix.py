"""The regression matrix: compare result records with the checked-in expectations, and tabulate them.

    python -m harness.matrix check results/matrix   # exit 1, naming case, torch, device and phase, on any drift
    python -m harness.matrix table results/matrix   # the markdown table of docs/matrix.md

Records are the JSON files the harness writes (one per case and device), found recursively.
`expectations.yaml` says, per case, for a torch version range and devices, which status each phase
must end with; the first entry that matches a record applies. A record no entry covers is a drift
too: an expectation is established by running the matrix, never assumed.
Needs only PyYAML and packaging (no torch), so a CI gate can run it on records it downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

EXPECTATIONS = Path(__file__).resolve().parent.parent / "expectations.yaml"
EVERY_BAD_FIX = "bad_fix:*"  # an expectation key ending in ":*" covers every phase with that prefix (bad_fix:*, slow_fix:*)
UNDECIDED = "inconclusive"  # a speed verdict whose interval straddles the budget: never a pass, listed apart
DOC_HEADER = """# The regression matrix

Generated from the records in `results/matrix` by `python -m harness.matrix table results/matrix > docs/matrix.md`;
`python -m harness.matrix check results/matrix` compares them with `expectations.yaml`. Each cell: the
reproduce outcome, the speed ratio of the fix against its baseline, and the bad fixes rejected; fix and
correct passed unless the cell says otherwise. Records come from `nox -s matrix` (docs/matrix_cost.md for
its time and disk cost). Torch 2.13.0 is the local CPU wheel; the others are the registry's CUDA builds,
run on the CPU. No GPU records yet.

"""


@dataclass(frozen=True)
class Record:
    case: str
    device: str
    torch: str  # public version, e.g. "2.4.1" for "2.4.1+cu121"
    statuses: dict[str, str]  # phase -> status
    messages: dict[str, str]
    figures: dict[str, dict[str, Any]]
    path: Path


def load_records(folder: Path) -> list[Record]:
    records = []
    for path in sorted(folder.rglob("*.json")):
        data = json.loads(path.read_text())
        if not {"case", "device", "phases", "environment"} <= data.keys():
            continue  # not a harness record (e.g. a benchmark file)
        phases = data["phases"]
        records.append(
            Record(
                case=data["case"],
                device=data["device"],
                torch=Version(data["environment"]["torch"]).public,
                statuses={phase["phase"]: phase["status"] for phase in phases},
                messages={phase["phase"]: phase["message"] for phase in phases},
                figures={phase["phase"]: phase["figures"] for phase in phases},
                path=path,
            )
        )
    return records


def drifts(records: list[Record], expectations: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each way the records depart from the expectations, one line each; empty when none do."""
    found = []
    for record in records:
        where = f"{record.case} torch {record.torch} {record.device}"
        expected = _expectation_for(record, expectations.get(record.case, []))
        if expected is None:
            found.append(f"{where}: no expectation covers this record ({record.path})")
            continue
        for phase, allowed in expected.items():
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
                    found.append(f"{where} {name}: expected {' or '.join(allowed)}, got {got} ({record.messages[name]})")
    return found


def undecided(records: list[Record]) -> list[str]:
    """Each phase whose verdict was inconclusive, one line each: allowed where expected, but not a pass."""
    return [
        f"{record.case} torch {record.torch} {record.device} {phase}: {record.messages[phase]}"
        for record in records
        for phase, status in record.statuses.items()
        if status == UNDECIDED
    ]


def _expectation_for(record: Record, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    for entry in entries:
        if Version(record.torch) in SpecifierSet(entry["torch"]) and record.device in entry["devices"]:
            return {key: value for key, value in entry.items() if key not in ("torch", "devices", "why")}
    return None


def table(records: list[Record]) -> str:
    """Markdown: per device, case x torch version, each cell the reproduce outcome and the speed ratio."""
    lines = []
    by_device: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_device[record.device].append(record)
    for device in sorted(by_device):
        device_records = by_device[device]
        versions = sorted({record.torch for record in device_records}, key=Version)
        cells = {(record.case, record.torch): record for record in device_records}
        lines += [f"### {device}", "", "| case | " + " | ".join(f"torch {v}" for v in versions) + " |", "|---" * (len(versions) + 1) + "|"]
        for case in sorted({record.case for record in device_records}):
            row = [_cell(cells.get((case, version))) for version in versions]
            lines.append(f"| `{case}` | " + " | ".join(row) + " |")
        inconclusive = undecided(device_records)
        lines += ["", f"Speed verdicts inconclusive (ok, not a pass): {len(inconclusive)} of {len(device_records)} records."]
        lines += ["", "Where behaviour changed between adjacent versions:", ""]
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
    return ", ".join(parts + others)


def _changes(records: list[Record], versions: list[str]) -> list[str]:
    lines = []
    for case in sorted({record.case for record in records}):
        by_version = {record.torch: record for record in records if record.case == case}
        present = [v for v in versions if v in by_version]
        for older, newer in zip(present, present[1:]):
            before, after = _behaviour(by_version[older]), _behaviour(by_version[newer])
            if before != after:
                lines.append(f"- `{case}`, torch {older} -> {newer}: {before} -> {after}")
    return lines


def _behaviour(record: Record) -> str:
    status = record.statuses.get("reproduce", "-")
    error = record.figures.get("reproduce", {}).get("error")
    return f"{status} ({error})" if error else status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("check", "table"))
    parser.add_argument("records", type=Path, help="folder holding result records, searched recursively")
    parser.add_argument("--expectations", type=Path, default=EXPECTATIONS)
    args = parser.parse_args(argv)
    if not args.records.is_dir():
        print(f"error: {args.records} is not a folder of records", file=sys.stderr)
        return 2
    records = load_records(args.records)
    if not records:
        print(f"error: no harness records under {args.records}", file=sys.stderr)
        return 2
    if args.command == "table":
        print(DOC_HEADER + table(records), end="")
        return 0
    found = drifts(records, yaml.safe_load(args.expectations.read_text()))
    for line in found:
        print(f"DRIFT {line}")
    inconclusive = undecided(records)
    for line in inconclusive:
        print(f"UNDECIDED {line}")
    print(f"{len(records)} records, {len(found)} drifts from {args.expectations.name}, {len(inconclusive)} inconclusive speed verdicts")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
