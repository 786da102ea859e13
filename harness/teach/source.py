"""A case's code and story as a learner reads them: functions with their helpers, the buggy -> fixed diff, markdown text.

Used by the teaching pages and notebooks (harness/teach/__init__.py and notebook.py).
"""

from __future__ import annotations

import difflib
import inspect
import re
from types import FunctionType, ModuleType

from harness.cases import reachable

_URL = re.compile(r"(?<![<(])(https?://[^\s)>]+[^\s)>.,;:])")


def functions_used(case: ModuleType, name: str) -> list[str]:
    """`name` and the case's own functions it calls, transitively, in the order they appear in the file."""
    return _in_file_order(reachable(case, [getattr(case, name)]))


def bad_fix_source(case: ModuleType, name: str) -> tuple[str, str]:
    """The source of bad fix `name` with the helpers the fix does not use, and the first paragraph of its doc."""
    function = case.bad_fixes[name]
    fixed = set(functions_used(case, "fixed"))
    helpers = [each for each in _in_file_order(reachable(case, [function]) - {function}) if each not in fixed]
    if function.__name__ == "<lambda>":  # e.g. {"last_char": lambda x: train(x, last_char)}
        own = inspect.getsource(function).strip().rstrip(",")
        text = own + ("\n\n" + source_of(case, helpers) if helpers else "\n")
        doc = next((first_paragraph(getattr(case, each)) for each in helpers if first_paragraph(getattr(case, each))), "")
        return text, doc
    names = [function.__name__, *[each for each in helpers if each != function.__name__]]
    return source_of(case, names), first_paragraph(function)


def _in_file_order(functions: set[FunctionType]) -> list[str]:
    return [function.__name__ for function in sorted(functions, key=lambda function: function.__code__.co_firstlineno)]


def source_of(case: ModuleType, names: list[str]) -> str:
    return "\n\n".join(inspect.getsource(getattr(case, name)).rstrip() for name in names) + "\n"


def buggy_to_fixed_diff(case: ModuleType) -> str:
    """A unified diff from `buggy` to `fixed`, each with the helpers only it uses (helpers both use are left out)."""
    buggy, fixed = functions_used(case, "buggy"), functions_used(case, "fixed")
    before = source_of(case, [name for name in buggy if name not in fixed or name == "buggy"])
    after = source_of(case, [name for name in fixed if name not in buggy or name == "fixed"])
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), "buggy", "fixed", n=max(len(before), len(after)), lineterm="")
    return "\n".join(lines) + "\n"


def shared_helpers(case: ModuleType) -> list[str]:
    buggy = functions_used(case, "buggy")
    return [name for name in functions_used(case, "fixed") if name in buggy and name not in ("buggy", "fixed")]


def first_paragraph(function: FunctionType) -> str:
    doc = inspect.getdoc(function) or ""
    return " ".join(doc.split("\n\n")[0].split())


def section_markdown(text: str) -> str:
    """A docstring section (harness.cases.case_text) as markdown: prose paragraphs, verbatim lines in ```text blocks."""
    blocks: list[str] = []
    verbatim: list[str] = []
    for line in text.splitlines():
        if line.startswith("    "):
            verbatim.append(line[4:])
            continue
        if verbatim:
            blocks.append("```text\n" + "\n".join(verbatim) + "\n```")
            verbatim = []
        blocks.append(link_urls(line))
    if verbatim:
        blocks.append("```text\n" + "\n".join(verbatim) + "\n```")
    return "\n\n".join(blocks)


def link_urls(text: str) -> str:
    """Bare URLs as <autolinks>: GitHub links bare URLs by itself, plain markdown renderers do not."""
    return _URL.sub(r"<\1>", text)
