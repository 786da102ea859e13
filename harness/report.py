"""What a person reads: the case's story, then the evidence, phase by phase."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.cases import case_text, load_case
from harness.records import CaseRecord, PhaseRecord

MAX_DETAIL_CHARS = 160


def print_progress(console: Console, case: str, device: str, phase: str, record: PhaseRecord | None) -> None:
    if record is None:
        console.print(f"[dim]{case} on {device}: {phase} ...[/dim]")
    else:
        mark = "[green]ok[/green]" if record.ok else "[red]FAIL[/red]"
        console.print(f"[dim]{case} on {device}:[/dim] {record.phase} {mark} {record.status} [dim]({record.seconds:.2f} s)[/dim]")


def print_report(console: Console, record: CaseRecord, path: Path) -> None:
    text = case_text(load_case(record.case))
    console.rule(f"[bold]{record.case}[/bold] on {record.device}")
    console.print(f"[bold]{escape(text.title)}[/bold]")
    console.print(f"[dim]{escape(text.sections['Upstream'])}[/dim]")
    console.print(f"Fidelity: {escape(text.sections['Fidelity'])}\n")
    for device in ("CUDA", "CPU"):
        console.print(f"[bold]Symptom on {device}[/bold] (upstream):")
        console.print(escape(text.sections[f"Symptom on {device}"]), highlight=False)
    seen = next((phase for phase in record.phases if phase.phase == "reproduce"), None)
    if seen is not None:
        console.print(f"[bold]Seen here[/bold] ({record.device}, torch {record.environment.get('torch')}): {escape(seen.message)}", highlight=False)
        for key in ("output_line", "raised_at", "unrelated_op_after_error"):
            if seen.figures.get(key):
                console.print(f"  {key.replace('_', ' ')}: {escape(str(seen.figures[key]))}", highlight=False)
    console.print(f"\n[bold]Cause:[/bold] {escape(text.sections['Cause'])}")
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
            phase.status,
            "[green]yes[/green]" if phase.ok else "[red]NO[/red]",
            escape(_shorten(phase.message)),
            f"{phase.seconds:.2f}",
        )
    console.print(table)
    verdict = "[green]every phase met its expectation[/green]" if record.ok else "[red]some phase missed its expectation[/red]"
    console.print(f"{verdict}; record: {path}")


def _shorten(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_DETAIL_CHARS else message[: MAX_DETAIL_CHARS - 1] + "…"


def print_summary(console: Console, records: list[tuple[CaseRecord, Path]]) -> None:
    """One line per case run, after a multirun."""
    table = Table(title="summary")
    for column in ("case", "device", "ok", "reproduce", "fix", "correct", "speed", "bad fixes"):
        table.add_column(column, no_wrap=True)
    for record, path in records:
        by_phase = {phase.phase: phase for phase in record.phases}
        bad_fixes = [phase for phase in record.phases if phase.phase.startswith("bad_fix:")]
        speed = by_phase.get("speed")
        table.add_row(
            record.case,
            record.device,
            "[green]yes[/green]" if record.ok else "[red]NO[/red]",
            *(by_phase[name].status if name in by_phase else "-" for name in ("reproduce", "fix", "correct")),
            f"{speed.figures['ratio']:.2f}x" + ("" if speed.ok else f" {speed.status}") if speed and "ratio" in speed.figures else (speed.status if speed else "-"),
            f"{sum(p.status == 'rejected' for p in bad_fixes)}/{len(bad_fixes)} rejected" if bad_fixes else "-",
        )
    console.print(table)
    console.print(f"records: {os.path.commonpath([str(path.parent) for _, path in records])}")
