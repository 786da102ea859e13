"""How far each control is from the line it must cross, over a folder of records: a control caught by a hair proves
little, and on a busy machine it is missed.

    python -m harness.matrix margins results/matrix   # one line per control below its margin; exit 1 if any

The margins (issue 45): a slow control's interval starts at least SLOW x its speed budget; a memory control's
growth (its interval's low end) is at least MEMORY x its growth budget, or its peak MEMORY x its peak budget; a bad
fix raises, crashes, differs in an integer or a shape, or its worst element is at least BAD_FIX x its tolerance
away. A control that is not run on a record (no budget on that device; the case's failure absent there; a compiled
baseline that never settled) is exempt, and says why; so is a slow or memory control on a record where the case's own
fix is not correct (an API the torch lacks; a compiled fix that differs there): those controls are judged against the
fix's speed and memory, and there is none to judge. A record made before a figure existed (a bad fix's
`tolerance_excess`) is `unmeasured`: not a pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from harness.recordset import Record
from harness.statuses import BadFix, Correct, SlowControl

SLOW = 1.3
MEMORY = 2.0
BAD_FIX = 10.0

Kind = Literal["slow", "memory", "bad_fix"]
Standing = Literal["held", "thin", "missed", "unmeasured", "exempt"]
PREFIXES: dict[str, Kind] = {"slow_fix:": "slow", "memory_fix:": "memory", "bad_fix:": "bad_fix"}
CAUGHT = (SlowControl.FLAGGED, BadFix.REJECTED)  # a control caught: MemoryControl.FLAGGED is the same string
EXEMPT_STATUSES = {SlowControl.NO_BUDGET, SlowControl.NOT_APPLICABLE, SlowControl.RETRACED, BadFix.NOT_WRONG_HERE}
NEEDED: dict[Kind, float] = {"slow": SLOW, "memory": MEMORY, "bad_fix": BAD_FIX}


@dataclass(frozen=True)
class Margin:
    record: Record
    phase: str
    kind: Kind
    margin: float | None  # the control's figure over its line (1.0: exactly at the line); None where not measured
    how: str  # the figures behind it, in words

    @property
    def needed(self) -> float:
        return NEEDED[self.kind]

    @property
    def standing(self) -> Standing:
        status = self.record.statuses[self.phase]
        if status in EXEMPT_STATUSES or _without_a_correct_fix(self.record, self.kind):
            return "exempt"
        if status not in CAUGHT:
            return "missed"
        if self.margin is None:
            return "unmeasured"
        return "held" if self.margin >= self.needed else "thin"

    @property
    def ok(self) -> bool:
        return self.standing in ("held", "exempt")

    def line(self) -> str:
        shown = "categorical" if self.margin == math.inf else "-" if self.margin is None else f"{self.margin:.2f}x"
        return f"{self.record.where} {self.phase}: {self.standing}, margin {shown} (needs {self.needed:g}x): {self.how}"


def margins(records: list[Record]) -> list[Margin]:
    """Every control of every record, with its margin."""
    found = []
    for record in records:
        for phase, status in record.statuses.items():
            kind = next((kind for prefix, kind in PREFIXES.items() if phase.startswith(prefix)), None)
            if kind is None:
                continue
            figures = record.figures.get(phase, {})
            if _without_a_correct_fix(record, kind):
                found.append(
                    Margin(record, phase, kind, None, f"the case's own fix is not correct here (correct: {record.statuses['correct']})")
                )
                continue
            if status not in CAUGHT:  # exempt, or missed: no margin to measure
                found.append(Margin(record, phase, kind, None, record.messages[phase][:160]))
                continue
            margin, how = {"slow": _slow, "memory": _memory, "bad_fix": _bad_fix}[kind](figures, record.messages[phase])
            found.append(Margin(record, phase, kind, margin, how))
    return found


def _without_a_correct_fix(record: Record, kind: Kind) -> bool:
    """A slow or memory control on a record whose `correct` phase did not pass: nothing for it to prove."""
    return kind != "bad_fix" and record.statuses.get("correct", Correct.PASSED) != Correct.PASSED


def _slow(figures: dict[str, Any], message: str) -> tuple[float | None, str]:
    low, budget = figures.get("ratio_low"), figures.get("budget")
    if low is None or not budget:
        return None, f"no interval or budget in the record: {message[:120]}"
    return low / float(budget), f"{figures['ratio']:.2f}x [{low:.2f}, {figures['ratio_high']:.2f}] against the budget {float(budget):g}x"


def _memory(figures: dict[str, Any], message: str) -> tuple[float | None, str]:
    budget = figures.get("budget") or {}
    parts = []
    if budget.get("growth") and figures.get("growth_fraction_low") is not None:
        parts.append(
            (
                figures["growth_fraction_low"] / budget["growth"],
                f"growth {figures['growth_fraction_low']:.3f} (low end) of the unit against {budget['growth']:g}",
            )
        )
    if budget.get("peak") and figures.get("peak_ratio") is not None:
        parts.append((figures["peak_ratio"] / budget["peak"], f"peak {figures['peak_ratio']:.2f}x against {budget['peak']:g}x"))
    if not parts:
        return None, f"no growth or peak against a budget in the record: {message[:120]}"
    margin, how = max(parts)
    return margin, how


def _bad_fix(figures: dict[str, Any], message: str) -> tuple[float | None, str]:
    how = figures.get("how")
    if how in ("raised", "crashed", "warns"):  # a bad fix's figures["how"] (harness/phases/controls.py): still warning is categorical
        return math.inf, message[:120]
    if figures.get("reason"):
        return math.inf, f"differs in structure: {figures['reason'][:120]}"
    if figures.get("mismatched_integers"):
        return math.inf, f"{figures['mismatched_integers']} of {figures['integers']} integers differ (compared exactly)"
    if figures.get("tolerance_excess") is None:
        return None, f"no tolerance_excess in the record (made before it was measured): {message[:120]}"
    return (
        figures["tolerance_excess"],
        f"its worst element {figures['tolerance_excess']:.3g}x its tolerance; {figures.get('mismatched_floats')} of {figures.get('floats')} floats beyond it",
    )


def report(found: list[Margin]) -> tuple[list[str], dict[Standing, int]]:
    """The lines of the controls short of their margin, and the count per standing."""
    counts: dict[Standing, int] = {}
    for margin in found:
        counts[margin.standing] = counts.get(margin.standing, 0) + 1
    return [margin.line() for margin in found if not margin.ok], counts


def table(found: list[Margin]) -> str:
    """Markdown for docs/matrix.md: per case and kind of control, the smallest margin over the records, and where."""
    lines = [
        "### Control margins",
        "",
        f"How far each control is past its line (`python -m harness.matrix margins`): a slow control's interval low end over "
        f"its speed budget (needs {SLOW:g}x), a memory control's growth or peak over its budget (needs {MEMORY:g}x), a bad "
        f"fix's worst element over its tolerance (needs {BAD_FIX:g}x; raising, or an integer or shape that differs, is "
        "categorical). Per case and control, the smallest margin over the records, and the records short of it.",
        "",
        "| case | control | smallest margin | short / measured |",
        "|---|---|---|---|",
    ]
    groups: dict[tuple[str, str], list[Margin]] = {}
    for margin in found:
        groups.setdefault((margin.record.case, margin.phase), []).append(margin)
    for (case, phase), group in sorted(groups.items()):
        judged = [m for m in group if m.standing != "exempt"]
        if not judged:
            continue
        measured = [m for m in judged if m.margin is not None]
        smallest = min(measured, key=lambda m: m.margin) if measured else None
        shown = (
            "-"
            if smallest is None
            else "categorical"
            if smallest.margin == math.inf
            else f"{smallest.margin:.2f}x ({smallest.record.torch} {smallest.record.platform})"
        )
        short = [m for m in judged if not m.ok]
        lines.append(f"| `{case}` | `{phase}` | {shown} | {len(short)} / {len(judged)} |")
    return "\n".join(lines) + "\n"
