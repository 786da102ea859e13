"""docs/cases/README.md: one row per case."""

from __future__ import annotations

import yaml

from harness.cases import CASE_CONFIG_DIR
from harness.matrix import Record
from harness.teach.common import NOTICE, _by_version
from harness.teach.summary import summary


def index(names: list[str], records: list[Record], compiled: list[Record] = ()) -> str:
    lines = [
        "# The cases, for learners and lecturers",
        "",
        NOTICE,
        "",
        "Each case has a page (the story, the symptoms per device as upstream reported them and as the harness saw them, "
        "the buggy code against the fix, the evidence and figures, and how to try it) and a notebook to run top to bottom "
        "from a clone (it picks CUDA when present).",
        "",
        "| case | what goes wrong | CPU: the failure per torch | CPU, compiled (inductor) | CUDA | notebook |",
        "|---|---|---|---|---|---|",
    ]
    configs = {name: yaml.safe_load((CASE_CONFIG_DIR / f"{name}.yaml").read_text()) for name in names}
    for name in names:
        title = summary(name, configs[name]).title
        cells = []
        for device, source in (
            ("cpu", records),
            ("cpu", [record for record in compiled if record.compile == "inductor"]),
            ("cuda", records),
        ):
            mine = _by_version([record for record in source if record.case == name and record.device == device])
            cells.append(_reproduce_summary(mine) if mine else "not yet run")
        lines.append(f"| [`{name}`]({name}.md) | {title} | {' | '.join(cells)} | [{name}.ipynb]({name}.ipynb) |")
    lines += [
        "",
        "Regenerate with `python -m harness.teach`; `python -m harness.teach --check` (and `tests/test_teach.py`) keeps this folder in sync.",
        "",
    ]
    return "\n".join(lines)


def _reproduce_summary(records: list[Record]) -> str:
    """The reproduce status over runs of adjacent torch versions, e.g. "reproduced on 2.3.1; fixed upstream on 2.4.1 to 2.15.0"."""
    runs: list[tuple[str, list[str]]] = []
    for record in records:
        status = record.statuses.get("reproduce", "-").replace("_", " ")
        if runs and runs[-1][0] == status:
            runs[-1][1].append(record.torch)
        else:
            runs.append((status, [record.torch]))
    return "; ".join(f"{status} on {versions[0]}" + (f" to {versions[-1]}" if len(versions) > 1 else "") for status, versions in runs)
