"""The figures' data, read from a case's records: memory per step, speed per torch version, bad fixes' errors."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from harness.cases import DEVICES
from harness.matrix import Record
from harness.teach.common import Sources, _by_version
from harness.teach.figures import BadFixError, MemorySeries, SpeedPoint, bad_fix_figure, memory_figure, speed_figure


def case_figures(name: str, sources: Sources) -> dict[str, bytes]:
    files = {}
    points = speed_points(sources.records)
    if points:
        files[f"{name}.speed.png"] = speed_figure(name, points, _budgets(sources.config))
    errors, where = bad_fix_errors(sources.records)
    if errors:
        files[f"{name}.bad_fixes.png"] = bad_fix_figure(name, errors, where)
    series, where = memory_series(sources.records) if _memory_budgeted(sources.config) else ([], "")
    if series:
        files[f"{name}.memory.png"] = memory_figure(name, series, where)
    return files


def _memory_budgeted(config: dict[str, Any]) -> bool:
    """A case whose yaml judges memory (a `memory.budget` for some device) gets the memory figure."""
    budget = (config.get("memory") or {}).get("budget") or {}
    return any(value is not None for value in budget.values())


def memory_series(records: list[Record]) -> tuple[list[MemorySeries], str]:
    """Retained and peak memory per step of buggy (a `Growth` reproduce), the baseline, the fix and each memory
    control, from the newest eager record of the first device that has them."""
    for device in DEVICES:
        mine = _by_version(
            [
                record
                for record in records
                if record.device == device and record.compile == "off" and "retained" in record.figures.get("memory", {})
            ]
        )
        if not mine:
            continue
        newest = mine[-1]
        memory = newest.figures["memory"]
        found = [("baseline", memory["baseline"]), ("fixed", memory)]
        if "retained" in newest.figures.get("reproduce", {}):
            found.insert(0, ("buggy", newest.figures["reproduce"]))
        found += [
            (f"memory control {phase.removeprefix('memory_fix:')}", figures)
            for phase, figures in newest.figures.items()
            if phase.startswith("memory_fix:") and "retained" in figures
        ]
        return [
            MemorySeries(label, figures["retained"], figures["peak"], figures["slope"]) for label, figures in found
        ], f"{device}, torch {newest.torch}"
    return [], ""


def speed_points(records: list[Record]) -> list[SpeedPoint]:
    points = []
    for record in records:
        figures = record.figures.get("speed", {})
        if not isinstance(figures.get("ratio"), (int, float)):
            continue
        points.append(
            SpeedPoint(
                record.device,
                record.torch,
                record.statuses["speed"],
                figures["ratio"],
                figures.get("ratio_low"),
                figures.get("ratio_high"),
                figures.get("budget"),
                figures.get("level"),
            )
        )
    return sorted(points, key=lambda point: (point.device, Version(point.torch)))


def bad_fix_errors(records: list[Record]) -> tuple[list[BadFixError], str]:
    """The relative error of each bad fix that returns, on the newest torch of the first device with any."""
    for device in DEVICES:
        mine = _by_version([record for record in records if record.device == device])
        if not mine:
            continue
        newest = mine[-1]
        errors = [
            BadFixError(phase.removeprefix("bad_fix:"), figures["relative_error"], figures.get("snr_db"))
            for phase, figures in newest.figures.items()
            if phase.startswith("bad_fix:") and isinstance(figures.get("relative_error"), (int, float))
        ]
        if errors:
            return errors, f"{device}, torch {newest.torch}"
    return [], ""


def _budgets(config: dict[str, Any]) -> dict[str, float]:
    budget = (config.get("speed") or {}).get("budget") or {}
    return {device: float(value) for device, value in budget.items() if value is not None}  # null: not measured on that device
