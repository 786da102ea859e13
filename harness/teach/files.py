"""Writing the generated files, and naming the ones out of sync (--check)."""

from __future__ import annotations

from pathlib import Path

from harness.cases import ROOT
from harness.teach.common import GENERATED_SUFFIXES
from harness.teach.figures import same_figure


def stale(files: dict[str, str | bytes], folder: Path, *, every_case: bool) -> list[str]:
    """Why each file in `folder` differs from `files`, one line each; empty when in sync."""
    problems = []
    for file_name, content in sorted(files.items()):
        path = folder / file_name
        if not path.is_file():
            problems.append(f"{_shown(path)}: missing")
        elif isinstance(content, bytes):
            same, how = same_figure(path.read_bytes(), content)
            if not same:
                problems.append(f"{_shown(path)}: figure differs ({how})")
        elif path.read_text() != content:
            problems.append(f"{_shown(path)}: differs")
    if every_case:
        problems += [f"{_shown(path)}: not generated any more" for path in _leftovers(files, folder)]
    return problems


def write(files: dict[str, str | bytes], folder: Path, *, every_case: bool) -> list[str]:
    """Write what changed (a figure only when `same_figure` says it differs); the names written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, content in sorted(files.items()):
        path = folder / file_name
        if isinstance(content, bytes):
            if path.is_file() and same_figure(path.read_bytes(), content)[0]:
                continue
            path.write_bytes(content)
        else:
            if path.is_file() and path.read_text() == content:
                continue
            path.write_text(content)
        written.append(file_name)
    if every_case:
        for path in _leftovers(files, folder):
            path.unlink()
            written.append(f"{path.name} (removed)")
    return written


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _leftovers(files: dict[str, str | bytes], folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if path.suffix in GENERATED_SUFFIXES and path.name not in files)
