"""A case's code and story as a learner reads them: functions with their helpers, the buggy -> fixed diff, markdown text.

Used by the teaching pages and notebooks (harness/teach/__init__.py and notebook.py).
"""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass
from types import FunctionType, ModuleType

from harness.cases import reachable

_URL = re.compile(r"(?<![<(])(https?://[^\s)>]+[^\s)>.,;:])")
_ANY_URL = re.compile(r"https?://[^\s)>\]]+[^\s)>\].,;:'\"]")
_GENERIC = re.compile(r"\bgeneric\s+attempt", re.IGNORECASE)
_GITHUB_THREAD = re.compile(r"^https://github\.com/([^/\s]+/[^/\s]+)/(?:issues|pull|discussions)/(\d+)")


def functions_used(case: ModuleType, name: str) -> list[str]:
    """`name` and the case's own functions it calls, transitively, in the order they appear in the file."""
    return _in_file_order(reachable(case, [getattr(case, name)]))


def bad_fix_source(case: ModuleType, name: str) -> tuple[str, str]:
    """The source of bad fix `name` with the helpers the fix does not use, and the first paragraph of its doc."""
    function = case.bad_fixes[name]
    helpers = _bad_fix_helpers(case, function)
    if function.__name__ == "<lambda>":  # e.g. {"last_char": lambda x: train(x, last_char)}
        own = inspect.getsource(function).strip().rstrip(",")
        text = own + ("\n\n" + source_of(case, helpers) if helpers else "\n")
        return text, " ".join(_paragraphs(_bad_fix_doc(case, name))[:1])
    names = [function.__name__, *[each for each in helpers if each != function.__name__]]
    return source_of(case, names), first_paragraph(function)


def _bad_fix_helpers(case: ModuleType, function: FunctionType) -> list[str]:
    """The case's functions a bad fix calls that the fix does not, in file order."""
    fixed = set(functions_used(case, "fixed"))
    return [each for each in _in_file_order(reachable(case, [function]) - {function}) if each not in fixed]


def _bad_fix_doc(case: ModuleType, name: str) -> str:
    """The docstring of bad fix `name`; a lambda's is that of the first helper it calls that has one."""
    function = case.bad_fixes[name]
    if function.__name__ != "<lambda>":
        return inspect.getdoc(function) or ""
    return next((doc for doc in (inspect.getdoc(getattr(case, each)) for each in _bad_fix_helpers(case, function)) if doc), "")


def _paragraphs(doc: str) -> list[str]:
    return [" ".join(paragraph.split()) for paragraph in doc.split("\n\n") if paragraph.strip()]


@dataclass(frozen=True)
class Origin:
    """Where a bad fix comes from, as its docstring says: `thread` (the URLs it cites), `generic` (it says "generic
    attempt"), or `unstated` (neither)."""

    kind: str
    urls: tuple[str, ...] = ()


def bad_fix_origin(case: ModuleType, name: str) -> Origin:
    """Where bad fix `name` comes from, read from its whole docstring (a lambda's: its first helper's with one).
    "generic attempt" wins over a URL: a generic attempt may cite a thread for the error it meets, not for itself."""
    doc = _bad_fix_doc(case, name)
    if _GENERIC.search(doc):
        return Origin("generic")
    urls = tuple(dict.fromkeys(_ANY_URL.findall(doc)))
    return Origin("thread", urls) if urls else Origin("unstated")


def thread_link(url: str) -> str:
    """A thread's URL as a markdown link: `[owner/repo#N](url)` for a GitHub issue, pull request or discussion, else <url>."""
    github = _GITHUB_THREAD.match(url)
    return f"[{github.group(1)}#{github.group(2)}]({url})" if github else f"<{url}>"


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
    return " ".join(_paragraphs(inspect.getdoc(function) or "")[:1])


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
