"""Teaching material generated from the cases and their records: a page, a notebook and figures per case.

    python -m harness.teach            # write docs/cases/<name>.md, <name>.ipynb, <name>.*.png and docs/cases/README.md
    python -m harness.teach --check    # exit 1, naming each file, when what is committed differs from what would be written

Inputs: the case module (docstring, buggy, fixed, reference, bad_fixes), conf/case/<name>.yaml, and the
result records under results/matrix (read with harness.matrix.load_records). Pages and notebooks must
match byte for byte; a figure must have the same pixels when the same matplotlib drew it, else the same
size (harness/teach/figures.py says why), and its data is printed in the page as a table. A page opens with the
yaml's short `title` and a box of three lines, what you see, why, the fix (harness/teach/summary.py); each bad fix
says where it comes from, read from its docstring: the threads it links, "generic attempt", or not stated.

Exit status: 0 written, or in sync; 1 out of sync (--check); 2 bad arguments (an unknown case, no records).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from harness.cases import CASE_CONFIG_DIR, ROOT, case_names
from harness.matrix import load_records
from harness.teach.common import DOCS, GRADE_OPTIONS, RECORDS, Sources
from harness.teach.files import stale, write
from harness.teach.index import index
from harness.teach.notebook import notebook
from harness.teach.page import _figures_section, bad_fixes_heading, page
from harness.teach.series import case_figures

__all__ = ["DOCS", "RECORDS", "Sources", "_figures_section", "bad_fixes_heading", "case_figures", "main", "material", "stale"]

EXIT_OK, EXIT_STALE, EXIT_USAGE = 0, 1, 2


def material(names: list[str], records_folder: Path) -> dict[str, str | bytes]:
    """File name under docs/cases -> content, for the given cases and the index."""
    every = load_records(records_folder) if records_folder.is_dir() else []
    records = [record for record in every if record.compile == "off"]
    configs = {name: yaml.safe_load((CASE_CONFIG_DIR / f"{name}.yaml").read_text()) for name in case_names()}
    top = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    landed = all(option in top for option in GRADE_OPTIONS)
    any_hints = any(config.get("hints") for config in configs.values())
    files: dict[str, str | bytes] = {}
    for name in names:
        compiled = tuple(record for record in every if record.case == name and record.compile != "off")
        sources = Sources(configs[name], [record for record in records if record.case == name], landed, any_hints, compiled)
        figures = case_figures(name, sources)
        files.update(figures)
        files[f"{name}.md"] = page(name, sources, sorted(figures))
        files[f"{name}.ipynb"] = notebook(name)
    files["README.md"] = index(case_names(), records, [record for record in every if record.compile != "off"])
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.teach", description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="cases to generate (default: every case, and stale files removed)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if any file differs from what would be written")
    parser.add_argument("--records", type=Path, default=RECORDS, help="folder of result records, searched recursively")
    parser.add_argument("--out", type=Path, default=DOCS, help="folder to write into")
    args = parser.parse_args(argv)
    unknown = [name for name in args.cases if name not in case_names()]
    if unknown:
        print(f"error: no case named {', '.join(unknown)}; cases: {', '.join(case_names())}", file=sys.stderr)
        return EXIT_USAGE
    if not args.records.is_dir():
        print(f"error: {args.records} is not a folder of records", file=sys.stderr)
        return EXIT_USAGE
    every_case = not args.cases
    files = material(args.cases or case_names(), args.records)
    out = args.out.resolve()
    if args.check:
        problems = stale(files, out, every_case=every_case)
        for problem in problems:
            print(f"STALE {problem}")
        print(f"{len(files)} files, {len(problems)} out of sync" + ("; regenerate with python -m harness.teach" if problems else ""))
        return EXIT_STALE if problems else EXIT_OK
    written = write(files, out, every_case=every_case)
    print(f"{len(files)} files in {out}, {len(written)} written" + (": " + ", ".join(written) if written else ""))
    return EXIT_OK
