"""One case's page: its story, code, evidence, figures and the commands to try it."""

from __future__ import annotations

import html

from packaging.version import Version

from harness.cases import DEVICES, case_text, load_case
from harness.matrix import Record
from harness.statuses import BadFix
from harness.teach.common import COMPARED_PHASES, NOTICE, Sources, _by_version, _code_span, _fenced, _status_cell
from harness.teach.series import _budgets, bad_fix_errors, memory_series, speed_points
from harness.teach.source import (
    Origin,
    bad_fix_origin,
    bad_fix_source,
    buggy_to_fixed_diff,
    functions_used,
    link_urls,
    section_markdown,
    shared_helpers,
    source_of,
    thread_link,
)
from harness.teach.summary import Summary, summary


def page(name: str, sources: Sources, figure_files: list[str]) -> str:
    case = load_case(name)
    text = case_text(case)
    short = summary(name, sources.config)
    lines = [
        f"# `{name}`: {short.title}",
        "",
        NOTICE,
        "",
        f"[Notebook]({name}.ipynb) · [case source](../../cases/{name}.py) · [config](../../conf/case/{name}.yaml) · [all cases](README.md)",
        "",
        *box(short),
        "",
        "## Story",
        "",
        "**Upstream:** " + section_markdown(text.sections["Upstream"]),
        "",
        "**Fidelity:** " + section_markdown(text.sections["Fidelity"]),
        "",
        "**Cause:** " + section_markdown(text.sections["Cause"]),
        "",
        "**Fix:** " + section_markdown(text.sections["Fix"]),
        "",
        "## Symptoms",
        "",
    ]
    for device in DEVICES:
        lines += [
            f"### On {device.upper()}",
            "",
            "**As upstream reported it:** " + section_markdown(text.sections[f"Symptom on {device.upper()}"]),
            "",
        ]
        lines += _seen(device, [record for record in sources.records if record.device == device])
    lines += _code(case)
    lines += _evidence(case, sources.records)
    lines += _compiled(name, case, sources)
    lines += _figures_section(name, sources, figure_files)
    lines += _try_it(name, sources)
    return "\n".join(lines).rstrip() + "\n"


def _seen(device: str, records: list[Record]) -> list[str]:
    if not records:
        return [f"Seen by the harness on {device.upper()}: **not yet run** (no {device} record in `results/matrix`).", ""]
    lines = [f"**Seen by the harness** on {device.upper()}, verbatim from the records:", ""]
    groups: dict[tuple, list[Record]] = {}
    for record in _by_version(records):
        figures = record.figures.get("reproduce", {})
        key = (
            record.statuses.get("reproduce", "not run"),
            record.messages.get("reproduce", ""),
            figures.get("output_line"),
            figures.get("unrelated_op_after_error"),
        )
        groups.setdefault(key, []).append(record)
    for (status, message, output_line, after), group in groups.items():
        raised_at = group[-1].figures.get("reproduce", {}).get("raised_at")
        where = f", raised at `{raised_at}`" + (f" (on torch {group[-1].torch})" if len(group) > 1 else "") if raised_at else ""
        lines += [
            f"**torch {', '.join(record.torch for record in group)}** ({device}): {status.replace('_', ' ')}{where}:",
            "",
            _fenced(message),
            "",
        ]
        if output_line:
            lines += ["Printed by the process:", "", _fenced(output_line), ""]
        if after:
            lines += [f"An unrelated op afterwards, in the same process: {after}", ""]
    return lines


def _code(case) -> list[str]:
    lines = [
        "## Code",
        "",
        "The buggy code and the fix, each with the helpers only it uses:",
        "",
        "```diff",
        buggy_to_fixed_diff(case).rstrip(),
        "```",
        "",
    ]
    shared = shared_helpers(case)
    if shared:
        lines += [
            f"Both call {', '.join(f'`{name}`' for name in shared)} (in [the case file](../../cases/{case.__name__.split('.')[-1]}.py)).",
            "",
        ]
    reference = [name for name in functions_used(case, "reference") if name == "reference" or name not in functions_used(case, "fixed")]
    lines += [
        "The reference, computed independently of the fix, which the fix must equal:",
        "",
        "```python",
        source_of(case, reference).rstrip(),
        "```",
        "",
    ]
    return lines


