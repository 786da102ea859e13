"""The grade's last check: the project's sources unchanged, nothing written outside the sandbox, nothing left running."""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.cases import ROOT
from harness.grading.common import PROJECT_SOURCES
from harness.process.submitted import SUBMITTED_KEY, Submission, file_sha256, import_file, submission_of  # noqa: F401 - file_sha256 for run.py
from harness.records import CaseRecord, PhaseRecord
from harness.statuses import Integrity


def project_sources() -> dict[str, bytes]:
    """The harness's, the cases' and the configs' files, by path relative to the project root."""
    return {
        str(path.relative_to(ROOT)): path.read_bytes()
        for pattern in PROJECT_SOURCES
        for path in sorted(ROOT.glob(pattern))
        if path.is_file()
    }


def integrity(before: dict[str, bytes], record: CaseRecord, displaced: Path | None = None) -> PhaseRecord:
    """After grading: the project's sources byte-identical (a changed file is restored, and rejects the fix), no
    write outside a child's scratch directory attempted, no process of the submission left running. What a restore
    overwrites or removes is kept under `displaced` (the grade's output folder), as the grade found it: the change
    may be a person's own edit made while the grade ran, not the submission's."""
    changed = _restore(before, project_sources(), displaced)
    figures = _figures(before, changed, record)
    refused, left = figures["refused_writes"], figures["left_behind"]
    if changed:
        return PhaseRecord(
            "integrity",
            Integrity.TAMPERED,
            False,
            f"the grade changed {', '.join(changed[:3])}: restored from the copy read before grading"
            + (f"; what it found is kept in {displaced}" if displaced is not None else ""),
            figures,
        )
    signals = [line.removeprefix("kill ") for line in refused if line.startswith("kill ")]
    if signals:
        return PhaseRecord(
            "integrity",
            Integrity.SIGNALLED_OUTSIDE_SANDBOX,
            False,
            f"the submission tried to signal a process outside its own (refused): {'; '.join(signals[:3])}",
            figures,
        )
    if refused:
        return PhaseRecord(
            "integrity",
            Integrity.WROTE_OUTSIDE_SANDBOX,
            False,
            f"the submission tried to write outside its scratch directory (refused): {'; '.join(refused[:3])}",
            figures,
        )
    if left:
        return PhaseRecord(
            "integrity",
            Integrity.LEFT_PROCESSES,
            False,
            f"the submission left {len(left)} process(es) running after its call (killed): {left[0]}",
            figures,
        )
    return PhaseRecord(
        "integrity",
        Integrity.PASSED,
        True,
        f"{len(before)} project sources unchanged (sha256 {figures['sources_sha256'][:12]}); no write outside the sandbox; no process left",
        figures,
    )


def _restore(before: dict[str, bytes], after: dict[str, bytes], displaced: Path | None) -> list[str]:
    """The sources that differ from the copy read before grading, each put back as it was (and what was there kept
    under `displaced`)."""
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    for path in changed:
        target = ROOT / path
        if displaced is not None and path in after:
            (displaced / path).parent.mkdir(parents=True, exist_ok=True)
            (displaced / path).write_bytes(after[path])
        if path in before:
            target.write_bytes(before[path])
        else:
            target.unlink(missing_ok=True)
    return changed


def _figures(before: dict[str, bytes], changed: list[str], record: CaseRecord) -> dict:
    refused = list(dict.fromkeys(line for phase in record.phases for line in phase.figures.get("refused_writes", [])))
    left = list(dict.fromkeys(line for phase in record.phases for line in phase.figures.get("left_behind", [])))
    confinement = next((phase.figures["confinement"] for phase in record.phases if phase.figures.get("confinement")), None)
    return {
        "sources": len(before),
        "source_sha256": {path: hashlib.sha256(data).hexdigest() for path, data in sorted(before.items())},
        "sources_sha256": hashlib.sha256(
            b"".join(path.encode() + hashlib.sha256(data).digest() for path, data in sorted(before.items()))
        ).hexdigest(),
        "changed": changed,
        "refused_writes": refused,
        "left_behind": left,
        "confinement": confinement,
    }
