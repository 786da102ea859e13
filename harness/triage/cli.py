"""`python -m harness.triage [PATH|-] [--json]`: read a log, print the verdict (harness/triage/__init__.py says how it is made).

Exit status: 0 when the log was read (whether or not a case matched), 2 when it could not be read (missing file, a
directory, binary data); the reason goes to stderr on one line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.triage import CONTRADICTED, EVIDENCED, NOT_KNOWN, Verdict, triage


class UnreadableInput(Exception):
    """The log could not be read: the message says why, on one line."""


def read_log(source: str) -> str:
    if source == "-":
        data = sys.stdin.buffer.read()
        where = "stdin"
    else:
        path = Path(source)
        where = str(path)
        if path.is_dir():
            raise UnreadableInput(f"{where} is a directory, not a log file")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise UnreadableInput(f"{where}: no such file") from None
        except OSError as error:
            raise UnreadableInput(f"{where}: {error.strerror or error}") from None
    if b"\x00" in data:
        raise UnreadableInput(f"{where} holds binary data (NUL bytes), not a text log")
    text = data.decode("utf-8", errors="replace")
    if text and text.count("\ufffd") > max(8, len(text) // 100):
        raise UnreadableInput(f"{where} is not text (more than 1% of it is not UTF-8)")
    return text


def render(verdict: Verdict) -> str:
    lines = []
    if verdict.case:
        lines.append(f"verdict: {verdict.case}  (run it: python -m harness case={verdict.case})")
        lines.append(f"family: {verdict.family['name']}")
        cause = verdict.cause
        lines.append(f"cause: {cause['status']}: {cause['cause']}")
        lines += [f"  against it: {line}" for line in cause["evidence"]] if cause["status"] == CONTRADICTED else []
        if cause["status"] != EVIDENCED:
            lines.append(f"  to confirm: {cause['confirm']}")
            lines += [f"  the same line also comes from: {cause['also']}"] if cause["also"] else []
        lines.append(f"confidence: {verdict.confidence:.2f}")
    else:
        lines.append(f"verdict: none, {NOT_KNOWN}")
        lines += [f"  looks like {why}" for why in verdict.looks_like]
        lines.append(f"confidence: {verdict.confidence:.2f}")
    for candidate in verdict.candidates:
        lines.append(f"\n{candidate.case}  score {candidate.score:.2f}")
        lines.append(f"  why: {candidate.why}")
        lines += [f"  > {line}" for line in candidate.evidence]
    if not verdict.candidates:
        lines.append("no case has any sign in this log")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.triage", description="Name the known case an error log belongs to, with the evidence."
    )
    parser.add_argument("path", nargs="?", default="-", help="the log file, or - for stdin (the default)")
    parser.add_argument("--json", action="store_true", help='print {"verdict", "candidates", "family", "cause", "confidence"} only')
    args = parser.parse_args(argv)
    try:
        text = read_log(args.path)
    except UnreadableInput as error:
        print(f"triage: {error}", file=sys.stderr)
        return 2
    verdict = triage(text)
    print(json.dumps(verdict.to_json(), indent=2) if args.json else render(verdict))
    return 0
