"""What a person reads: the case's story, then the evidence, phase by phase."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from harness.cases import case_text, load_case
from harness.matrix import UNDECIDED  # ok, but not a pass: shown in yellow and counted apart
from harness.records import CaseRecord, PhaseRecord
from harness.statuses import BadFix, SlowControl, Speed

MAX_DETAIL_CHARS = 160


def _mark(record: PhaseRecord) -> str:
    if not record.ok:
        return "[red]FAIL[/red]"
    return "[yellow]ok?[/yellow]" if record.status == UNDECIDED else "[green]ok[/green]"


def _status(record: PhaseRecord) -> str:
    if not record.ok:
        return f"[red]{record.status}[/red]"
    return f"[yellow]{record.status}[/yellow]" if record.status == UNDECIDED else record.status


def speed_cell(record: PhaseRecord | None) -> str:
    """A speed phase in one cell: ratio [interval], and the verdict unless it is a plain pass."""
    if record is None:
        return "-"
    figures = record.figures
    if "ratio" not in figures:
        return _status(record)
    cell = f"{figures['ratio']:.2f}x"
    if figures.get("ratio_high") is not None:
        cell += f" [{figures['ratio_low']:.2f}, {figures['ratio_high']:.2f}]"
    return cell if record.status in (Speed.WITHIN_BUDGET, Speed.MEASURED) else f"{cell} {_status(record)}"


def print_progress(console: Console, case: str, device: str, phase: str, record: PhaseRecord | None) -> None:
    if record is None:
        console.print(f"[dim]{case} on {device}: {phase} ...[/dim]")
    else:
        console.print(
            f"[dim]{case} on {device}:[/dim] {record.phase} {_mark(record)} {_status(record)} [dim]({record.seconds:.2f} s)[/dim]"
        )


def print_report(console: Console, record: CaseRecord, path: Path, show_fix: bool = True) -> None:
    """`show_fix=False` leaves the case's fix out (a grade not yet accepted: the solution comes after a pass)."""
    case = load_case(record.case)
    text = case_text(case)
    compiled = "" if record.compile == "off" else f", compiled with {record.compile}"
    console.rule(f"[bold]{record.case}[/bold] on {record.device}{compiled}")
    console.print(f"[bold]{escape(text.title)}[/bold]")
    console.print(f"[dim]{escape(text.sections['Upstream'])}[/dim]")
    console.print(f"Fidelity: {escape(text.sections['Fidelity'])}\n")
    for device in ("CUDA", "CPU"):
        console.print(f"[bold]Symptom on {device}[/bold] (upstream):")
        console.print(escape(text.sections[f"Symptom on {device}"]), highlight=False)
    seen = next((phase for phase in record.phases if phase.phase == "reproduce"), None)
    if seen is not None:
        if compiled:
            console.print(f"[bold]Compiled[/bold]: {escape(case.compiled_unit)}", highlight=False)
        console.print(
            f"[bold]Seen here[/bold] ({record.device}, torch {record.environment.get('torch')}{compiled}): {escape(seen.message)}",
            highlight=False,
        )
        for line in seen.figures.get("native_message", []):
            console.print(f"    {escape(line)}", highlight=False)
        for key in ("output_line", "raised_at", "unrelated_op_after_error"):
            if seen.figures.get(key):
                console.print(f"  {key.replace('_', ' ')}: {escape(str(seen.figures[key]))}", highlight=False)
    console.print(f"\n[bold]Cause:[/bold] {escape(text.sections['Cause'])}")
    if show_fix:
        console.print(f"[bold]Fix:[/bold] {escape(text.sections['Fix'])}\n")

    table = Table(show_lines=False)
    table.add_column("phase")
    table.add_column("status")
    table.add_column("ok", justify="center")
    table.add_column("evidence", overflow="fold")
    table.add_column("s", justify="right")
    for phase in record.phases:
        table.add_row(
            phase.phase,
            _status(phase),
            ("[yellow]yes?[/yellow]" if phase.status == UNDECIDED else "[green]yes[/green]") if phase.ok else "[red]NO[/red]",
            escape(_shorten(phase.message)),
            f"{phase.seconds:.2f}",
        )
    console.print(table)
    verdict = "[green]every phase met its expectation[/green]" if record.ok else "[red]some phase missed its expectation[/red]"
    undecided = [phase.phase for phase in record.phases if phase.status == UNDECIDED]
    if undecided:
        verdict += f" [yellow](undecided, not passed: {', '.join(undecided)})[/yellow]"
    console.print(f"{verdict}; record: {path}")