def _evidence(case, records: list[Record]) -> list[str]:
    lines = ["## Evidence", ""]
    for device in DEVICES:
        mine = _by_version([record for record in records if record.device == device])
        if not mine:
            lines += [f"### Phases on {device.upper()}", "", f"Not yet run on {device.upper()}.", ""]
            continue
        phases = list(dict.fromkeys(phase for record in mine for phase in record.statuses))
        lines += [
            f"### Phases on {device.upper()}",
            "",
            "Status per torch version (**bold**: not what the phase expects, see `expectations.yaml`).",
            "",
        ]
        lines += ["| phase | " + " | ".join(f"torch {record.torch}" for record in mine) + " |", "|---" * (len(mine) + 1) + "|"]
        for phase in phases:
            cells = [_status_cell(record, phase) for record in mine]
            lines.append(f"| `{phase}` | " + " | ".join(cells) + " |")
        newest = mine[-1]
        lines += ["", f"What each phase said on torch {newest.torch}, verbatim:", "", "| phase | message |", "|---|---|"]
        lines += [f"| `{phase}` | {_code_span(message)} |" for phase, message in newest.messages.items()]
        lines.append("")
    origins = {name: bad_fix_origin(case, name) for name in case.bad_fixes}
    lines += ["### Bad fixes", "", bad_fixes_heading(list(origins.values())), ""]
    for name, origin in origins.items():
        outcomes = _bad_fix_outcomes(name, records)
        source, doc = bad_fix_source(case, name)
        lines += [
            f"#### `{name}`",
            "",
            _origin_line(origin),
            "",
            link_urls(doc) if doc else "(no docstring)",
            "",
            "```python",
            source.rstrip(),
            "```",
            "",
        ]
        lines += outcomes or ["Not yet run.", ""]
    return lines


def box(short: Summary) -> list[str]:
    """The three lines above the story, as a blockquote: GitHub draws it as a quote, the site as a box (docs/css/extra.css)."""
    return [f"> **You see:** {short.see}", ">", f"> **Why:** {short.why}", ">", f"> **Fix:** {short.fix}"]


_ORIGIN_KINDS = {  # how the heading counts each kind: (several, one)
    "thread": ("from the linked threads", "from a linked thread"),
    "generic": ("generic attempts", "generic attempt"),
    "unstated": ("whose sources are not stated", "whose source is not stated"),
}


def bad_fixes_heading(origins: list[Origin]) -> str:
    """What the bad fixes are, by where their docstrings say they come from: a thread (a URL), a generic attempt, neither."""
    counts = {kind: sum(origin.kind == kind for origin in origins) for kind in _ORIGIN_KINDS}
    present = [kind for kind, count in counts.items() if count]
    if len(present) == 1:
        what = {"thread": " from the linked threads", "generic": ", generic attempts", "unstated": ", whose sources are not stated"}[
            present[0]
        ]
        return f"Wrong fixes{what}, each of which the harness must reject:"
    parts = [f"{counts[kind]} {_ORIGIN_KINDS[kind][counts[kind] == 1]}" for kind in present]
    return f"Wrong fixes, {', '.join(parts[:-1])} and {parts[-1]}, each of which the harness must reject:"


def _origin_line(origin: Origin) -> str:
    if origin.kind == "thread":
        return "**Source:** " + ", ".join(thread_link(url) for url in origin.urls)
    return "**Source:** a generic attempt, not from the threads" if origin.kind == "generic" else "**Source:** not stated"


def _bad_fix_outcomes(name: str, records: list[Record]) -> list[str]:
    phase = f"bad_fix:{name}"
    lines = []
    for device in DEVICES:
        groups: dict[tuple[str, str], list[str]] = {}
        for record in _by_version([record for record in records if record.device == device]):
            if phase in record.statuses:
                groups.setdefault((record.statuses[phase], record.messages[phase]), []).append(record.torch)
        for (status, message), versions in groups.items():
            lines += [f"{device.upper()}, torch {', '.join(versions)}: **{status}**, {_code_span(message)}", ""]
    return lines


def _compiled(name: str, case, sources: Sources) -> list[str]:
    """Eager and compiled side by side, per device and torch version, then the compiled symptoms verbatim."""
    lines = ["## Under torch.compile", "", f"What a user compiles here: {case.compiled_unit}.", ""]
    if not sources.compiled:
        return lines + [f"Not yet run compiled (`python -m harness case={name} compile=inductor`).", ""]
    for device in DEVICES:
        for mode in sorted({record.compile for record in sources.compiled if record.device == device}):
            compiled = {record.torch: record for record in sources.compiled if record.device == device and record.compile == mode}
            eager = {record.torch: record for record in sources.records if record.device == device}
            versions = sorted(compiled, key=Version)
            lines += [
                f"### {device.upper()}: eager / {mode}",
                "",
                "Each cell: eager's status / the compiled one's (**bold**: not what the phase expects).",
                "",
            ]
            lines += ["| phase | " + " | ".join(f"torch {v}" for v in versions) + " |", "|---" * (len(versions) + 1) + "|"]
            for phase in COMPARED_PHASES:
                cells = [
                    f"{_status_cell(eager[v], phase) if v in eager else 'not run'} / {_status_cell(compiled[v], phase)}" for v in versions
                ]
                lines.append(f"| `{phase}` | " + " | ".join(cells) + " |")
            bad = [f"{_rejected(eager.get(v))} / {_rejected(compiled[v])}" for v in versions]
            lines += ["| bad fixes rejected | " + " | ".join(bad) + " |", ""]
            lines += [f"The buggy code under {mode}, verbatim from the records:", ""]
            groups: dict[tuple, list[Record]] = {}
            for record in _by_version(list(compiled.values())):
                figures = record.figures.get("reproduce", {})
                key = (
                    record.statuses.get("reproduce", "not run"),
                    record.messages.get("reproduce", ""),
                    tuple(figures.get("native_message", ())),
                )
                groups.setdefault(key, []).append(record)
            for (status, message, native), group in groups.items():
                lines += [f"**torch {', '.join(record.torch for record in group)}**: {status.replace('_', ' ')}:", "", _fenced(message), ""]
                if native:
                    lines += ["What the process printed as it died:", "", _fenced("\n".join(native)), ""]
            fix = compiled[versions[-1]].figures.get("fix", {})
            if "fullgraph" in fix:
                graph = (
                    "as one graph (`fullgraph=True`)"
                    if fix["fullgraph"]
                    else f"with {fix.get('graph_breaks', '?')} graph breaks: " + "; ".join(fix.get("break_reasons", []))
                )
                lines += [f"The fix compiles {graph} on torch {versions[-1]}.", ""]
    return lines


