"""The result records of a folder, read back: one `Record` per case, device, torch version and compile mode.

Needs only the standard library and packaging (no torch): the matrix check and the margins run on records a CI job
downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

RECORD_FORMAT = 1  # the JSON layout of a record (harness/records.py); records from before the field existed are format 1


class RecordFormatError(ValueError):
    """A record written by a newer harness, in a layout this one cannot read."""


def check_format(data: dict[str, Any], path: Path) -> int:
    """The record's format version, checked: a missing one is 1 (the layout before records carried it)."""
    version = data.get("format_version", 1)
    if not isinstance(version, int) or not 1 <= version <= RECORD_FORMAT:
        raise RecordFormatError(
            f"{path}: record format {version!r}; this harness reads formats 1 to {RECORD_FORMAT} (a newer harness wrote it?)"
        )
    return version


@dataclass(frozen=True)
class Record:
    case: str
    device: str
    torch: str  # public version, e.g. "2.4.1" for "2.4.1+cu121"
    statuses: dict[str, str]  # phase -> status
    messages: dict[str, str]
    figures: dict[str, dict[str, Any]]
    path: Path
    compile: str = "off"  # torch.compile's backend the record ran under (harness/compiled.py), or off

    @property
    def where(self) -> str:
        """'embedding_oob torch 2.13.0 cpu', with ' inductor' where it ran compiled."""
        return f"{self.case} torch {self.torch} {self.platform}"

    @property
    def platform(self) -> str:
        return self.device if self.compile == "off" else f"{self.device} {self.compile}"


def load_records(folder: Path) -> list[Record]:
    records = []
    for path in sorted(folder.rglob("*.json")):
        data = json.loads(path.read_text())
        if not {"case", "device", "phases", "environment"} <= data.keys():
            continue  # not a harness record (e.g. a benchmark file)
        check_format(data, path)
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
                compile=data.get("compile") or "off",
            )
        )
    return records