def _shorten(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_DETAIL_CHARS else message[: MAX_DETAIL_CHARS - 1] + "…"


def memory_cell(memory: Any, controls: list) -> str:
    """The memory phase's status, and how many memory controls it flagged."""
    if memory is None:
        return "-"
    flagged = f", {sum(p.status == SlowControl.FLAGGED for p in controls)}/{len(controls)} flagged" if controls else ""
    return memory.status.replace("_", " ") + flagged


def print_summary(console: Console, rows: Sequence[tuple], sweep_dir: Path | None = None) -> None:
    """One line per case run, after a multirun.

    A row is `(record, path)`, or `(record, path, note, status)` for a job read back from a sweep dir:
    `record` and `path` are None when the job left no record, `note` says why it failed without one
    (or before finishing it), `status` is its exit status file (case, device, overrides). The
    overrides that differ between jobs (sizes, options) go under the case's name; notes follow the table.
    """
    notes = [row[2] if len(row) > 2 else None for row in rows]
    statuses = [row[3] if len(row) > 3 else {} for row in rows]
    varying = _varying_overrides([status.get("overrides", []) for status in statuses])
    table = Table(title="summary")
    for column in ("case", "device", "ok", "reproduce", "fix", "correct", "speed", "slow fixes", "bad fixes", "memory"):
        table.add_column(column, no_wrap=True)
    footnotes = []
    undecided = {"speed": 0, "memory": 0}
    for (record, _path, *_), note, status, overrides in zip(rows, notes, statuses, varying):
        case = record.case if record is not None else str(status.get("case", "?"))
        device = record.device if record is not None else str(status.get("device", "?"))
        label = escape(case) + (f"\n[dim]{escape(' '.join(overrides))}[/dim]" if overrides else "")
        if note:
            footnotes.append(f"{escape(' '.join([case, device, *overrides]))}: {escape(_shorten(note))}")
        if record is None:
            table.add_row(label, device, "[red]cut[/red]" if _is_cut(note) else "[red]NO[/red]", *["-"] * 7)
            continue
        for phase in record.phases:
            if phase.status == UNDECIDED:
                undecided["memory" if phase.phase == "memory" or phase.phase.startswith("memory_fix:") else "speed"] += 1
        table.add_row(label, device, *_cells(record, note))
    _print_whole(console, table)
    _print_caveats(console, undecided, sum(_is_cut(note) for note in notes))
    for footnote in footnotes:
        console.print(f"[red]{'cut' if _is_cut(footnote.partition(': ')[2]) else 'NO'}[/red] {footnote}", highlight=False)
    paths = [str(row[1].parent) for row in rows if row[1] is not None]
    where = sweep_dir if sweep_dir is not None else (os.path.commonpath(paths) if paths else None)
    if where is not None:
        console.print(f"records: {where}")


def _cells(record, note: str | None) -> list[str]:
    """A finished job's cells, from "ok" on."""
    by_phase = {phase.phase: phase for phase in record.phases}
    bad_fixes = [phase for phase in record.phases if phase.phase.startswith("bad_fix:")]
    slow_fixes = [
        phase
        for phase in record.phases
        if phase.phase.startswith("slow_fix:") and phase.status not in (SlowControl.NO_BUDGET, SlowControl.RETRACED)
    ]
    retraced = any(phase.status == SlowControl.RETRACED for phase in record.phases)
    return [
        "[green]yes[/green]" if record.ok and not note else "[red]cut[/red]" if _is_cut(note) else "[red]NO[/red]",
        *(by_phase[name].status if name in by_phase else "-" for name in ("reproduce", "fix", "correct")),
        speed_cell(by_phase.get("speed")),
        f"{sum(p.status == SlowControl.FLAGGED for p in slow_fixes)}/{len(slow_fixes)} flagged"
        if slow_fixes
        else "retraced"
        if retraced
        else "-",
        f"{sum(p.status == BadFix.REJECTED for p in bad_fixes)}/{len(bad_fixes)} rejected" if bad_fixes else "-",
        memory_cell(
            by_phase.get("memory"),
            [phase for phase in record.phases if phase.phase.startswith("memory_fix:") and phase.status != SlowControl.NO_BUDGET],
        ),
    ]


def _print_caveats(console: Console, undecided: dict[str, int], cut: int) -> None:
    if undecided["speed"]:
        console.print(
            f"[yellow]{undecided['speed']} speed verdict(s) inconclusive[/yellow]: ok, but not a pass; rerun, or raise speed.max_s"
        )
    if undecided["memory"]:
        console.print(
            f"[yellow]{undecided['memory']} memory verdict(s) inconclusive[/yellow]: ok, but not a pass; rerun, or raise case.memory.steps"
        )
    if cut:
        console.print(
            f"[red]{cut} job(s) cut[/red] before they finished (cancelled, out of time, killed): not a verdict on the case; each record keeps the phases before the cut"
        )


def _is_cut(note: str | None) -> bool:
    return bool(note) and note.startswith("cut")  # harness/sweep.py's SweepJob.note for a job stopped from outside


def _print_whole(console: Console, table: Table) -> None:
    """Print the table at its natural width even where the terminal is narrower: a long line wraps
    in the terminal, whereas rich would cut case names and statuses short to fit."""
    natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    width = console.width
    console.width = natural
    try:
        console.print(table)
    finally:
        console.width = width


def _varying_overrides(per_job: list[list[str]]) -> list[list[str]]:
    """Each job's overrides that not every job shares, less case= and device= (columns of their own)."""
    shared = set.intersection(*map(set, per_job)) if per_job else set()
    return [[o for o in overrides if o not in shared and not o.startswith(("case=", "device="))] for overrides in per_job]