def _rejected(record: Record | None) -> str:
    if record is None:
        return "not run"
    bad = [status for phase, status in record.statuses.items() if phase.startswith("bad_fix:")]
    return f"{bad.count(BadFix.REJECTED)}/{len(bad)}"


def _figures_section(name: str, sources: Sources, figure_files: list[str]) -> list[str]:
    lines = ["## Figures", ""]
    points = speed_points(sources.records)
    budgets = _budgets(sources.config)
    if f"{name}.speed.png" in figure_files:
        budget_text = ", ".join(f"{device.upper()} {value:g}x" for device, value in budgets.items()) or "none set"
        lines += [
            f"![{name}: time of the fix over its baseline per torch version, against the budget]({name}.speed.png)",
            "",
            f"The fix's time over its baseline's (lower is faster; budget: {budget_text}). The figures behind it:",
            "",
            "| device | torch | fix / baseline | interval | budget | verdict |",
            "|---|---|---|---|---|---|",
        ]
        for point in points:
            interval = (
                f"{point.ratio_low:.3f} - {point.ratio_high:.3f}" if point.ratio_low is not None and point.ratio_high is not None else "-"
            )
            budget = point.budget if point.budget is not None else budgets.get(point.device)
            lines.append(
                f"| {point.device} | {point.torch} | {point.ratio:.3f}x | {interval} | {f'{budget:g}x' if budget is not None else '-'} | {point.status.replace('_', ' ')} |"
            )
        lines.append("")
        levels = sorted({f"{point.level:g}" for point in points if point.level is not None})
        if any(point.ratio_low is not None for point in points):
            lines += [
                f"Error bars and the interval column: the speed verdict's confidence interval of the ratio (level {', '.join(levels) or 'not recorded'}).",
                "",
            ]
        if "cuda" not in {point.device for point in points}:
            lines += ["CUDA: not yet run.", ""]
    else:
        lines += ["No speed records yet.", ""]
    if f"{name}.memory.png" in figure_files:
        series, where = memory_series(sources.records)
        lines += [
            f"![{name}: retained and peak memory per step, buggy, fixed and the memory controls]({name}.memory.png)",
            "",
            f"Memory per step ({where}; harness/measure/footprint.py): retained after each step and the peak during it, above the level before the first step. The figures behind it:",
            "",
            "| run | retained per step | highest peak |",
            "|---|---|---|",
        ]
        lines += [f"| {one.label} | {one.slope / (1 << 20):+.3f} MiB | {max(one.peak, default=0) / (1 << 20):.2f} MiB |" for one in series]
        lines.append("")
    errors, where = bad_fix_errors(sources.records)
    if f"{name}.bad_fixes.png" in figure_files:
        lines += [
            f"![{name}: relative error of each bad fix that returns an output]({name}.bad_fixes.png)",
            "",
            f"How far each bad fix that returns moves the output from the reference ({where}); the others raise or crash (see Bad fixes above).",
            "",
            "| bad fix | relative error | SNR |",
            "|---|---|---|",
        ]
        lines += [f"| `{error.name}` | {error.relative_error:.3g} | {_snr(error.snr_db)} |" for error in errors]
        lines.append("")
    return lines


def _snr(snr_db: float | None) -> str:
    return "-" if snr_db is None else f"{snr_db:.1f} dB"


def _try_it(name: str, sources: Sources) -> list[str]:
    lines = ["## Try it", ""]
    hints = sources.config.get("hints") or []
    if hints:
        lines += ["Hints, one step at a time (click to open):", ""]
        for number, hint in enumerate(hints, start=1):
            lines += [f"<details><summary>Hint {number}</summary>", "", html.escape(str(hint), quote=False), "", "</details>", ""]
    else:
        lines += ["No hints yet.", ""]
    lines += [
        "```bash",
        "# run every phase on this machine (CUDA when present)",
        f"python -m harness case={name}",
        "# print hint n",
        f"python -m harness case={name} hint=<n>",
        "# write a starter file for your fix into <dir>",
        f"python -m harness case={name} exercise=<dir>",
        "# grade your fix, phase by phase",
        f"python -m harness case={name} fix=<file.py>:<function>",
        "```",
        "",
    ]
    if not sources.grading_landed:
        lines += ["(`hint`, `exercise` and `fix` come with the grading work; a checkout without them refuses those options.)", ""]
    lines += [f"Or step through the [notebook]({name}.ipynb): it picks CUDA when present.", ""]
    return lines
