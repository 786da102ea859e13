"""What a person reads: the case's story, then the evidence, phase by phase."""

from __future__ import annotations

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
